import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { chatOn, messages } from "./helpers/settlement.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * A reservation batch that hangs in the database (a row lock held elsewhere) must not stall
 * every request of the process: what waits behind it longer than LEDGER_QUEUE_WAIT_MS is
 * refused 503 `database_unavailable`, and no provider is called for it. PostgreSQL only: the
 * lock needs a second connection.
 */
describeIfPostgres("backpressure behind a hung ledger batch", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: `0x${string}`;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({
      PERMIT_CACHE_MS: "0",
      LEDGER_QUEUE_WAIT_MS: "300",
    }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chat = () =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 16 }),
    });

  it("refuses what waits too long with 503 database_unavailable and no upstream call, then recovers", async () => {
    await chatOn(stack, stack.demo.permitId); // the offer's load row exists
    const blocker = new pg.Client({ connectionString: stack.database.url! });
    await blocker.connect();
    const calls = fake.calls("/v1/chat/completions");
    let inFlight: Promise<Response> | undefined;
    try {
      await blocker.query("BEGIN");
      await blocker.query("SELECT * FROM offer_loads WHERE offer_id = $1 FOR UPDATE", [chatOffer]);
      // The first reservation goes out and hangs on the lock; the rest queue behind it.
      inFlight = chat();
      await new Promise((r) => setTimeout(r, 100));
      const started = Date.now();
      const refused = await Promise.all([chat(), chat(), chat()]);
      expect(Date.now() - started).toBeLessThan(5000);
      for (const res of refused) {
        expect(res.status).toBe(503);
        expect((await json(res)).error).toMatchObject({
          code: "database_unavailable",
          type: "service_unavailable",
        });
      }
      expect(fake.calls("/v1/chat/completions")).toBe(calls);
    } finally {
      await blocker.query("COMMIT").catch(() => undefined);
      await blocker.end();
    }
    // The hung one goes on once the lock is released, and the process serves as before.
    expect((await inFlight!).status).toBe(200);
    expect((await chat()).status).toBe(200);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 2);
  });
});
