import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { marketAbi } from "../../gen/contracts/artifacts.js";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { connectSettlement, operatorAuth } from "../../src/clients/settlement.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { offerInFlight } from "../helpers/ledger.js";
import { openPermit } from "../helpers/market.js";
import {
  killProcess,
  restartProcess,
  serveProcess,
  settleWorkerProcess,
  stopProcess,
  type GatewayProcess,
} from "../helpers/processes.js";
import { chainPermit, chatOn, tokenBalance } from "../helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Process faults (issue 13, docs/operations.md "Processes"): a gateway process SIGKILLed with
 * streams in flight, and a settlement worker and the gateway flushing for it SIGKILLed
 * mid-batch. Each ends in its documented state with the money right: every record closed
 * (by the orphan rule of a live process), nothing left reserved, leased or holding an offer
 * slot, nothing charged twice, and every charge settled on chain exactly once.
 */
describeIfPostgres("process faults", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  const children: { child: GatewayProcess["child"] }[] = [];
  // Every process of the database on the same short orphan window (a process heartbeats every
  // housekeeping round; one with a longer round would look dead to the others).
  const orphanEnv = { ORPHAN_AFTER_SECONDS: "4", HOUSEKEEPING_INTERVAL_MS: "300" };
  let payoutBefore: bigint;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({ PERMIT_CACHE_MS: "0", ...orphanEnv }));
    payoutBefore = await tokenBalance(stack, 0, stack.roles.operator.address);
  }, 60_000);
  afterAll(async () => {
    await Promise.all(children.map((c) => killProcess(c)));
    await fake?.stop();
    await stack?.close();
  });

  const serve = async (env: Record<string, string>) => {
    const p = await serveProcess(stack, env);
    children.push(p);
    return p;
  };
  const restart = async (p: GatewayProcess) => {
    const next = await restartProcess(stack, p);
    children.push(next);
    return next;
  };
  const worker = async (gateway: GatewayProcess) => {
    const w = await settleWorkerProcess(stack, gateway, { SETTLE_INTERVAL_MS: "300" });
    children.push(w);
    return w;
  };

  const db = () => stack.database.db.pool;
  const rpc = (method: string, params: unknown[] = []) =>
    stack.clients.publicClient.request({ method: method as never, params: params as never });

  const messages = [{ role: "user" as const, content: "killed mid-stream" }];
  const chatBody = (stream: boolean) =>
    JSON.stringify({ model: "demo-chat", messages, max_tokens: 16, stream });
  const chat = (
    base: string,
    permitId: Hex,
    opts: { stream?: boolean; key?: string } = {},
  ): Promise<Response> =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        ...(opts.key === undefined ? {} : { "idempotency-key": opts.key }),
      },
      body: chatBody(opts.stream === true),
    });
  /** Reads an SSE body to its end; `error` is what ended it when the connection broke. */
  const drain = async (res: Response): Promise<{ text: string; error: unknown }> => {
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return { text, error: undefined };
        text += decoder.decode(value, { stream: true });
      }
    } catch (error) {
      return { text, error };
    }
  };

  interface RecordRow {
    id: string;
    status: string;
    billing: string | null;
    error: string | null;
    credits_charged: string | null;
    maximum_credits: string;
    settlement_status: string;
    instance_id: string;
  }
  const records = async (permitId: Hex): Promise<RecordRow[]> =>
    (
      await db().query<RecordRow>(
        `SELECT id, status, billing, error, credits_charged::text, maximum_credits::text,
                settlement_status, instance_id
         FROM inference_requests WHERE permit_id = $1 ORDER BY created_at, id`,
        [permitId.toLowerCase()],
      )
    ).rows;
  /** The permit's ledger says exactly what its records were charged, each at most its maximum. */
  const expectChargedOnce = async (permitId: Hex) => {
    const rows = await records(permitId);
    let sum = 0n;
    for (const row of rows) {
      const charged = BigInt(row.credits_charged ?? "0");
      expect(charged).toBeLessThanOrEqual(BigInt(row.maximum_credits));
      sum += charged;
    }
    expect((await permitLedger(db(), permitId)).charged).toBe(sum);
    return rows;
  };
  const leaseRows = async (permitId: Hex) =>
    (
      await db().query<{ n: number }>(
        `SELECT (SELECT count(*) FROM permit_leases WHERE permit_id = $1)::int
              + (SELECT count(*) FROM offer_leases WHERE offer_id = $2)::int AS n`,
        [permitId.toLowerCase(), chatOffer.toLowerCase()],
      )
    ).rows[0]!.n;
  const metric = async (p: GatewayProcess, line: RegExp): Promise<number | undefined> => {
    const text = await (await fetch(`${p.url}/metrics`)).text();
    const found = text.split("\n").find((l) => line.test(l));
    return found === undefined ? undefined : Number(found.split(" ").pop());
  };

  it("a gateway SIGKILLed mid-stream: its clients' streams break without [DONE]; a live process voids its records, frees credits, leases and slots; the key is served anew", async () => {
    const quote = await json(
      await authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chatBody(true),
      }),
    );
    const maximum = BigInt(quote.maximum_credits);
    const permitId = await openPermit(stack, { deposit: maximum * 40n });
    // No settlement key: these two only serve.
    const env = { PERMIT_CACHE_MS: "0", SETTLEMENT_PRIVATE_KEY: "", ...orphanEnv };
    const [a, b] = await Promise.all([serve(env), serve(env)]);
    const key = `kill-${randomBytes(8).toString("hex")}`;
    const path = "/v1/chat/completions";

    // Streams at the provider through A: four leased ones and one under an Idempotency-Key
    // (which reserves alone and holds its key's claim).
    fake.setOptions({ delayMs: 1500, chunks: 4 });
    const before = fake.calls(path);
    const answers = await Promise.all([
      ...Array.from({ length: 4 }, () => chat(a.url, permitId, { stream: true })),
      chat(a.url, permitId, { stream: true, key }),
    ]);
    for (const res of answers) expect(res.status).toBe(200);
    const ids = answers.map((res) => res.headers.get("x-gateway-request-id")!);
    const reading = answers.map(drain);
    // Every one is streaming (its record written, its first chunk on the way) when A dies.
    await eventually(async () => {
      const rows = await records(permitId);
      return rows.length === 5 && rows.every((r) => r.status === "streaming");
    }, 10_000);
    expect(fake.calls(path)).toBe(before + 5);
    expect((await permitLedger(db(), permitId)).reserved).toBeGreaterThanOrEqual(5n * maximum);
    const keyedId = ids[4]!;

    await killProcess(a, "SIGKILL");

    // What the clients see: the connection ends without [DONE] (a network error).
    for (const { text, error } of await Promise.all(reading)) {
      expect(error).toBeInstanceOf(Error);
      expect(text).toMatch(/^data: /);
      expect(text).not.toContain("[DONE]");
    }
    // Within the orphan window the key is still A's: 409, and no provider call.
    const early = await chat(b.url, permitId, { stream: true, key });
    expect(early.status).toBe(409);
    expect((await json(early)).error).toMatchObject({
      code: "idempotency_in_progress",
      type: expect.any(String),
      message: expect.any(String),
    });
    expect(fake.calls(path)).toBe(before + 5);

    // A live process's housekeeping (orphans after 4 s of silence) closes A's records and
    // gives back its reservations, leases and offer slots.
    await eventually(
      async () =>
        (await records(permitId)).every(
          (r) => r.status !== "pending" && r.status !== "streaming",
        ) &&
        (await leaseRows(permitId)) === 0 &&
        (await permitLedger(db(), permitId)).reserved === 0n &&
        (await offerInFlight(db(), chatOffer)) === 0,
      20_000,
      100,
    );
    const orphaned = await expectChargedOnce(permitId);
    expect(orphaned.map((r) => r.id).sort()).toEqual([...ids].sort());
    for (const row of orphaned) {
      // The documented orphan: failed, void, charged nothing, nothing to settle.
      expect(row).toMatchObject({
        status: "failed",
        billing: "void",
        error: "orphaned",
        credits_charged: "0",
        settlement_status: "none",
      });
    }
    expect((await permitLedger(db(), permitId)).charged).toBe(0n);
    // The operator sees the survivors' gauges back at zero.
    expect(await metric(b, /^gateway_open_reservations /)).toBe(0);
    expect(await metric(b, /^gateway_leases\{kind="permit"\} /)).toBe(0);
    expect(await metric(b, /^gateway_leases\{kind="offer"\} /)).toBe(0);

    // Every offer slot is free: a burst of max_concurrency (8) requests is admitted at once.
    fake.setOptions({ delayMs: 800, chunks: 2 });
    const burst = await Promise.all(Array.from({ length: 8 }, () => chat(b.url, permitId)));
    expect(burst.map((r) => r.status)).toEqual(burst.map(() => 200));
    await Promise.all(burst.map((r) => r.text()));
    expect(fake.calls(path)).toBe(before + 5 + 8);

    // A restarted with the same environment serves; the key, released with A's orphans, is
    // claimed anew and served once (the original was charged nothing).
    fake.setOptions({ delayMs: 0 });
    const a2 = await restart(a);
    const retry = await chat(a2.url, permitId, { stream: true, key });
    expect(retry.status).toBe(200);
    const retried = await retry.text();
    expect(retried).toContain("data: [DONE]");
    const retryId = retry.headers.get("x-gateway-request-id")!;
    expect(retryId).not.toBe(keyedId);
    expect(fake.calls(path)).toBe(before + 5 + 8 + 1);
    // Replayed again (on B): the stored answer, no provider call, no charge.
    const replay = await chat(b.url, permitId, { stream: true, key });
    expect(replay.status).toBe(200);
    expect(replay.headers.get("x-gateway-request-id")).toBe(retryId);
    expect(await replay.text()).toBe(retried);
    expect(fake.calls(path)).toBe(before + 5 + 8 + 1);

    await eventually(
      async () =>
        (await permitLedger(db(), permitId)).reserved === 0n && (await leaseRows(permitId)) === 0,
      10_000,
      100,
    );
    const rows = await expectChargedOnce(permitId);
    expect(rows).toHaveLength(5 + 8 + 1);
    const served = rows.filter((r) => !ids.includes(r.id));
    for (const row of served) {
      expect(row).toMatchObject({ status: "completed", billing: "billed" });
      expect(BigInt(row.credits_charged!)).toBeGreaterThan(0n);
    }
    await Promise.all([stopProcess(a2), stopProcess(b)]);
  }, 90_000);

  it("a settlement worker and the gateway flushing for it SIGKILLed mid-batch: after restarts every charge settles exactly once", async () => {
    const settleEnv = { PERMIT_CACHE_MS: "0", SETTLEMENT_LEASE_SECONDS: "2", ...orphanEnv };
    const account = stack.roles.settlement.address;
    const nonceBefore = await stack.clients.publicClient.getTransactionCount({ address: account });
    const inFlight = async () =>
      (
        await db().query<{ batch_id: string; status: string; tx_hash: string; nonce: string }>(
          `SELECT b.batch_id, b.status, a.tx_hash, a.nonce::text FROM settlement_batches b
           JOIN settlement_attempts a ON a.batch_id = b.batch_id
           WHERE b.status IN ('pending', 'submitted')`,
        )
      ).rows;
    const attemptsOf = async (batchId: string) =>
      (
        await db().query<{ tx_hash: string }>(
          "SELECT tx_hash FROM settlement_attempts WHERE batch_id = $1",
          [batchId],
        )
      ).rows.map((r) => r.tx_hash);
    const statusOf = async (ids: readonly string[]) =>
      (
        await db().query<{ settlement_status: string }>(
          "SELECT settlement_status FROM inference_requests WHERE id = ANY ($1::text[])",
          [ids],
        )
      ).rows.map((r) => r.settlement_status);
    /** Charges on two fresh permits (two entries per batch), made while blocks are mined. */
    const charges = async (n: number) => {
      const permits = [
        await openPermit(stack, { deposit: 10n ** 18n }),
        await openPermit(stack, { deposit: 10n ** 18n }),
      ];
      const ids: string[] = [];
      for (let i = 0; i < n; i++) ids.push((await chatOn(stack, permits[i % 2]!)).id);
      return { permits, ids };
    };
    const settledOnce = async (ids: readonly string[]) =>
      (await statusOf(ids)).every((s) => s === "settled");

    let g = await serve(settleEnv);
    try {
      // 1. The worker alone killed while its Flush waits for the transaction (blocks are not
      //    mined): the gateway's flush goes on without it and settles the batch once mined.
      const first = await charges(6);
      await rpc("evm_setAutomine", [false]);
      let w = await worker(g);
      // Submitted, not only stored: a batch stored but not yet broadcast when the block is mined
      // would wait in the pool for a block this test never mines.
      await eventually(async () => (await inFlight())[0]?.status === "submitted", 15_000);
      expect(await inFlight()).toHaveLength(1);
      await killProcess(w, "SIGKILL");
      expect(g.child.exitCode).toBeNull();
      await rpc("evm_mine");
      await eventually(() => settledOnce(first.ids), 15_000);

      // 2. Worker and gateway killed with the batch submitted; the transaction lands while no
      //    gateway runs. The restarted gateway finds it settled and sends nothing more.
      await rpc("evm_setAutomine", [true]);
      const second = await charges(6);
      await rpc("evm_setAutomine", [false]);
      w = await worker(g);
      await eventually(async () => (await inFlight())[0]?.status === "submitted", 15_000);
      const [stuck2] = await inFlight();
      await killProcess(w, "SIGKILL");
      await killProcess(g, "SIGKILL");
      expect(await statusOf(second.ids)).toEqual(second.ids.map(() => "settling"));
      await rpc("evm_mine");
      g = await restart(g);
      w = await worker(g);
      await eventually(() => settledOnce(second.ids), 20_000);
      expect(await attemptsOf(stuck2!.batch_id)).toEqual([stuck2!.tx_hash]);
      // The operator sees the batch counted settled by the restarted gateway.
      expect(await metric(g, /^gateway_settlement_batches_total\{status="settled"\} /)).toBe(1);

      // 3. Worker and gateway killed, and the signed transaction lost with them (dropped from
      //    the node's pool): the restarted gateway re-sends the stored bytes, same nonce.
      await killProcess(w, "SIGKILL");
      await rpc("evm_setAutomine", [true]);
      const third = await charges(6);
      await rpc("evm_setAutomine", [false]);
      w = await worker(g);
      await eventually(async () => (await inFlight())[0]?.status === "submitted", 15_000);
      const [stuck3] = await inFlight();
      await killProcess(w, "SIGKILL");
      await killProcess(g, "SIGKILL");
      await rpc("anvil_dropTransaction", [stuck3!.tx_hash]);
      await rpc("evm_setAutomine", [true]);
      expect(await statusOf(third.ids)).toEqual(third.ids.map(() => "settling"));
      g = await restart(g);
      w = await worker(g);
      await eventually(() => settledOnce(third.ids), 20_000);
      expect(await attemptsOf(stuck3!.batch_id)).toEqual([stuck3!.tx_hash]);
      const { rows: mined } = await db().query<{ tx_hash: string }>(
        "SELECT tx_hash FROM settlement_batches WHERE batch_id = $1",
        [stuck3!.batch_id],
      );
      expect(mined[0]!.tx_hash).toBe(stuck3!.tx_hash);

      // Exactly once, across the three faults and everything test 1 charged.
      expect(await inFlight()).toEqual([]);
      const { rows: left } = await db().query<{ n: number }>(
        `SELECT count(*)::int AS n FROM inference_requests
         WHERE credits_charged > 0 AND settlement_status <> 'settled'`,
      );
      expect(left[0]!.n).toBe(0);
      const { rows: perPermit } = await db().query<{ permit_id: Hex; sum: string }>(
        `SELECT permit_id, sum(credits_charged)::text AS sum FROM inference_requests
         WHERE settlement_status = 'settled' GROUP BY permit_id`,
      );
      let total = 0n;
      for (const { permit_id, sum } of perPermit) {
        expect((await chainPermit(stack, permit_id)).settled).toBe(BigInt(sum));
        expect((await permitLedger(db(), permit_id)).settled).toBe(BigInt(sum));
        total += BigInt(sum);
      }
      for (const p of [...first.permits, ...second.permits, ...third.permits])
        expect(perPermit.map((r) => r.permit_id)).toContain(p.toLowerCase());
      // The provider (the offer's payout) got exactly the offers' sums.
      expect((await tokenBalance(stack, 0, stack.roles.operator.address)) - payoutBefore).toBe(
        total,
      );
      // One BatchSettled per settled batch, no id twice, and no other transaction mined from
      // the account (a second settle of one id would have reverted, spending a nonce).
      const events = await stack.clients.publicClient.getContractEvents({
        address: stack.demo.market,
        abi: marketAbi,
        eventName: "BatchSettled",
        fromBlock: stack.demo.deployBlock,
      });
      const { rows: batches } = await db().query<{ batch_id: string; credits: string }>(
        "SELECT batch_id, credits::text FROM settlement_batches WHERE status = 'settled'",
      );
      const eventIds = events.map((e) => (e.args as { batchId: Hex }).batchId.toLowerCase());
      expect(new Set(eventIds).size).toBe(eventIds.length);
      expect([...eventIds].sort()).toEqual(batches.map((b) => b.batch_id.toLowerCase()).sort());
      expect(batches.reduce((s, b) => s + BigInt(b.credits), 0n)).toBe(total);
      expect(
        (await stack.clients.publicClient.getTransactionCount({ address: account })) - nonceBefore,
      ).toBe(batches.length);
      // Reconciliation agrees.
      const connection = connectSettlement(g.url);
      try {
        const report = await connection.client.reconcile({}, operatorAuth(stack.operatorToken));
        expect(report.drift).toBe(false);
      } finally {
        connection.close();
      }
      expect(await metric(g, /^gateway_unsettled_credits /)).toBe(0);
      await killProcess(w, "SIGTERM");
    } finally {
      await rpc("evm_setAutomine", [true]);
      await stopProcess(g);
    }
  }, 90_000);
});
