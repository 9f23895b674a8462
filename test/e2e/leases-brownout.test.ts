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
 * Issue 19, item 5: a long stream on a lease epoch that a brownout retired. Gateway B (a
 * `gateway serve` process) reaches PostgreSQL through a TCP fault proxy; the stack's gateway
 * reaches it directly and runs the orphan rule throughout. The database is away from B for
 * 3/4 of B's orphan window, long enough that an admission on B retires the epoch its stream
 * runs on (docs/decisions/chat-quotes-and-money.md, "Reservation leases"). The database is then healthy for several
 * orphan windows of the judging process while the stream runs on: the retired epoch must be
 * heartbeated on, so the stream is served to its end and charged what its client was told.
 *
 * B's window (3 s) is shorter than the judge's (5 s) so that B retires its epoch while the
 * judge cannot yet take it for dead: the brownout is a brownout to both.
 */

const bWindowSeconds = 3;
const judgeWindowSeconds = 5;

describeIfPostgres("a stream on a lease epoch retired by a brownout", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let proxy: FaultProxy;
  let b: GatewayProcess;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({
      PERMIT_CACHE_MS: "0",
      ORPHAN_AFTER_SECONDS: String(judgeWindowSeconds),
      HOUSEKEEPING_INTERVAL_MS: "300",
    }));
    const direct = new URL(stack.database.url!);
    proxy = await startFaultProxy({ host: direct.hostname, port: Number(direct.port || 5432) });
    b = await serveProcess(stack, {
      DATABASE_URL: proxy.url(stack.database.url!),
      PERMIT_CACHE_MS: "0",
      // The key and the routing view stay cached through the brownout, so a request reaches
      // admission (and retires the epoch) instead of failing on a catalog read first.
      API_KEY_CACHE_MS: "60000",
      ROUTING_CACHE_MS: "60000",
      ORPHAN_AFTER_SECONDS: String(bWindowSeconds),
      HOUSEKEEPING_INTERVAL_MS: "300",
      DB_CONNECT_TIMEOUT_MS: "500",
      DB_QUERY_TIMEOUT_MS: "1000",
      LEDGER_QUEUE_WAIT_MS: "500",
    });
  }, 60_000);
  afterAll(async () => {
    proxy?.pass();
    await stopProcess(b);
    await proxy?.close();
    await fake?.stop();
    await stack?.close();
  });

  const chat = (permitId: Hex, stream: boolean) =>
    fetch(`${b.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "a long answer" }],
        max_tokens: 64,
        stream,
      }),
    });
  const query = async <R extends pg.QueryResultRow>(text: string, values: unknown[] = []) =>
    (await stack.database.db.pool.query<R>(text, values)).rows;

  it("is heartbeated on: the stream is served across several orphan windows and charged, not voided", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    // Warm B's caches (key, routing) and its first epoch.
    const warm = await chat(permitId, false);
    expect(warm.status).toBe(200);
    await warm.text();
    // The judge's orphan rule is running.
    await eventually(async () => (await stack.gateway.housekeeping.runOnce()).judged, 15_000, 250);

    // A stream of 36 chunks, 500 ms apart: 18 s, over three of the judge's orphan windows.
    fake.setOptions({ delayMs: 500, chunks: 36 });
    const res = await chat(permitId, true);
    expect(res.status).toBe(200);
    const id = res.headers.get("x-gateway-request-id")!;
    const text = res.text();
    await eventually(
      async () =>
        (
          await query<{ status: string }>("SELECT status FROM inference_requests WHERE id = $1", [
            id,
          ])
        )[0]?.status === "streaming",
      10_000,
    );
    const holder = (
      await query<{ holder: string }>(
        "SELECT instance_id AS holder FROM inference_requests WHERE id = $1",
        [id],
      )
    )[0]!.holder;
    expect(holder).toMatch(/\/lease-1$/);

    // The brownout: past 3/4 of B's window an admission on B retires the stream's epoch (and
    // is refused: its new epoch cannot heartbeat); then the database is back.
    proxy.down();
    await sleep(bWindowSeconds * 750 + 300);
    fake.setOptions({ delayMs: 0, chunks: 2 });
    const refused = await chat(permitId, false);
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
      "database_unavailable",
    );
    proxy.pass();

    // B admits on a new epoch now, while the stream runs on the retired one.
    await eventually(
      async () => {
        const r = await chat(permitId, false);
        await r.text();
        return r.status === 200;
      },
      10_000,
      200,
    );
    const epochs = await query<{ instance_id: string }>(
      "SELECT instance_id FROM gateway_instances WHERE instance_id LIKE $1 ORDER BY instance_id",
      [holder.replace(/\/lease-1$/, "/lease-%")],
    );
    expect(epochs.map((e) => e.instance_id)).toEqual([
      holder,
      holder.replace(/\/lease-1$/, "/lease-2"),
    ]);

    // The stream runs to its end through several of the judge's windows.
    const events = sseData(await text);
    expect(events.at(-1)).toBe("[DONE]");
    const told = reportedCharge(events)!;
    expect(told).toBeGreaterThan(0n);
    await eventually(
      async () =>
        (
          await query<{ status: string }>("SELECT status FROM inference_requests WHERE id = $1", [
            id,
          ])
        )[0]?.status !== "streaming",
      10_000,
    );
    expect(
      await query(
        "SELECT status, billing, error, credits_charged::text FROM inference_requests WHERE id = $1",
        [id],
      ),
    ).toEqual([
      { status: "completed", billing: "billed", error: null, credits_charged: told.toString() },
    ]);
    // Holding nothing any more, the retired epoch gives its leases back.
    await eventually(
      async () =>
        (
          await query<{ n: number }>(
            `SELECT ((SELECT count(*) FROM permit_leases WHERE holder = $1)
                   + (SELECT count(*) FROM offer_leases WHERE holder = $1))::int AS n`,
            [holder],
          )
        )[0]!.n === 0,
      10_000,
    );
  }, 90_000);
});
