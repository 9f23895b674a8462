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
import { startGateway, type Gateway } from "../src/app.js";
import { authorizeKey, type AuthorizationView } from "./helpers/authorize.js";
import { describeIfPostgres, useTestDatabase } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { completion, hex32, NOW, reservation } from "./helpers/ledger.js";
import { auditSecret } from "./helpers/log-audit.js";
import { openPermit } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Budgets that renew (issue 38, item 2): a daily cap shared by two gateway processes (two pools
 * on one PostgreSQL, each its own connections, so their transactions interleave), with the
 * gateway's clock controlled: the period a request counts against is the one that holds the
 * `now` its admission passes (domain/chat/admission.ts `reservationThrough`).
 */
describeIfPostgres("a daily cap shared by two gateway processes (issue 38)", () => {
  const test = useTestDatabase();
  let b: Database;
  beforeAll(async () => {
    b = await openDatabase({ url: test.url! });
  });
  afterAll(async () => {
    await b?.close();
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
      warnAt: 0n,
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

/**
 * The same over HTTP: two gateways on one PostgreSQL (each its own pool, as two processes are),
 * sharing one controlled clock that the test moves a day ahead.
 */
describeIfPostgres(
  "an agent's daily budget, over HTTP on two gateways with a controlled clock (issue 38)",
  () => {
    let stack: TestStack;
    let fake: FakeUpstream;
    let otherDb: Database;
    let other: Gateway;
    let offset = 0;
    const clock = () => Math.floor(Date.now() / 1000) + offset;
    const K = 3;
    let maximum: bigint;
    let agent: string;
    let daily: AuthorizationView;
    const body = JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "an agent's call" }],
      max_tokens: 16,
    });
    const chat = (base: string) =>
      fetch(`${base}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${agent}`,
          "content-type": "application/json",
          "x-gateway-permit": daily.permit_id,
        },
        body,
      });

    beforeAll(async () => {
      // An offer's verification stands a week here, not a day: the clock moves a day ahead.
      ({ stack, fake } = await startChatStack(
        { PERMIT_CACHE_MS: "60000", VERIFICATION_TTL_SECONDS: String(7 * 86_400) },
        { clock },
      ));
      otherDb = await openDatabase({ url: stack.database.url! });
      other = await startGateway(stack.config, { logger: stack.logger, database: otherDb, clock });
      const quote = await json(
        await authed(stack, "/v1/quotes", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body,
        }),
      );
      maximum = BigInt(quote.maximum_credits);
      agent = (await createApiKey(stack.database.db.pool, "agent")).key;
      auditSecret("api key", agent);
      daily = await authorizeKey(stack.gateway.url, agent, stack.roles.payer.privateKey, {
        permitId: await openPermit(stack, { deposit: 100n * maximum }),
        period: "day",
        periodCap: (BigInt(K) * maximum).toString(),
      });
    }, 120_000);
    afterAll(async () => {
      await other?.close();
      await otherDb?.close();
      await fake?.stop();
      await stack?.close();
    });

    /** 3·K chats across both gateways while the provider holds every admitted one. */
    const burst = async () => {
      const calls = fake.calls("/v1/chat/completions");
      fake.setOptions({ stallBeforeHeadersMs: 60_000 });
      let refused = 0;
      const answers = Promise.all(
        Array.from({ length: 3 * K }, async (_, i) => {
          const res = await chat(i % 2 === 0 ? stack.gateway.url : other.url);
          const text = await res.text();
          if (res.status !== 200) refused++;
          return res.status === 200
            ? { status: 200 }
            : {
                status: res.status,
                error: (JSON.parse(text) as { error: { code: string; message: string } }).error,
                retryAfter: res.headers.get("retry-after"),
              };
        }),
      );
      try {
        await eventually(
          async () => refused === 2 * K && fake.calls("/v1/chat/completions") === calls + K,
          20_000,
        );
        await new Promise((r) => setTimeout(r, 300));
        expect(fake.calls("/v1/chat/completions")).toBe(calls + K);
      } finally {
        fake.setOptions({ stallBeforeHeadersMs: undefined });
        fake.releaseHolds();
      }
      return answers;
    };

    it("admits exactly the day's budget across both, refuses the rest naming the day and its renewal, and admits again once the day rolls over", async () => {
      // Retry-After is counted when each refusal is made, during the burst: bounded by the
      // time left when the burst started.
      const startedAt = clock();
      const first = await burst();
      expect(first.filter((a) => a.status === 200)).toHaveLength(K);
      const refusals = first.filter((a) => a.status !== 200);
      expect(refusals).toHaveLength(2 * K);
      const renews = periodEnd("day", clock());
      for (const r of refusals) {
        expect(r).toMatchObject({
          status: 402,
          error: { code: "authorization_period_cap_exhausted" },
        });
        expect(r.error!.message).toContain(
          `renews at ${new Date(renews * 1000).toISOString()} (${renews}, Unix seconds`,
        );
        expect(Number(r.retryAfter)).toBeGreaterThan(0);
        expect(Number(r.retryAfter)).toBeLessThanOrEqual(renews - startedAt + 1);
      }
      const listed = async () =>
        (
          (await json(
            await fetch(`${stack.gateway.url}/v1/permit-authorizations`, {
              headers: { authorization: `Bearer ${agent}` },
            }),
          )) as { data: AuthorizationView[] }
        ).data.find((a) => a.id === daily.id)!;
      const today = await listed();
      expect(today).toMatchObject({ period: "day", period_renews_at: renews });
      expect(BigInt(today.period_used)).toBeGreaterThan(0n);
      expect(BigInt(today.period_used)).toBeLessThanOrEqual(BigInt(K) * maximum);

      // A day later on both gateways' clock: the budget is whole again.
      offset += 86_400;
      expect(await listed()).toMatchObject({ period_used: "0", period_renews_at: renews + 86_400 });
      const second = await burst();
      expect(second.filter((a) => a.status === 200)).toHaveLength(K);
      expect(second.filter((a) => a.status !== 200).map((a) => a.error?.code)).toEqual(
        Array.from({ length: 2 * K }, () => "authorization_period_cap_exhausted"),
      );
    }, 120_000);
  },
);
