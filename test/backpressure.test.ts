import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { chatOn, messages } from "./helpers/settlement.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * A reservation batch that hangs in the database (a row lock held elsewhere) must not stall
 * every request of the process: the statement is cancelled after DB_STATEMENT_TIMEOUT_MS, what
 * waits behind it is refused once LEDGER_QUEUE_MAX are waiting or after LEDGER_QUEUE_WAIT_MS,
 * each with 503 `database_unavailable`, and no provider is called for any of them. PostgreSQL
 * only: the lock needs a second connection.
 */
describeIfPostgres("backpressure behind a hung ledger batch", () => {
  /** The spec's error body of a refused reservation. */
  async function expectDatabaseUnavailable(res: Response): Promise<void> {
    expect(res.status).toBe(503);
    const body = await json(res);
    expect(Object.keys(body)).toEqual(["error"]);
    expect(body.error).toEqual({
      code: "database_unavailable",
      type: "service_unavailable",
      message: expect.any(String),
    });
  }

  /** A client holding the row lock every reservation on `offerId` needs, until `release`. */
  async function lockOffer(stack: TestStack, offerId: `0x${string}`) {
    const blocker = new pg.Client({ connectionString: stack.database.url! });
    await blocker.connect();
    await blocker.query("BEGIN");
    await blocker.query("SELECT * FROM offer_loads WHERE offer_id = $1 FOR UPDATE", [offerId]);
    let released = false;
    return {
      async release() {
        if (released) return;
        released = true;
        await blocker.query("COMMIT").catch(() => undefined);
        await blocker.end();
      },
    };
  }

  /** Resolves once some statement of the stack's database waits for a lock. */
  async function someoneWaitsForALock(stack: TestStack): Promise<void> {
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`,
      );
      return rows[0]!.n > 0;
    }, 5000);
  }

  const chat = (stack: TestStack) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 16 }),
    });

  const elapsed = async (res: Promise<Response>, since: number) => {
    const r = await res;
    return { res: r, ms: Date.now() - since };
  };

  describe("LEDGER_QUEUE_WAIT_MS", () => {
    let stack: TestStack;
    let fake: FakeUpstream;
    let chatOffer: `0x${string}`;

    beforeAll(async () => {
      ({ stack, fake, chatOffer } = await startChatStack({
        PERMIT_CACHE_MS: "0",
        LEDGER_QUEUE_WAIT_MS: "300",
        // The per-request reservation's batches; the leases' extensions are tested below.
        RESERVATION_LEASES: "false",
      }));
    });
    afterAll(async () => {
      await fake?.stop();
      await stack?.close();
    });

    it("refuses what waits too long with 503 database_unavailable and no upstream call, then recovers", async () => {
      await chatOn(stack, stack.demo.permitId); // the offer's load row exists
      const calls = fake.calls("/v1/chat/completions");
      const lock = await lockOffer(stack, chatOffer);
      let inFlight: Promise<Response> | undefined;
      try {
        // The first reservation goes out and hangs on the lock; the rest queue behind it.
        inFlight = chat(stack);
        await someoneWaitsForALock(stack);
        const started = Date.now();
        const refused = await Promise.all([1, 2, 3].map(() => elapsed(chat(stack), started)));
        for (const { res, ms } of refused) {
          await expectDatabaseUnavailable(res);
          // Refused after waiting its 300 ms, not before and not much after.
          expect(ms).toBeGreaterThanOrEqual(250);
          expect(ms).toBeLessThan(2000);
        }
        expect(fake.calls("/v1/chat/completions")).toBe(calls);
      } finally {
        await lock.release();
      }
      // The hung one was sent before the others waited: it keeps its outcome once the lock goes,
      // and the process serves as before.
      expect((await inFlight!).status).toBe(200);
      expect((await chat(stack)).status).toBe(200);
      expect(fake.calls("/v1/chat/completions")).toBe(calls + 2);
    });
  });

  describe("DB_STATEMENT_TIMEOUT_MS and LEDGER_QUEUE_MAX", () => {
    let stack: TestStack;
    let fake: FakeUpstream;
    let chatOffer: `0x${string}`;
    const statementMs = 1500;

    beforeAll(async () => {
      ({ stack, fake, chatOffer } = await startChatStack({
        PERMIT_CACHE_MS: "0",
        DB_STATEMENT_TIMEOUT_MS: String(statementMs),
        DB_QUERY_TIMEOUT_MS: "5000",
        DB_CONNECT_TIMEOUT_MS: "2000",
        LEDGER_QUEUE_MAX: "1",
        LEDGER_QUEUE_WAIT_MS: "20000",
        RESERVATION_LEASES: "false",
      }));
    });
    afterAll(async () => {
      await fake?.stop();
      await stack?.close();
    });

    it("cancels the hung reservation, refuses what the queue cannot hold at once, calls no provider, then recovers", async () => {
      await chatOn(stack, stack.demo.permitId);
      const calls = fake.calls("/v1/chat/completions");
      const lock = await lockOffer(stack, chatOffer);
      let queued: Promise<Response> | undefined;
      try {
        const started = Date.now();
        let hungAnswered = false;
        const hung = elapsed(chat(stack), started).finally(() => (hungAnswered = true));
        await someoneWaitsForALock(stack);
        // One waits in the queue (LEDGER_QUEUE_MAX=1) ...
        queued = chat(stack);
        await new Promise((r) => setTimeout(r, 300));
        // ... so the next is refused at once, while the hung one is still hanging.
        const full = await elapsed(chat(stack), Date.now());
        await expectDatabaseUnavailable(full.res);
        expect(full.ms).toBeLessThan(1000);
        expect(hungAnswered).toBe(false);

        // The server cancels the hung statement: 503, within the statement timeout's bound.
        const first = await hung;
        await expectDatabaseUnavailable(first.res);
        expect(first.ms).toBeGreaterThanOrEqual(statementMs - 100);
        expect(first.ms).toBeLessThan(statementMs + 2500);
        expect(fake.calls("/v1/chat/completions")).toBe(calls);
      } finally {
        await lock.release();
      }
      // The queued one was sent when the hung batch ended and gets the lock now: served.
      expect((await queued!).status).toBe(200);
      expect((await chat(stack)).status).toBe(200);
      expect(fake.calls("/v1/chat/completions")).toBe(calls + 2);
      // Nothing stays held: no credits reserved on the permit, no slot taken on the offer.
      await eventually(async () => {
        const permit = await json(await authed(stack, `/v1/permits/${stack.demo.permitId}`));
        const { rows } = await stack.database.db.pool.query<{ in_flight: number }>(
          "SELECT in_flight FROM offer_loads WHERE offer_id = $1",
          [chatOffer],
        );
        return permit.reserved === "0" && rows[0]?.in_flight === 0;
      });
    });
  });

  describe("a reservation lease whose extension hangs (LEDGER_QUEUE_WAIT_MS)", () => {
    let stack: TestStack;
    let fake: FakeUpstream;

    beforeAll(async () => {
      ({ stack, fake } = await startChatStack({
        PERMIT_CACHE_MS: "0",
        LEDGER_QUEUE_WAIT_MS: "300",
      }));
    });
    afterAll(async () => {
      await fake?.stop();
      await stack?.close();
    });

    it("refuses requests waiting for the extension with 503 and no upstream call, then recovers", async () => {
      const permitId = stack.demo.permitId;
      await chatOn(stack, permitId); // the permit's ledger row exists
      // This process's lease goes back when idle: the next request must extend it.
      await eventually(
        async () => (await json(await authed(stack, `/v1/permits/${permitId}`))).reserved === "0",
      );
      const calls = fake.calls("/v1/chat/completions");
      const blocker = new pg.Client({ connectionString: stack.database.url! });
      await blocker.connect();
      await blocker.query("BEGIN");
      await blocker.query("SELECT * FROM permit_ledgers WHERE permit_id = $1 FOR UPDATE", [
        permitId.toLowerCase(),
      ]);
      try {
        const started = Date.now();
        const refused = await Promise.all([1, 2, 3].map(() => elapsed(chat(stack), started)));
        for (const { res, ms } of refused) {
          await expectDatabaseUnavailable(res);
          expect(ms).toBeGreaterThanOrEqual(250);
          expect(ms).toBeLessThan(2000);
        }
        expect(fake.calls("/v1/chat/completions")).toBe(calls);
      } finally {
        await blocker.query("COMMIT");
        await blocker.end();
      }
      expect((await chat(stack)).status).toBe(200);
      expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    });
  });
});
