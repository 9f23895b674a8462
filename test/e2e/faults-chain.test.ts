import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, expect, it } from "vitest";
import { marketAbi } from "../../gen/contracts/artifacts.js";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { startGateway } from "../../src/app.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit, setOffer } from "../helpers/market.js";
import { startRpcProxy, type RpcProxy } from "../helpers/rpc-proxy.js";
import { chainPermit, chatOn, flush, settlementRows, settlingEnv } from "../helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Chain RPC faults (issue 13, docs/operations.md "Chain RPC"): the gateway reaches anvil through
 * a fault proxy (test/helpers/rpc-proxy.ts) that goes down, answers slowly or answers errors,
 * while the test itself talks to anvil directly. Permit reads fail closed (503
 * `chain_unavailable`, no provider call, nothing reserved), the indexer keeps its cursor and
 * catches up, and settlement neither loses nor doubles a charge; everything recovers once the
 * RPC is back.
 */

/** The gateway's per-call RPC timeout here; viem tries each call 3 times (2 retries). */
const chainTimeoutMs = 2000;
/** The longest a failing chain read may take: 3 timeouts, the retries' backoff, and slack. */
const readBoundMs = 3 * chainTimeoutMs + 4000;

const messages = [{ role: "user" as const, content: "hello flaky chain" }];

describeIfPostgres("chain RPC faults", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let proxy: RpcProxy;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({
      ...settlingEnv, // PERMIT_CACHE_MS=0: every chat reads its permit from the chain
      CHAIN_TIMEOUT_MS: String(chainTimeoutMs),
      SETTLEMENT_WAIT_MS: "10000",
    }));
    // The stack's gateway onboarded the fake provider on anvil directly; the gateway under test
    // runs on the same database and config with the proxy as its RPC_URL.
    proxy = await startRpcProxy(stack.anvil.rpcUrl);
    await stack.gateway.close();
    stack.gateway = await startGateway(
      { ...stack.config, rpcUrl: proxy.url },
      { logger: stack.logger, database: stack.database.db },
    );
  });
  // Each test starts on a healthy RPC, whatever the one before left.
  beforeEach(() => proxy.pass());
  afterAll(async () => {
    proxy?.pass();
    await fake?.stop();
    await stack?.close();
    await proxy?.close();
  });

  const chat = (permitId: Hex) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 8 }),
    });

  /** The records of a permit's requests. */
  const records = async (permitId: Hex) =>
    (
      await stack.database.db.pool.query<{
        id: string;
        status: string;
        credits_charged: string | null;
        settlement_status: string;
      }>(
        `SELECT id, status, credits_charged::text, settlement_status
           FROM inference_requests WHERE permit_id = $1 ORDER BY created_at`,
        [permitId],
      )
    ).rows;

  /** The sum of one metric's samples whose labels contain `labels` (0 when there is none). */
  async function metric(name: string, labels = ""): Promise<number> {
    const text = await (await fetch(stack.gateway.metricsUrl)).text();
    let sum = 0;
    for (const line of text.split("\n")) {
      const match = /^([a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line);
      if (match?.[1] === name && (match[2] ?? "").includes(labels)) sum += Number(match[3]);
    }
    return sum;
  }

  /**
   * GET /ready until it answers `status` (its checks are at most a second old: DESIGN.md
   * section 8), or the last answer after about three seconds.
   */
  async function readyWhen(status: number): Promise<{ status: number; body: unknown }> {
    const deadline = Date.now() + 3_000;
    for (;;) {
      const res = await fetch(`${stack.gateway.url}/ready`);
      const answer = { status: res.status, body: await json(res) };
      if (answer.status === status || Date.now() > deadline) return answer;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  /** A chat refused because the permit cannot be read: the error body, and no trace of it. */
  async function expectChainUnavailable(permitId: Hex, started: number, res: Response) {
    const elapsed = Date.now() - started;
    expect(res.status).toBe(503);
    const body = await json(res);
    expect(body).toEqual({
      error: {
        code: "chain_unavailable",
        type: "service_unavailable",
        message: expect.any(String),
      },
    });
    // Bounded: the read gave up after its retries, it did not hang.
    expect(elapsed).toBeLessThan(readBoundMs);
    // Refused before admission: no record, nothing reserved or charged on the permit.
    expect(await records(permitId)).toEqual([]);
    expect(await permitLedger(stack.database.db.pool, permitId)).toMatchObject({
      reserved: 0n,
      charged: 0n,
    });
  }

  /** After the RPC is back: the same permit is served, and charged once. */
  async function expectServedOnce(permitId: Hex) {
    const calls = fake.calls("/v1/chat/completions");
    const res = await chat(permitId);
    expect(res.status).toBe(200);
    await res.text();
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    let rows: Awaited<ReturnType<typeof records>> = [];
    await eventually(async () => {
      rows = await records(permitId);
      const ledger = await permitLedger(stack.database.db.pool, permitId);
      return rows.length === 1 && rows[0]!.status === "completed" && ledger.reserved === 0n;
    }, 10_000);
    const charged = BigInt(rows[0]!.credits_charged!);
    expect(charged).toBeGreaterThan(0n);
    expect((await permitLedger(stack.database.db.pool, permitId)).charged).toBe(charged);
  }

  it("permits, RPC down: 503 chain_unavailable after its retries, no provider call, nothing reserved; served and charged once when it is back", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const calls = fake.calls("/v1/chat/completions");
    const rejections = await metric("gateway_rejections_total", 'code="chain_unavailable"');
    const chainErrors = await metric("gateway_chain_errors_total");

    proxy.down();
    const started = Date.now();
    const res = await chat(permitId);
    await expectChainUnavailable(permitId, started, res);
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    // The operator's view: readiness fails on the chain (its state is at most a second old),
    // the refusal is counted.
    const ready = await readyWhen(503);
    expect(ready.status).toBe(503);
    expect(ready.body).toMatchObject({
      status: "unavailable",
      checks: { database: { ok: true }, chain: { ok: false } },
    });
    expect(await metric("gateway_rejections_total", 'code="chain_unavailable"')).toBe(
      rejections + 1,
    );
    expect(await metric("gateway_chain_errors_total")).toBeGreaterThan(chainErrors);

    proxy.pass();
    expect((await readyWhen(200)).status).toBe(200);
    await expectServedOnce(permitId);
  });

  it("permits, RPC slower than CHAIN_TIMEOUT_MS: 503 chain_unavailable within its retries, no provider call; slow but within it: served", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const calls = fake.calls("/v1/chat/completions");

    proxy.slow(chainTimeoutMs + 1500);
    const started = Date.now();
    const res = await chat(permitId);
    // It waited for the chain (at least one timeout), then gave up.
    expect(Date.now() - started).toBeGreaterThanOrEqual(chainTimeoutMs);
    await expectChainUnavailable(permitId, started, res);
    expect(fake.calls("/v1/chat/completions")).toBe(calls);

    // Seconds slower, but answered within the timeout: the request is served as usual.
    proxy.slow(chainTimeoutMs / 4);
    await expectServedOnce(permitId);
    proxy.pass();
  });

  it("permits, RPC answering HTTP 500 or a JSON-RPC error to eth_call: 503 chain_unavailable, no provider call; served once it answers", async () => {
    for (const kind of ["http", "rpc"] as const) {
      const permitId = await openPermit(stack, { deposit: 10n ** 18n });
      const calls = fake.calls("/v1/chat/completions");
      const asked = proxy.calls("eth_call");

      proxy.errors({ kind, methods: ["eth_call"] });
      const started = Date.now();
      const res = await chat(permitId);
      await expectChainUnavailable(permitId, started, res);
      expect(fake.calls("/v1/chat/completions")).toBe(calls);
      // The permit was asked for (and retried), never answered.
      expect(proxy.calls("eth_call")).toBeGreaterThan(asked);

      proxy.pass();
      await expectServedOnce(permitId);
    }
  });

  /** Settled credits of a permit by the database's records. */
  const dbSettled = async (permitId: Hex) =>
    (await records(permitId))
      .filter((r) => r.settlement_status === "settled")
      .reduce((sum, r) => sum + BigInt(r.credits_charged ?? "0"), 0n);

  /** Every charge of `permitId` settled exactly once: the chain, the records and the ledger agree. */
  async function expectSettledOnce(permitId: Hex, total: bigint) {
    const rows = await records(permitId);
    expect(rows.every((r) => r.settlement_status === "settled")).toBe(true);
    expect(await dbSettled(permitId)).toBe(total);
    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    expect(await permitLedger(stack.database.db.pool, permitId)).toMatchObject({
      settled: total,
      unsettleable: 0n,
    });
  }

  it("settlement, RPC down or erroring (HTTP 500 or JSON-RPC errors to eth_estimateGas, eth_sendRawTransaction): a flush is 503, nothing is settled or given up; the next flush settles every charge once", async () => {
    expect((await flush(stack)).status).toBe(200); // what earlier tests charged
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // [fault, how it is set, the charges' state after the failed flush]: before the batch is
    // stored they stay `unsettled`; a stored batch whose broadcast failed keeps them `settling`.
    const faults: [string, () => void, string][] = [
      ["down", () => proxy.down(), "unsettled"],
      [
        "http 500 to eth_estimateGas",
        () => proxy.errors({ kind: "http", methods: ["eth_estimateGas"] }),
        "unsettled",
      ],
      [
        "rpc error to eth_estimateGas",
        () => proxy.errors({ kind: "rpc", methods: ["eth_estimateGas"] }),
        "unsettled",
      ],
      [
        "rpc error to eth_sendRawTransaction",
        () => proxy.errors({ kind: "rpc", methods: ["eth_sendRawTransaction"] }),
        "settling",
      ],
    ];
    let total = 0n;
    for (const [name, fault, state] of faults) {
      const chats = [await chatOn(stack, permitId), await chatOn(stack, permitId)];
      total += chats.reduce((sum, c) => sum + c.charged, 0n);
      const settledBefore = (await chainPermit(stack, permitId)).settled;
      const failures = await metric("gateway_settlement_failures_total");

      fault();
      const failed = await flush(stack);
      expect(failed.status, name).toBe(503);
      expect(failed.body, name).toEqual({
        error: {
          code: "chain_unavailable",
          type: "service_unavailable",
          message: expect.any(String),
        },
      });
      // Nothing was settled on chain or marked settled, and nothing was given up on.
      expect((await chainPermit(stack, permitId)).settled, name).toBe(settledBefore);
      const rows = await settlementRows(
        stack,
        chats.map((c) => c.id),
      );
      expect(
        rows.map((r) => r.settlement_status),
        name,
      ).toEqual([state, state]);
      expect((await permitLedger(stack.database.db.pool, permitId)).unsettleable, name).toBe(0n);
      expect(await metric("gateway_settlement_failures_total"), name).toBe(failures + 1);
      // Charges waiting are counted; those of a stored batch are in flight, not waiting.
      if (state === "unsettled")
        expect(await metric("gateway_unsettled_credits"), name).toBeGreaterThan(0);

      proxy.pass();
      const ok = await flush(stack);
      expect(ok.status, name).toBe(200);
      expect(ok.body.unsettleable, name).toEqual([]);
      await expectSettledOnce(permitId, total);
    }
  });

  it("settlement, slow RPC: a flush under the timeout settles; an eth_sendRawTransaction answered past it (the transaction landed) is 503 and settled once by the next flush", async () => {
    expect((await flush(stack)).status).toBe(200);
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const first = [await chatOn(stack, permitId), await chatOn(stack, permitId)];
    let total = first.reduce((sum, c) => sum + c.charged, 0n);

    // Every answer late, within the timeout: slower, settled all the same.
    proxy.slow(chainTimeoutMs / 4);
    const slowFlush = await flush(stack);
    proxy.pass();
    expect(slowFlush.status).toBe(200);
    expect(slowFlush.body.settled_requests).toBeGreaterThanOrEqual(first.length);
    await expectSettledOnce(permitId, total);

    // The node takes the transaction but its answer comes after the timeout (each retry's too).
    const second = [await chatOn(stack, permitId), await chatOn(stack, permitId)];
    total += second.reduce((sum, c) => sum + c.charged, 0n);
    const sent = proxy.forwarded("eth_sendRawTransaction");
    proxy.slow(chainTimeoutMs + 1500, ["eth_sendRawTransaction"]);
    const lost = await flush(stack);
    proxy.pass();
    expect(lost.status).toBe(503);
    expect(lost.body.error.code).toBe("chain_unavailable");
    expect(proxy.forwarded("eth_sendRawTransaction")).toBeGreaterThan(sent);
    // On chain already; the gateway, which never heard back, has not marked it settled.
    expect((await chainPermit(stack, permitId)).settled).toBe(total);
    const pending = await settlementRows(
      stack,
      second.map((c) => c.id),
    );
    expect(pending.map((r) => r.settlement_status)).toEqual(["settling", "settling"]);

    // The next flush asks the chain first: found settled, recorded once, nothing re-sent.
    const sentBefore = proxy.forwarded("eth_sendRawTransaction");
    const recovered = await flush(stack);
    expect(recovered.status).toBe(200);
    expect(recovered.body.batches[0]).toMatchObject({ status: "settled" });
    expect(proxy.forwarded("eth_sendRawTransaction")).toBe(sentBefore);
    await expectSettledOnce(permitId, total);
    expect((await flush(stack)).body).toMatchObject({ batches: [], settled_requests: 0 });
    await expectSettledOnce(permitId, total);
  });

  /** Talks to anvil directly (not through the proxy). */
  const anvilRpc = (method: string, params: unknown[] = []) =>
    stack.clients.publicClient.request({ method: method as never, params: params as never });
  /** More blocks than SETTLEMENT_REPLACE_AFTER_BLOCKS (3): an attempt is old enough to replace. */
  const mineBlocks = async (n = 4) => {
    for (let i = 0; i < n; i++) await anvilRpc("evm_mine");
  };
  /** The stored attempts of the batch holding `requestId`. */
  const attemptsOf = async (requestId: string) =>
    (
      await stack.database.db.pool.query<{
        batch_id: string;
        tx_hash: string;
        nonce: string;
        max_fee_per_gas: string;
        max_priority_fee_per_gas: string;
        sent_block: string | null;
      }>(
        `SELECT a.batch_id, a.tx_hash, a.nonce::text, a.max_fee_per_gas::text,
           a.max_priority_fee_per_gas::text, a.sent_block::text
         FROM settlement_attempts a JOIN inference_requests r ON r.batch_id = a.batch_id
         WHERE r.id = $1 ORDER BY a.nonce, a.max_fee_per_gas`,
        [requestId],
      )
    ).rows;

  it("settlement, eth_sendRawTransaction failing across flushes while blocks pass: the stored transaction is re-sent as it is, never re-priced; settled once when the node takes it", async () => {
    expect((await flush(stack)).status).toBe(200);
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats = [await chatOn(stack, permitId), await chatOn(stack, permitId)];
    const total = chats.reduce((sum, c) => sum + c.charged, 0n);

    proxy.errors({ kind: "rpc", methods: ["eth_sendRawTransaction"] });
    const sent = proxy.calls("eth_sendRawTransaction");
    expect((await flush(stack)).status).toBe(503);
    const [stored] = await attemptsOf(chats[0]!.id);
    expect(stored).toMatchObject({ sent_block: null });
    for (let i = 0; i < 3; i++) {
      await mineBlocks();
      expect((await flush(stack)).status).toBe(503);
    }
    // Every flush tried to send, and each time the same stored transaction: one attempt, its
    // fees those of the first, never taken by the node.
    expect(proxy.calls("eth_sendRawTransaction")).toBeGreaterThanOrEqual(sent + 4);
    expect(await attemptsOf(chats[0]!.id)).toEqual([stored]);

    proxy.pass();
    await mineBlocks();
    const ok = await flush(stack);
    expect(ok.status).toBe(200);
    expect(ok.body.batches[0]).toMatchObject({
      batch_id: stored!.batch_id,
      status: "settled",
      tx_hash: stored!.tx_hash,
    });
    const [after, ...more] = await attemptsOf(chats[0]!.id);
    expect(more).toEqual([]);
    expect(after).toMatchObject({
      tx_hash: stored!.tx_hash,
      max_fee_per_gas: stored!.max_fee_per_gas,
      max_priority_fee_per_gas: stored!.max_priority_fee_per_gas,
    });
    expect(after!.sent_block).not.toBeNull();
    await expectSettledOnce(permitId, total);
  });

  it("settlement, the account without funds for gas: the flush says insufficient_funds, the metric counts it, an error line names the account; the same transaction is re-sent, never re-priced, and settles once the account is funded", async () => {
    expect((await flush(stack)).status).toBe(200);
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const chats = [await chatOn(stack, permitId), await chatOn(stack, permitId)];
    const total = chats.reduce((sum, c) => sum + c.charged, 0n);
    const account = stack.roles.settlement.address;
    const balance = await stack.clients.publicClient.getBalance({ address: account });
    const counted = await metric("gateway_settlement_insufficient_funds_total");
    const failures = await metric("gateway_settlement_failures_total");
    const logged = () =>
      stack.logs.lines
        .map((line) => JSON.parse(line) as Record<string, unknown>)
        .filter((l) => String(l.msg).startsWith("settlement account has insufficient funds"));
    const loggedBefore = logged().length;

    await anvilRpc("anvil_setBalance", [account, "0x0"]);
    let stored: Awaited<ReturnType<typeof attemptsOf>>[number] | undefined;
    try {
      for (let i = 1; i <= 3; i++) {
        const res = await flush(stack);
        expect(res.status).toBe(200);
        expect(res.body.batches).toEqual([
          expect.objectContaining({
            status: "pending",
            error: expect.stringMatching(/^insufficient_funds: /),
          }),
        ]);
        expect(res.body.settled_requests).toBe(0);
        stored ??= (await attemptsOf(chats[0]!.id))[0];
        expect(res.body.batches[0].tx_hash).toBe(stored!.tx_hash);
        expect(await attemptsOf(chats[0]!.id)).toEqual([{ ...stored!, sent_block: null }]);
        expect(await metric("gateway_settlement_insufficient_funds_total")).toBe(counted + i);
        const lines = logged().slice(loggedBefore);
        expect(lines).toHaveLength(i);
        expect(lines[i - 1]).toMatchObject({
          level: 50,
          account: account.toLowerCase(),
          txHash: stored!.tx_hash,
          needsWei: expect.stringMatching(/^[1-9]\d*$/),
        });
        await mineBlocks();
      }
      // Not a chain outage: the flushes answered, nothing counted as a failure.
      expect(await metric("gateway_settlement_failures_total")).toBe(failures);
      expect(
        (
          await settlementRows(
            stack,
            chats.map((c) => c.id),
          )
        ).map((r) => r.settlement_status),
      ).toEqual(["settling", "settling"]);
    } finally {
      await anvilRpc("anvil_setBalance", [account, `0x${balance.toString(16)}`]);
    }

    const ok = await flush(stack);
    expect(ok.status).toBe(200);
    expect(ok.body.batches[0]).toMatchObject({ status: "settled", tx_hash: stored!.tx_hash });
    expect(await attemptsOf(chats[0]!.id)).toHaveLength(1);
    expect(await metric("gateway_settlement_insufficient_funds_total")).toBe(counted + 3);
    await expectSettledOnce(permitId, total);
  });

  it("indexer, RPC down then erroring on eth_getLogs: the cursor stays, the gateway keeps serving, /metrics shows it; the changes made meanwhile are indexed once it is back", async () => {
    const pausedOffer = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    const cursor = async () =>
      BigInt(
        (
          await stack.database.db.pool.query<{ block_number: string }>(
            "SELECT block_number::text FROM chain_cursors WHERE name = 'market'",
          )
        ).rows[0]!.block_number,
      );
    const listed = async () => {
      const body = await json(await authed(stack, "/v1/models/demo-chat/offers"));
      return body.data as {
        offer_id: string;
        status: string;
        tariff: { input_price_per_mtok: string };
      }[];
    };
    const offerView = async () => (await listed()).find((o) => o.offer_id === pausedOffer)!;
    const onChain = () =>
      stack.clients.publicClient.readContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "getOffer",
        args: [pausedOffer],
      });
    const head = () => stack.clients.publicClient.getBlockNumber({ cacheTime: 0 });
    await eventually(async () => (await cursor()) === (await head()), 10_000);
    const before = await offerView();
    const price = BigInt(before.tariff.input_price_per_mtok);

    // 1. Down: a price change on chain is not seen; the cursor does not move.
    proxy.down();
    const stuck = await cursor();
    const newPrice = price * 3n;
    const { output, wake } = {
      output: (await onChain()).tariff.outputPricePerMTok,
      wake: (await onChain()).tariff.wakeFee,
    };
    // The helper's own indexing pass runs through the gateway's (dead) RPC.
    await expect(
      setOffer(stack, pausedOffer, { tariff: { input: newPrice, output, wake } }),
    ).rejects.toThrow();
    expect((await onChain()).tariff.inputPricePerMTok).toBe(newPrice);
    const errorsBefore = await metric("gateway_chain_errors_total", 'operation="block_number"');
    await new Promise((r) => setTimeout(r, 1000)); // some failed polls (POLL_INTERVAL_MS=100)
    expect(await cursor()).toBe(stuck);
    expect((await fetch(`${stack.gateway.url}/health`)).status).toBe(200);
    expect((await offerView()).tariff.input_price_per_mtok).toBe(price.toString());
    // The scrape cannot read the head: lag unknown (NaN), the failed read counted.
    expect(await metric("gateway_indexer_lag_blocks")).toBeNaN();
    expect(await metric("gateway_chain_errors_total", 'operation="block_number"')).toBeGreaterThan(
      errorsBefore,
    );

    // 2. The head answers but eth_getLogs fails: the cursor stays and the lag grows.
    proxy.errors({ kind: "rpc", methods: ["eth_getLogs"] });
    await setOffer(stack, pausedOffer, { status: 0 }).catch(() => undefined);
    expect((await onChain()).status).toBe(0);
    await eventually(async () => (await metric("gateway_indexer_lag_blocks")) >= 2, 10_000);
    expect(await cursor()).toBe(stuck);
    expect(await offerView()).toMatchObject({
      status: before.status,
      tariff: { input_price_per_mtok: price.toString() },
    });
    expect(stack.logs.text).toContain("indexer pass failed; retrying");

    // 3. Back: both changes are indexed, the cursor reaches the head, the lag is 0.
    proxy.pass();
    await eventually(async () => {
      const view = await offerView();
      return (
        view.tariff.input_price_per_mtok === newPrice.toString() && view.status !== before.status
      );
    }, 10_000);
    await eventually(async () => (await cursor()) === (await head()), 10_000);
    // The scrape's gauges are at most a second old.
    await eventually(async () => (await metric("gateway_indexer_lag_blocks")) === 0, 3_000);
    expect(await metric("gateway_indexer_lag_blocks")).toBe(0);

    // Leave the offer paused again, as the demo market has it.
    await setOffer(stack, pausedOffer, { status: 1 });
  });
});
