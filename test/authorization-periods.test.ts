import { randomBytes, randomInt } from "node:crypto";
import pg from "pg";
import type { Hex } from "viem";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { openDatabase, type Database } from "../src/adapters/pg/database.js";
import {
  createLedgerBatcher,
  finalize,
  type ReserveInput,
  reserve,
} from "../src/adapters/pg/ledger/index.js";
import {
  getPermitAuthorization,
  insertPermitAuthorization,
} from "../src/adapters/pg/permit-authorizations.js";
import type { ReserveResult } from "../src/domain/chat/ports.js";
import {
  periodEnd,
  periodStart,
  periodUse,
  type PermitAuthorization,
} from "../src/domain/permit-authorization/index.js";
import { createTestDatabase, describeIfPostgres, type TestDatabase } from "./helpers/db.js";
import { completion, hex32, NOW, reservation } from "./helpers/ledger.js";

/**
 * Budgets that renew (issue 38, item 2): a daily cap shared by two gateway processes (two pools
 * on one PostgreSQL, each its own connections, so their transactions interleave), with the
 * gateway's clock controlled: the period a request counts against is the one that holds the
 * `now` its admission passes (domain/chat/admission.ts `reservationThrough`).
 */
describeIfPostgres("a daily cap shared by two gateway processes (issue 38)", () => {
  let test: TestDatabase;
  let b: Database;
  beforeAll(async () => {
    test = await createTestDatabase();
    b = await openDatabase({ url: test.url! });
  });
  afterAll(async () => {
    await b?.close();
    await test?.drop();
  });

  async function periodLedger(client: pg.Client | pg.Pool, authorizationId: string) {
    const { rows } = await client.query<{
      period_start: string;
      period_reserved: string;
      period_used: string;
    }>(
      `SELECT period_start, period_reserved, period_used FROM authorization_ledgers
       WHERE authorization_id = $1`,
      [authorizationId],
    );
    const row = rows[0];
    return row === undefined
      ? { start: 0, reserved: 0n, used: 0n }
      : {
          start: Number(row.period_start),
          reserved: BigInt(row.period_reserved),
          used: BigInt(row.period_used),
        };
  }

  it("admits exactly what fits the day's cap in a burst across both, refuses the rest with the period's code, and admits again once the day rolls over, the earlier day's closes charging only that day", async () => {
    const K = 10;
    const maximum = 1_000n;
    const cap = maximum * BigInt(K);
    const key = await createApiKey(test.db.pool, "daily");
    const a: PermitAuthorization = {
      id: `pauth_${randomBytes(12).toString("hex")}`,
      apiKeyId: key.id,
      payer: `0x${"aa".repeat(20)}`,
      permitId: hex32().toLowerCase() as Hex,
      expiresAt: NOW + 30 * 86_400,
      issuedAt: NOW,
      totalCap: 0n,
      perRequestCap: 0n,
      period: "day",
      periodCap: cap,
      createdAt: NOW,
      revokedAt: null,
      revokedBy: null,
    };
    await insertPermitAuthorization(test.db.pool, a, {
      nonce: randomBytes(8).toString("hex"),
      signature: `0x${"11".repeat(65)}`,
    });
    const pools = [test.db.pool, b.pool];
    const batchers = pools.map((pool) => createLedgerBatcher(pool));
    // The gateway's clock: late in one UTC day, then early in the next.
    const today = periodStart("day", NOW) + 86_400 - 60;
    const tomorrow = today + 120;
    expect(periodStart("day", tomorrow)).toBe(periodEnd("day", today));
    const through = (now: number): ReserveInput =>
      reservation({
        // One permit and one offer per request: the cap's row is the one thing they share.
        permitId: hex32(),
        offerId: hex32(),
        maximumCredits: maximum,
        deposit: 10n * maximum,
        maxConcurrency: 1_000_000,
        authorizationId: a.id,
        capped: true,
        periodStart: periodStart("day", now),
      });
    const watcher = new pg.Client({ connectionString: test.url! });
    await watcher.connect();
    const violations: string[] = [];
    let stop = false;
    const watching = (async () => {
      while (!stop) {
        const l = await periodLedger(watcher, a.id);
        if (l.reserved + l.used > cap) violations.push(`${l.reserved} + ${l.used} > ${cap}`);
      }
    })();
    const burst = async (now: number) => {
      const inputs = Array.from({ length: 5 * K }, () => through(now));
      const results: ReserveResult[] = await Promise.all(
        inputs.map((input, i) =>
          // Alternately each process's single call and its batcher (group commit).
          i % 4 < 2 ? reserve(pools[i % 2]!, input) : batchers[i % 2]!.reserve(input),
        ),
      );
      return {
        admitted: inputs.filter((_, i) => results[i]!.ok),
        refusals: new Set(results.filter((r) => !r.ok).map((r) => !r.ok && r.reason)),
      };
    };
    try {
      const first = await burst(today);
      expect(first.admitted).toHaveLength(K);
      expect(first.refusals).toEqual(new Set(["authorization_period_cap_exhausted"]));
      expect(await periodLedger(test.db.pool, a.id)).toEqual({
        start: periodStart("day", today),
        reserved: cap,
        used: 0n,
      });
      // Closing today's half frees what they were not charged, for today.
      const charges = first.admitted.map(() => BigInt(randomInt(0, 1_000)));
      await Promise.all(
        first.admitted
          .slice(0, K / 2)
          .map((input, i) => finalize(pools[i % 2]!, completion(input.requestId, charges[i]!))),
      );
      const chargedToday = charges.slice(0, K / 2).reduce((s, c) => s + c, 0n);
      expect(await periodLedger(test.db.pool, a.id)).toMatchObject({
        reserved: cap / 2n,
        used: chargedToday,
      });
      const listed = (await getPermitAuthorization(test.db.pool, a.id))!;
      expect(periodUse(listed, today)).toEqual({
        used: cap / 2n + chargedToday,
        renewsAt: periodEnd("day", today),
      });

      // The day rolls over: the cap is whole again, though today's other half is still open.
      const second = await burst(tomorrow);
      expect(second.admitted).toHaveLength(K);
      expect(second.refusals).toEqual(new Set(["authorization_period_cap_exhausted"]));
      expect(await periodLedger(test.db.pool, a.id)).toEqual({
        start: periodStart("day", tomorrow),
        reserved: cap,
        used: 0n,
      });
      // Yesterday's open requests close now: they charge yesterday, never the new day.
      await Promise.all(
        first.admitted
          .slice(K / 2)
          .map((input, i) => finalize(pools[i % 2]!, completion(input.requestId, 700n))),
      );
      expect(await periodLedger(test.db.pool, a.id)).toMatchObject({ reserved: cap, used: 0n });
      const { rows } = await test.db.pool.query<{ day: string; n: number }>(
        `SELECT authorization_period_start::text AS day, count(*)::int AS n
         FROM inference_requests WHERE authorization_id = $1 GROUP BY 1 ORDER BY 1`,
        [a.id],
      );
      expect(rows).toEqual([
        { day: String(periodStart("day", today)), n: K },
        { day: String(periodStart("day", tomorrow)), n: K },
      ]);
      // The listing at yesterday's reading would be stale: read now, it shows the new day.
      const now = (await getPermitAuthorization(test.db.pool, a.id))!;
      expect(periodUse(now, tomorrow)).toEqual({
        used: cap,
        renewsAt: periodEnd("day", tomorrow),
      });
      expect(now.use).toMatchObject({ creditsReserved: cap, lastUsedAt: expect.any(Number) });
    } finally {
      stop = true;
      await watching;
      await watcher.end();
    }
    expect(violations).toEqual([]);
  });
});
