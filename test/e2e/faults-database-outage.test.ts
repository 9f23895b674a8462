import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, expect, it } from "vitest";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { describeIfPostgres } from "../helpers/db.js";
import { startFaultProxy, type FaultProxy } from "../helpers/fault-proxy.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import { openPermit } from "../helpers/market.js";
import { serveProcess, stopProcess, type GatewayProcess } from "../helpers/processes.js";
import { reportedCharge, sseData } from "../helpers/sse.js";
import { eventually, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 13, database faults beyond a killed connection (test/e2e/faults-database.test.ts): the
 * database down for seconds and back, the database hung, and the gateway's pool exhausted. The
 * gateway under test is a `gateway serve` process that reaches PostgreSQL through a TCP fault
 * proxy (test/helpers/fault-proxy.ts); the test reads the database directly. Every fault ends
 * in its documented state (docs/operations.md, "Database"): requests that cannot be admitted
 * get 503 `database_unavailable` with the error body and no provider call; a stream already at
 * the provider ends with its whole answer or an error event, and is closed and charged once
 * when the database is back; nothing stays reserved; the gateway serves again without restart.
 */

/** The bounds the gateway is given: a refusal comes within a few of them. */
const bounds = {
  DB_CONNECT_TIMEOUT_MS: "1000",
  DB_STATEMENT_TIMEOUT_MS: "1000",
  DB_QUERY_TIMEOUT_MS: "1500",
  LEDGER_QUEUE_WAIT_MS: "1000",
};
/** Generous: a refusal takes at most a connect wait, a query timeout and a queue wait. */
const refusalWithinMs = 10_000;

interface RecordRow {
  id: string;
  status: string;
  credits_charged: string | null;
  maximum_credits: string;
}

describeIfPostgres("database outage, hang and pool exhaustion", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let proxy: FaultProxy;
  let child: GatewayProcess;
  /** What the child logged (JSON lines). */
  const childLogs: string[] = [];

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({
      PERMIT_CACHE_MS: "0",
      // The in-process gateway (pool and endpoint tests) reads routing from the database each time.
      ROUTING_CACHE_MS: "0",
      ...bounds,
    }));
    const direct = new URL(stack.database.url!);
    proxy = await startFaultProxy({ host: direct.hostname, port: Number(direct.port || 5432) });
    child = await serveProcess(stack, {
      DATABASE_URL: proxy.url(stack.database.url!),
      PERMIT_CACHE_MS: "0",
      // Closes the outage left in the outbox are retried this often.
      HOUSEKEEPING_INTERVAL_MS: "300",
      // The test's key stays cached through an outage (the chat pipeline meets the fault); a
      // key never seen before is looked up, and meets it first.
      API_KEY_CACHE_MS: "60000",
      ...bounds,
    });
    createInterface({ input: child.child.stdout! }).on("line", (line) => childLogs.push(line));
  }, 60_000);
  afterAll(async () => {
    proxy?.pass();
    await stopProcess(child);
    await proxy?.close();
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => {
    proxy.pass();
    fake.setOptions({ delayMs: 0, chunks: 3 });
  });

  const chatBody = (stream: boolean) =>
    JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "through a database outage" }],
      max_tokens: 16,
      stream,
    });
  const chat = (
    base: string,
    permitId: Hex,
    stream: boolean,
    headers: Record<string, string> = {},
  ) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        ...headers,
      },
      body: chatBody(stream),
      signal: AbortSignal.timeout(refusalWithinMs),
    });
  const quote = (base: string) =>
    fetch(`${base}/v1/quotes`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
      body: chatBody(false),
      signal: AbortSignal.timeout(refusalWithinMs),
    });
  const chatCalls = () => fake.calls("/v1/chat/completions");

  /** A request the gateway must refuse: 503 with the error body, within the bounds. */
  const expectRefused = async (
    base: string,
    permitId: Hex,
    stream: boolean,
    send: () => Promise<Response> = () => chat(base, permitId, stream),
  ) => {
    const began = Date.now();
    const res = await send();
    const elapsed = Date.now() - began;
    const body = (await res.json()) as { error?: { code: string; type: string; message: string } };
    expect({ status: res.status, error: body.error?.code, type: body.error?.type }).toEqual({
      status: 503,
      error: "database_unavailable",
      type: "service_unavailable",
    });
    expect(body.error?.message).toEqual(expect.any(String));
    expect(elapsed).toBeLessThan(refusalWithinMs);
  };

  const ready = async (base: string) => {
    const res = await fetch(`${base}/ready`);
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  /** /ready until it is 503: its checks are at most a second old (DESIGN.md section 8). */
  const notReadyWithin = async (base: string) => {
    const deadline = Date.now() + 3_000;
    for (;;) {
      const answer = await ready(base);
      if (answer.status === 503 || Date.now() > deadline) return answer;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  };

  /** Reads on a connection of its own (the stack's pool may be the exhausted one). */
  const query = async <R extends pg.QueryResultRow>(text: string, values: unknown[] = []) => {
    const client = new pg.Client({ connectionString: stack.database.url! });
    await client.connect();
    try {
      return (await client.query<R>(text, values)).rows;
    } finally {
      await client.end();
    }
  };
  const records = (permitId: Hex) =>
    query<RecordRow>(
      `SELECT id, status, credits_charged::text, maximum_credits::text
         FROM inference_requests WHERE permit_id = $1`,
      [permitId.toLowerCase()],
    );
  const ledger = async (permitId: Hex) => {
    const rows = await query<{ reserved: string; charged: string }>(
      "SELECT reserved::text, charged::text FROM permit_ledgers WHERE permit_id = $1",
      [permitId.toLowerCase()],
    );
    return {
      reserved: BigInt(rows[0]?.reserved ?? "0"),
      charged: BigInt(rows[0]?.charged ?? "0"),
    };
  };
  const leases = async (permitId: Hex) =>
    (
      await query<{ n: number }>(
        "SELECT count(*)::int AS n FROM permit_leases WHERE permit_id = $1",
        [permitId.toLowerCase()],
      )
    )[0]!.n;

  /**
   * The end state of a permit: every record closed, nothing reserved or leased, and the ledger's
   * charge the sum of the records' charges (each at most its maximum). Returns that charge.
   */
  const settled = async (permitId: Hex): Promise<bigint> => {
    await eventually(
      async () =>
        (await records(permitId)).every(
          (r) => r.status !== "pending" && r.status !== "streaming",
        ) &&
        (await ledger(permitId)).reserved === 0n &&
        (await leases(permitId)) === 0,
      20_000,
      100,
    );
    let sum = 0n;
    for (const r of await records(permitId)) {
      const charged = BigInt(r.credits_charged ?? "0");
      expect(charged).toBeLessThanOrEqual(BigInt(r.maximum_credits));
      sum += charged;
    }
    expect((await ledger(permitId)).charged).toBe(sum);
    return sum;
  };

  /** The chat offer holds no slot: no request in flight, no lease (every process's). */
  const offersSettled = () =>
    eventually(
      async () =>
        (
          await query<{ n: number }>(
            `SELECT (SELECT COALESCE(sum(in_flight), 0) FROM offer_loads WHERE offer_id = $1)::int
                  + (SELECT count(*) FROM offer_leases WHERE offer_id = $1)::int AS n`,
            [chatOffer.toLowerCase()],
          )
        )[0]!.n === 0,
      20_000,
      100,
    );

  /** A counter of the child's /metrics (summed over the series matching `labels`). */
  const metric = async (base: string, name: string, labels = ""): Promise<number> => {
    const text = await (await fetch(`${base}/metrics`)).text();
    let sum = 0;
    for (const line of text.split("\n")) {
      if (!line.startsWith(name) || (labels !== "" && !line.includes(labels))) continue;
      const [series, value] = line.split(" ");
      if (series === name || series!.startsWith(`${name}{`)) sum += Number(value);
    }
    return sum;
  };

  it("the database down for seconds and back: 503 without a provider call, the stream at the provider closed and charged once, served again without restart", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // A permit nothing was admitted on yet: no lease in memory, every admission asks the database.
    const fresh = await openPermit(stack, { deposit: 10n ** 18n });
    expect((await chat(child.url, permitId, false)).status).toBe(200);
    const quoted = await quote(child.url);
    expect(quoted.status).toBe(200);
    const { quote_id: quoteId } = (await quoted.json()) as { quote_id: string };
    const uncachedKey = (await createApiKey(stack.database.db.pool, "outage")).key;
    auditSecret("api key", uncachedKey);
    const errorsBefore = await metric(child.url, "gateway_database_errors_total");

    // A stream at the provider when the database goes away.
    fake.setOptions({ delayMs: 300, chunks: 8 });
    const calls = chatCalls();
    const stream = await chat(child.url, permitId, true);
    expect(stream.status).toBe(200);
    const streamId = stream.headers.get("x-gateway-request-id")!;
    const streamText = stream.text();
    await eventually(async () => chatCalls() === calls + 1, 10_000, 20);
    fake.setOptions({ delayMs: 0, chunks: 3 });

    proxy.down();
    const downAt = Date.now();
    const during = chatCalls();
    await expectRefused(child.url, fresh, false);
    await expectRefused(child.url, fresh, true);
    // Whatever the caches hold, the money check fails closed: by now the routing view has
    // expired (ROUTING_CACHE_MS, 1 s) and the catalog read fails; a key not cached fails first.
    await sleep(Math.max(0, 3_000 - (Date.now() - downAt)));
    await expectRefused(child.url, fresh, false);
    await expectRefused(child.url, fresh, true);
    await expectRefused(child.url, fresh, true, () =>
      chat(child.url, fresh, true, { authorization: `Bearer ${uncachedKey}` }),
    );
    // The durable paths too: an Idempotency-Key, a quote brought along, a quote asked for.
    await expectRefused(child.url, fresh, false, () =>
      chat(child.url, fresh, false, { "idempotency-key": `outage-${Date.now()}` }),
    );
    await expectRefused(child.url, fresh, false, () =>
      chat(child.url, fresh, false, { "x-gateway-quote": quoteId }),
    );
    await expectRefused(child.url, fresh, false, () => quote(child.url));
    // Read routes as well: the catalog, an offer list, a request's record.
    const read = (path: string) => () =>
      fetch(`${child.url}${path}`, {
        headers: { authorization: `Bearer ${stack.apiKey}` },
        signal: AbortSignal.timeout(refusalWithinMs),
      });
    await expectRefused(child.url, fresh, false, read("/v1/models"));
    await expectRefused(child.url, fresh, false, read("/v1/models/demo-chat/offers"));
    await expectRefused(child.url, fresh, false, read(`/v1/requests/${streamId}`));
    expect(chatCalls()).toBe(during);
    const notReady = await notReadyWithin(child.url);
    expect(notReady.status).toBe(503);
    expect(notReady.body).toMatchObject({
      status: "unavailable",
      checks: { database: { ok: false } },
    });
    expect(proxy.stats().refused).toBeGreaterThan(0);

    // The stream ends with its whole answer or an error event, never silently.
    const events = sseData(await streamText);
    const last = events.at(-1)!;
    const reported = reportedCharge(events);
    if (last === "[DONE]") expect(reported).toBeDefined();
    else expect(JSON.parse(last)).toHaveProperty("error.code");

    // The answer went out while the database was down: once its immediate retries are spent
    // (about 0.7 s, completionRetries) its close waits in the outbox, its record still open and
    // its maximum still reserved (read on a direct connection, past the proxy).
    await sleep(1_500);
    expect(
      (await records(permitId)).filter((r) => r.id === streamId && r.status === "completed"),
    ).toEqual([]);
    expect((await ledger(permitId)).reserved).toBeGreaterThan(0n);
    // ...and the operator is told so while the database is still away.
    await eventually(
      async () => childLogs.some((l) => l.includes("request closes still refused by the database")),
      5_000,
      50,
    );

    // Back: served again by the same process.
    proxy.pass();
    await eventually(async () => (await ready(child.url)).status === 200, 15_000, 100);
    const again = await chat(child.url, fresh, false);
    expect(again.status).toBe(200);
    const streamAgain = await chat(child.url, fresh, true);
    expect(streamAgain.status).toBe(200);
    expect(sseData(await streamAgain.text()).at(-1)).toBe("[DONE]");
    expect(chatCalls()).toBe(during + 2);

    // The stream's record is closed (housekeeping wrote it from the outbox) and charged once.
    await eventually(
      async () =>
        childLogs.some((l) => l.includes("request closes written after the database refused them")),
      10_000,
      50,
    );
    const charged = await settled(permitId);
    const [record] = (await records(permitId)).filter((r) => r.id === streamId);
    expect(record).toBeDefined();
    if (reported !== undefined) expect(BigInt(record!.credits_charged!)).toBe(reported);
    expect(charged).toBeGreaterThan(0n);
    // The permit the outage refused: only what was served after it is recorded and charged.
    await settled(fresh);
    expect((await records(fresh)).map((r) => r.status).sort()).toEqual(["completed", "completed"]);
    await offersSettled();
    // What an operator sees.
    expect(await metric(child.url, "gateway_database_errors_total")).toBeGreaterThan(errorsBefore);
    expect(
      await metric(child.url, "gateway_rejections_total", 'code="database_unavailable"'),
    ).toBeGreaterThanOrEqual(8);
  });

  it("the database hung (a blackhole): 503 within the bounds without a provider call, then served again", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    expect((await chat(child.url, permitId, false)).status).toBe(200);
    const fresh = await openPermit(stack, { deposit: 10n ** 18n });

    proxy.blackhole();
    const calls = chatCalls();
    await expectRefused(child.url, fresh, false);
    await expectRefused(child.url, fresh, true);
    await expectRefused(child.url, fresh, false);
    expect(chatCalls()).toBe(calls);
    expect((await notReadyWithin(child.url)).status).toBe(503);
    expect(proxy.stats().held).toBeGreaterThan(0);

    proxy.pass();
    await eventually(async () => (await ready(child.url)).status === 200, 15_000, 100);
    expect((await chat(child.url, fresh, false)).status).toBe(200);
    expect(chatCalls()).toBe(calls + 1);
    await settled(permitId);
    await settled(fresh);
    expect((await records(fresh)).map((r) => r.status)).toEqual(["completed"]);
    await offersSettled();
  });

  it("the pool exhausted: requests beyond it get 503 after the bounded wait without a provider call; served again once connections free", async () => {
    // The in-process gateway shares the stack's pool (10 connections): the test holds them all.
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    expect((await chat(stack.gateway.url, permitId, false)).status).toBe(200);
    const fresh = await openPermit(stack, { deposit: 10n ** 18n });
    const pool = stack.database.db.pool;
    const rejectedBefore = await metric(
      stack.gateway.url,
      "gateway_rejections_total",
      'code="database_unavailable"',
    );
    const held: pg.PoolClient[] = [];
    try {
      while (held.length < 10) held.push(await pool.connect());
      expect(pool.totalCount).toBe(10);
      const calls = chatCalls();
      await expectRefused(stack.gateway.url, fresh, false);
      await expectRefused(stack.gateway.url, fresh, true);
      await expectRefused(stack.gateway.url, fresh, false);
      expect(chatCalls()).toBe(calls);
      expect(await ledger(fresh)).toEqual({ reserved: 0n, charged: 0n });
      expect(await records(fresh)).toEqual([]);
    } finally {
      for (const client of held) client.release();
    }
    expect((await chat(stack.gateway.url, fresh, false)).status).toBe(200);
    expect(
      await metric(stack.gateway.url, "gateway_rejections_total", 'code="database_unavailable"'),
    ).toBe(rejectedBefore + 3);
    await settled(permitId);
    await settled(fresh);
    expect((await records(fresh)).map((r) => r.status)).toEqual(["completed"]);
    await offersSettled();
  });

  /**
   * Runs `act` while the in-process gateway's queries whose text contains `match` fail as a
   * connection lost at that moment would (the other queries run); returns how many failed.
   */
  const failingQueries = async (match: string, act: () => Promise<void>): Promise<number> => {
    const pool = stack.database.db.pool;
    const original = pool.query;
    let failed = 0;
    const failing = function (this: pg.Pool, ...args: unknown[]) {
      if (typeof args[0] === "string" && args[0].includes(match)) {
        failed++;
        return Promise.reject(new Error("Connection terminated unexpectedly"));
      }
      return (original as (...a: unknown[]) => unknown).apply(this, args);
    };
    pool.query = failing as typeof pool.query;
    try {
      await act();
    } finally {
      pool.query = original;
    }
    return failed;
  };

  it("the endpoint read failing after admission: 503 without a provider call, the request closed void", async () => {
    // The in-process gateway (ROUTING_CACHE_MS=0: no cached endpoint): the admission succeeds,
    // then the connection fails on the one query that reads the offer's endpoint.
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    const calls = chatCalls();
    const failed = await failingQueries("FROM provider_endpoints WHERE offer_id", async () => {
      await expectRefused(stack.gateway.url, permitId, false);
      await expectRefused(stack.gateway.url, permitId, true);
    });
    expect(failed).toBe(2);
    expect(chatCalls()).toBe(calls);
    // Admitted, so recorded: closed void, charged nothing, nothing left reserved.
    expect(await settled(permitId)).toBe(0n);
    const closed = await records(permitId);
    expect(closed.map((r) => [r.status, r.credits_charged])).toEqual([
      ["failed", "0"],
      ["failed", "0"],
    ]);
    // Its record says what failed: the endpoint read, not a provider that was never called.
    const errors = await query<{ error: string }>(
      "SELECT error FROM inference_requests WHERE permit_id = $1",
      [permitId.toLowerCase()],
    );
    expect(errors.map((r) => r.error)).toEqual([
      "the offer's endpoint could not be read",
      "the offer's endpoint could not be read",
    ]);
    expect((await chat(stack.gateway.url, permitId, false)).status).toBe(200);
    expect(chatCalls()).toBe(calls + 1);
    await settled(permitId);
    await offersSettled();
  });

  it("a quote whose insert fails: 503, nothing stored", async () => {
    const before = (await query<{ n: number }>("SELECT count(*)::int AS n FROM quotes"))[0]!.n;
    const failed = await failingQueries("INSERT INTO quotes", () =>
      expectRefused(stack.gateway.url, stack.demo.permitId, false, () => quote(stack.gateway.url)),
    );
    expect(failed).toBe(1);
    expect((await query<{ n: number }>("SELECT count(*)::int AS n FROM quotes"))[0]!.n).toBe(
      before,
    );
    expect((await quote(stack.gateway.url)).status).toBe(200);
  });
});
