import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { createFleetRateLimiter } from "../../domain/rate-limit.js";
import { GatewayError } from "../../domain/errors.js";
import { createPgRateLimitStore } from "./rate-limits.js";

/** The fleet's limits in the database (migration 020): on PGlite, and on PostgreSQL when set. */
describe("fleet rate limit store (functions/rate-limits.sql)", () => {
  const test = useTestDatabase();

  const budget = async (key: string) =>
    (
      await test.db.pool.query<{ tokens: number }>(
        "SELECT tokens FROM rate_budgets WHERE api_key_id = $1",
        [key],
      )
    ).rows[0]?.tokens;

  it("grants whole tokens of the bucket, writes nothing on a refusal, caps hand-backs at the burst", async () => {
    const store = createPgRateLimitStore(test.db.pool, "gw_a");
    // No refill (rps 0): the burst is all there is.
    expect(await store.leaseTokens("k1", 4, 0, 0, 10)).toEqual({ granted: 4, tokensLeft: 6 });
    expect(await store.leaseTokens("k1", 10, 0, 0, 10)).toEqual({ granted: 6, tokensLeft: 0 });
    const { rows: before } = await test.db.pool.query<{ xmin: string }>(
      "SELECT xmin::text FROM rate_budgets WHERE api_key_id = 'k1'",
    );
    expect(await store.leaseTokens("k1", 1, 0, 0, 10)).toEqual({ granted: 0, tokensLeft: 0 });
    const { rows: after } = await test.db.pool.query<{ xmin: string }>(
      "SELECT xmin::text FROM rate_budgets WHERE api_key_id = 'k1'",
    );
    expect(after[0]!.xmin).toBe(before[0]!.xmin);
    // Given back: never above the burst.
    expect(await store.leaseTokens("k1", 0, 25, 0, 10)).toEqual({ granted: 0, tokensLeft: 10 });
    expect(await budget("k1")).toBe(10);
    // Refilled at rps: 1000 per second refills 2 tokens in well under a second.
    expect((await store.leaseTokens("k2", 3, 0, 1000, 3)).granted).toBe(3);
    await new Promise((r) => setTimeout(r, 20));
    expect((await store.leaseTokens("k2", 3, 0, 1000, 3)).granted).toBe(3);
  });

  it("holds stream slots per process within the fleet maximum; expired ones stop counting", async () => {
    const a = createPgRateLimitStore(test.db.pool, "gw_a");
    const b = createPgRateLimitStore(test.db.pool, "gw_b");
    expect(await a.setStreams("s", 2, 3, 60)).toBe(2);
    expect(await b.setStreams("s", 2, 3, 60)).toBe(0); // 2 + 2 > 3: refused, b holds none
    expect(await b.setStreams("s", 1, 3, 60)).toBe(1);
    expect(await a.setStreams("s", 3, 3, 60)).toBe(2); // refused: a keeps its 2
    expect(await a.setStreams("s", 0, 3, 60)).toBe(0); // a decrease always succeeds
    expect(await b.setStreams("s", 3, 3, 0.2)).toBe(3);
    expect(await a.setStreams("s", 1, 3, 60)).toBe(0);
    await new Promise((r) => setTimeout(r, 300)); // b's slots expire (b died)
    expect(await a.setStreams("s", 3, 3, 60)).toBe(3);
    const { rows } = await test.db.pool.query<{ instance_id: string }>(
      "SELECT instance_id FROM rate_streams WHERE api_key_id = 's' ORDER BY instance_id",
    );
    expect(rows.map((r) => r.instance_id)).toEqual(["gw_a"]); // the dead holder's row is gone
  });

  it("one process: admits the burst, refuses with Retry-After, and asks the database once per chunk", async () => {
    let calls = 0;
    const pg = createPgRateLimitStore(test.db.pool, "gw_c");
    const limiter = createFleetRateLimiter({
      rps: 4,
      burst: 20,
      maxStreams: 2,
      chunkSeconds: 1.25,
      store: {
        leaseTokens: (...args) => {
          calls++;
          return pg.leaseTokens(...args);
        },
        setStreams: (...args) => pg.setStreams(...args),
      },
    });
    try {
      // chunk: 4 rps x 1.25 s = 5 tokens per lease (a token refills every 250 ms).
      for (let i = 0; i < 20; i++) await limiter.take("one");
      expect(calls).toBe(4);
      const refused = await limiter.take("one").catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(GatewayError);
      expect((refused as GatewayError).code).toBe("rate_limited");
      // Refused again at once without asking the database (a chunk has not refilled).
      const asked = calls;
      await limiter.take("one").catch(() => undefined);
      expect(calls).toBe(asked);
      const s1 = await limiter.acquireStream("one");
      const s2 = await limiter.acquireStream("one");
      const third = await limiter.acquireStream("one").catch((e: unknown) => e);
      expect((third as GatewayError).code).toBe("rate_limited");
      s1();
      s2();
      (await limiter.acquireStream("one"))();
    } finally {
      await limiter.close();
    }
    // Closed: every slot was given back.
    const { rows } = await test.db.pool.query<{ slots: number }>(
      "SELECT slots FROM rate_streams WHERE api_key_id = 'one' AND instance_id = 'gw_c'",
    );
    expect(rows[0]?.slots).toBe(0);
  });
});
