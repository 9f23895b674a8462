import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "../helpers/db.js";
import { startFaultProxy, type FaultProxy } from "../helpers/fault-proxy.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit } from "../helpers/market.js";
import { serveProcess, stopProcess, type GatewayProcess } from "../helpers/processes.js";
import { reportedCharge, sseData } from "../helpers/sse.js";
import { eventually, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 19, item 4: replicas must not void each other's answered requests after a database
 * outage longer than the orphan window. Two `gateway serve` processes, A and B, reach PostgreSQL
 * through one TCP fault proxy (test/helpers/fault-proxy.ts). While the database is down, both
 * answer the streams they had at the provider and keep the closes in their outboxes; the outage
 * outlasts ORPHAN_AFTER_SECONDS, so when it ends every process's heartbeat looks stale. A runs
 * housekeeping every 100 ms and B every 1.5 s, so A's round comes first: it must not judge B
 * dead before B had a round to heartbeat and write its closes (docs/decisions/chat-quotes-and-money.md, "Orphans").
 * B's charges land as its clients were told them.
 */

/** Refusals within a few seconds while the database is away. */
const bounds = {
  DB_CONNECT_TIMEOUT_MS: "1000",
  DB_STATEMENT_TIMEOUT_MS: "1000",
  DB_QUERY_TIMEOUT_MS: "1500",
  LEDGER_QUEUE_WAIT_MS: "1000",
};
const orphanSeconds = 3;

describeIfPostgres("replicas after a database outage longer than the orphan window", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let proxy: FaultProxy;
  let a: GatewayProcess;
  let b: GatewayProcess;
  const logs = { a: [] as string[], b: [] as string[] };

  beforeAll(async () => {
    // The in-process gateway of the stack reaches the database directly; its orphan window is
    // the default minute, so its housekeeping judges no one within this test.
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
    const direct = new URL(stack.database.url!);
    proxy = await startFaultProxy({ host: direct.hostname, port: Number(direct.port || 5432) });
    const env = (intervalMs: number) => ({
      DATABASE_URL: proxy.url(stack.database.url!),
      PERMIT_CACHE_MS: "0",
      API_KEY_CACHE_MS: "60000",
      ORPHAN_AFTER_SECONDS: String(orphanSeconds),
      HOUSEKEEPING_INTERVAL_MS: String(intervalMs),
      ...bounds,
    });
    [a, b] = await Promise.all([serveProcess(stack, env(100)), serveProcess(stack, env(1_500))]);
    createInterface({ input: a.child.stdout! }).on("line", (line) => logs.a.push(line));
    createInterface({ input: b.child.stdout! }).on("line", (line) => logs.b.push(line));
  }, 60_000);
  afterAll(async () => {
    proxy?.pass();
    await Promise.all([stopProcess(a), stopProcess(b)]);
    await proxy?.close();
    await fake?.stop();
    await stack?.close();
  });

  const chat = (base: string, permitId: Hex, headers: Record<string, string> = {}) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        ...headers,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "across the outage" }],
        max_tokens: 16,
        stream: true,
      }),
    });

  /** Reads on a connection of its own, past the proxy. */
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
    query<{ id: string; status: string; billing: string | null; credits_charged: string | null }>(
      `SELECT id, status, billing, credits_charged::text FROM inference_requests
       WHERE permit_id = $1 ORDER BY id`,
      [permitId.toLowerCase()],
    );
  const ledger = async (permitId: Hex) =>
    (
      await query<{ reserved: string; charged: string }>(
        "SELECT reserved::text, charged::text FROM permit_ledgers WHERE permit_id = $1",
        [permitId.toLowerCase()],
      )
    )[0];

  it("B's answered closes land as charged once the database is back; A does not void them", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // Both processes' orphan rules have been running for a while (a full window and more).
    await sleep((orphanSeconds + 1) * 1000);

    // Streams at the provider on both: B a plain one (a reservation lease) and one with an
    // Idempotency-Key (a reservation of its own), A a plain one.
    fake.setOptions({ delayMs: 300, chunks: 8 });
    const calls = fake.calls("/v1/chat/completions");
    const answers = await Promise.all([
      chat(b.url, permitId),
      chat(b.url, permitId, { "idempotency-key": `replicas-${Date.now()}` }),
      chat(a.url, permitId),
    ]);
    for (const res of answers) expect(res.status).toBe(200);
    const ids = answers.map((res) => res.headers.get("x-gateway-request-id")!);
    const texts = answers.map((res) => res.text());
    await eventually(async () => {
      const rows = await records(permitId);
      return rows.length === 3 && rows.every((r) => r.status === "streaming");
    }, 10_000);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 3);

    // The database goes away for longer than the orphan window, while the answers finish.
    proxy.down();
    const downAt = Date.now();
    const told: bigint[] = [];
    for (const text of texts) {
      const events = sseData(await text);
      expect(events.at(-1)).toBe("[DONE]");
      told.push(reportedCharge(events)!);
    }
    for (const charge of told) expect(charge).toBeGreaterThan(0n);
    // Their closes wait in the outboxes: nothing is closed yet.
    await eventually(
      async () =>
        logs.b.some((l) => l.includes("request closes still refused by the database")) &&
        logs.a.some((l) => l.includes("request closes still refused by the database")),
      10_000,
    );
    expect((await records(permitId)).map((r) => r.status)).toEqual([
      "streaming",
      "streaming",
      "streaming",
    ]);
    await sleep(Math.max(0, (orphanSeconds + 2) * 1000 - (Date.now() - downAt)));
    proxy.pass();

    // Every close lands as the client was told it: completed, billed, that charge.
    await eventually(
      async () =>
        (await records(permitId)).every((r) => r.status !== "pending" && r.status !== "streaming"),
      15_000,
      100,
    );
    const byId = new Map((await records(permitId)).map((r) => [r.id, r]));
    expect(ids.map((id) => byId.get(id))).toEqual(
      ids.map((id, i) => ({
        id,
        status: "completed",
        billing: "billed",
        credits_charged: told[i]!.toString(),
      })),
    );
    const sum = told.reduce((x, y) => x + y, 0n);
    await eventually(async () => (await ledger(permitId))?.reserved === "0", 10_000, 100);
    expect(await ledger(permitId)).toEqual({ reserved: "0", charged: sum.toString() });

    // A paused its orphan rule for the outage, and voided nothing.
    expect(logs.a.some((l) => l.includes("orphan rule paused"))).toBe(true);
    expect(logs.a.some((l) => l.includes("reconciled requests of a stopped gateway process"))).toBe(
      false,
    );
    expect(
      logs.b.some((l) => l.includes("request closes written after the database refused them")),
    ).toBe(true);
  }, 60_000);
});
