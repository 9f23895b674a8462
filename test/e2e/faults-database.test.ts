import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit } from "../helpers/market.js";
import { reportedCharge, sseData } from "../helpers/sse.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 13, database faults: every connection the gateway holds is killed
 * (`pg_terminate_backend`) while a stream is at the provider. The answer still reaches the client
 * or ends with an error event; the request is closed and charged once; nothing stays reserved;
 * the next requests are served on fresh connections.
 */
describeIfPostgres("database connections killed mid-request", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ PERMIT_CACHE_MS: "0" }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /** Terminates every backend of the test database but the one asking; returns how many. */
  const killConnections = async (): Promise<number> => {
    const admin = new pg.Client({ connectionString: stack.database.url! });
    await admin.connect();
    try {
      const { rows } = await admin.query<{ killed: boolean }>(
        `SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid()`,
      );
      return rows.filter((r) => r.killed).length;
    } finally {
      await admin.end();
    }
  };
  const ledger = async (permitId: string) => {
    const { rows } = await stack.database.db.pool.query<{ reserved: string; charged: string }>(
      "SELECT reserved, charged FROM permit_ledgers WHERE permit_id = $1",
      [permitId],
    );
    return { reserved: BigInt(rows[0]!.reserved), charged: BigInt(rows[0]!.charged) };
  };
  const chat = (permitId: string, stream: boolean) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "through a database fault" }],
        max_tokens: 16,
        stream,
      }),
    });

  it("a stream whose connections are killed at the provider ends in a documented state, charged once", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    fake.setOptions({ delayMs: 150, chunks: 6 });
    const calls = fake.calls("/v1/chat/completions");
    const res = await chat(permitId, true);
    expect(res.status).toBe(200);
    const id = res.headers.get("x-gateway-request-id")!;
    await eventually(async () => fake.calls("/v1/chat/completions") === calls + 1, 10_000, 20);
    expect(await killConnections()).toBeGreaterThan(0);
    const text = await res.text();
    fake.setOptions({ delayMs: 0, chunks: 3 });
    const events = sseData(text);
    const last = events.at(-1)!;
    // The whole answer with its charge, or an error event as the last event: never a silent end.
    const reported = reportedCharge(events);
    if (last === "[DONE]") expect(reported).toBeDefined();
    else expect(JSON.parse(last)).toHaveProperty("error.code");

    // The record closes (housekeeping retries a close the dead connection lost) and the
    // permit's reservation comes back; the charge is the one reported, recorded once.
    let record: { status: string; credits_charged: string; maximum_credits: string } | undefined;
    await eventually(
      async () => {
        await stack.gateway.housekeeping.runOnce().catch(() => undefined);
        const r = await authed(stack, `/v1/requests/${id}`);
        if (r.status !== 200) return false;
        record = (await json(r)) as typeof record;
        return record!.status !== "pending" && record!.status !== "streaming";
      },
      20_000,
      100,
    );
    const charged = BigInt(record!.credits_charged);
    if (reported !== undefined) expect(charged).toBe(reported);
    expect(charged).toBeLessThanOrEqual(BigInt(record!.maximum_credits));
    await eventually(async () => (await ledger(permitId)).reserved === 0n, 10_000, 100);
    expect((await ledger(permitId)).charged).toBe(charged);
    const { rows } = await stack.database.db.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM inference_requests WHERE id = $1",
      [id],
    );
    expect(rows[0]!.n).toBe("1");
  });

  it("after the connections are killed, requests are served again on fresh connections", async () => {
    const permitId = await openPermit(stack, { deposit: 10n ** 18n });
    await killConnections();
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await chat(permitId, false);
      statuses.push(res.status);
      const body = (await json(res)) as { error?: { code: string } };
      // A request refused while the pool reconnects is refused before any upstream call.
      if (res.status !== 200) expect(body.error?.code).toBe("database_unavailable");
    }
    expect(statuses.at(-1)).toBe(200);
    expect(statuses.filter((s) => s !== 200).length).toBeLessThanOrEqual(1);
    await eventually(async () => (await ledger(permitId)).reserved === 0n, 10_000, 100);
  });
});
