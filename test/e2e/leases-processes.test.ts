import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { offerInFlight } from "../helpers/ledger.js";
import { openPermit, requestClose } from "../helpers/market.js";
import { serveProcess, stopProcess, type GatewayProcess } from "../helpers/processes.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Reservation leases across real processes (issue 11's acceptance): a process killed while it
 * holds leases gives its credits and slots back through the orphan rule, and a permit whose
 * close is requested admits nothing once the gateway has seen the request.
 */
describeIfPostgres("reservation leases across processes", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let child: GatewayProcess | undefined;
  const orphanEnv = { ORPHAN_AFTER_SECONDS: "3", HOUSEKEEPING_INTERVAL_MS: "300" };

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({
      PERMIT_CACHE_MS: "60000",
      ...orphanEnv,
    }));
  }, 60_000);
  afterAll(async () => {
    await stopProcess(child);
    await fake?.stop();
    await stack?.close();
  });

  const body = JSON.stringify({
    model: "demo-chat",
    messages: [{ role: "user", content: "lease" }],
    max_tokens: 16,
  });
  const chat = (base: string, permitId: Hex, signal?: AbortSignal) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body,
      ...(signal === undefined ? {} : { signal }),
    });
  /** Lease rows on the permit, and on the chat offer when `offer` is set. */
  const leaseRows = async (permitId: Hex, offer = true) => {
    const { rows } = await stack.database.db.pool.query<{ n: number }>(
      `SELECT (SELECT count(*) FROM permit_leases WHERE permit_id = $1)::int
            + (SELECT count(*) FROM offer_leases WHERE offer_id = $2 AND $3)::int AS n`,
      [permitId.toLowerCase(), chatOffer.toLowerCase(), offer],
    );
    return rows[0]!.n;
  };
  const maximumCredits = async (): Promise<bigint> => {
    const quote = await json(
      await authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
      }),
    );
    return BigInt(quote.maximum_credits);
  };

  it("a process killed while holding leases: its credits and slots come back within the orphan window, nothing above the deposit admitted", async () => {
    const maximum = await maximumCredits();
    const deposit = maximum * 20n;
    const permitId = await openPermit(stack, { deposit });
    child = await serveProcess(stack, { PERMIT_CACHE_MS: "0", ...orphanEnv });
    fake.setOptions({ delayMs: 5_000 });
    let peak = 0n;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const l = await permitLedger(stack.database.db.pool, permitId);
        if (l.reserved + l.charged > peak) peak = l.reserved + l.charged;
        await new Promise((r) => setTimeout(r, 5));
      }
    })();
    try {
      const calls = fake.calls("/v1/chat/completions");
      const requests = Array.from({ length: 6 }, () =>
        chat(child!.url, permitId).catch(() => undefined),
      );
      // The process holds leases, and its requests are with the provider.
      await eventually(async () => fake.calls("/v1/chat/completions") >= calls + 6, 10_000);
      expect(await leaseRows(permitId)).toBeGreaterThanOrEqual(2);
      expect(
        (await permitLedger(stack.database.db.pool, permitId)).reserved,
      ).toBeGreaterThanOrEqual(6n * maximum);
      const killedAt = Date.now();
      child.child.kill("SIGKILL");
      await Promise.all(requests);
      const openRecords = async () =>
        (
          await stack.database.db.pool.query<{ open: number }>(
            `SELECT count(*)::int AS open FROM inference_requests
             WHERE permit_id = $1 AND status IN ('pending', 'streaming')`,
            [permitId.toLowerCase()],
          )
        ).rows[0]!.open;
      // The survivor's housekeeping (every 300 ms, orphans after 3 s of silence) releases them,
      // and closes the dead process's records: also one its last transaction committed after a
      // round had run (through a pooler, a transaction the killed client had sent can still
      // commit), which the next round closes.
      await eventually(
        async () =>
          (await leaseRows(permitId)) === 0 &&
          (await permitLedger(stack.database.db.pool, permitId)).reserved === 0n &&
          (await offerInFlight(stack.database.db.pool, chatOffer)) === 0 &&
          (await openRecords()) === 0,
        15_000,
      );
      expect(Date.now() - killedAt).toBeLessThan(3_000 + 5_000);
      const { rows } = await stack.database.db.pool.query<{ open: number; charged: string }>(
        `SELECT count(*) FILTER (WHERE status IN ('pending', 'streaming'))::int AS open,
                COALESCE(sum(credits_charged), 0)::text AS charged
         FROM inference_requests WHERE permit_id = $1`,
        [permitId.toLowerCase()],
      );
      // What the dead process was serving is charged nothing, and nothing stays open.
      expect(rows[0]).toEqual({ open: 0, charged: "0" });
      expect((await permitLedger(stack.database.db.pool, permitId)).charged).toBe(0n);
    } finally {
      watching = false;
      await watcher;
      fake.setOptions({ delayMs: 0 });
    }
    expect(peak).toBeLessThanOrEqual(deposit);
    // The credits are usable again.
    expect((await chat(stack.gateway.url, permitId)).status).toBe(200);
  }, 60_000);

  it("a permit whose close is requested while a lease is held admits nothing once the gateway saw it", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const first = await chat(stack.gateway.url, permitId);
    expect(first.status).toBe(200);
    await first.text();
    // This process holds a lease on the permit (and its permit read is cached for a minute).
    expect(await leaseRows(permitId, false)).toBe(1);
    await requestClose(stack, permitId);
    // The gateway has seen the close request once its indexer recorded it.
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query(
        "SELECT 1 FROM permit_closings WHERE permit_id = $1",
        [permitId.toLowerCase()],
      );
      return rows.length === 1;
    });
    const calls = fake.calls("/v1/chat/completions");
    for (let i = 0; i < 5; i++) {
      const res = await chat(stack.gateway.url, permitId);
      expect(res.status).toBe(402);
      expect((await json(res)).error.code).toBe("permit_closing");
    }
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    // Its lease went back at once, not after the idle second.
    await eventually(async () => (await leaseRows(permitId, false)) === 0, 1_000);
    expect((await permitLedger(stack.database.db.pool, permitId)).reserved).toBe(0n);
  });

  it("GET /v1/requests/{id} on the serving process waits for the record's pending write", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // Record inserts wait behind this lock (reads do not): the write stays pending.
    const blocker = new pg.Client({ connectionString: stack.database.url! });
    await blocker.connect();
    await blocker.query("BEGIN");
    await blocker.query("LOCK TABLE inference_requests IN SHARE MODE");
    let unlocked = false;
    const unlock = async () => {
      if (unlocked) return;
      unlocked = true;
      await blocker.query("COMMIT");
      await blocker.end();
    };
    fake.setOptions({ delayMs: 200 });
    try {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body: JSON.stringify({
          model: "demo-chat",
          messages: [{ role: "user", content: "x" }],
          stream: true,
        }),
      });
      expect(res.status).toBe(200);
      const id = res.headers.get("x-gateway-request-id")!;
      const reading = authed(stack, `/v1/requests/${id}`);
      setTimeout(() => void unlock(), 300);
      const record = await reading;
      expect(record.status).toBe(200);
      expect(unlocked).toBe(true);
      expect((await json(record)).id).toBe(id);
      await res.text();
    } finally {
      fake.setOptions({ delayMs: 0 });
      await unlock();
    }
  });
});
