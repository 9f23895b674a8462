import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { completion, hex32, id, NOW, reservation } from "../../../test/helpers/ledger.js";
import type { PermitAuthorization } from "../../domain/permit-authorization/index.js";
import { createApiKey } from "./api-keys.js";
import {
  createLedgerBatcher,
  finalize,
  heartbeat,
  permitLedger,
  reconcileOrphans,
  reserve,
  switchOffer,
  voidReservation,
  type ReserveInput,
} from "./ledger/index.js";
import {
  getPermitAuthorization,
  insertPermitAuthorization,
  listPermitAuthorizations,
} from "./permit-authorizations.js";
import { getQuote } from "./quotes.js";

// The ledger of an authorization's total cap (migration 030; ledger.ts "Authorization caps"),
// one connection at a time (PGlite or PostgreSQL). Concurrency across processes:
// test/ledger-concurrency.test.ts and test/e2e/authorization-caps.test.ts.

const test = useTestDatabase();
let apiKeyId: string;

beforeAll(async () => {
  apiKeyId = (await createApiKey(test.db.pool, "caps")).id;
  // The fixtures' process is alive throughout: only the orphan test's requests are orphans.
  await heartbeat(test.db.pool, "instance_live", NOW + 10_000);
});

let n = 0;

/** A stored authorization of the test key on one permit, with the caps given. */
async function authorization(
  caps: {
    totalCap?: bigint;
    perRequestCap?: bigint;
    period?: PermitAuthorization["period"];
    periodCap?: bigint;
    warnAt?: bigint;
  } = {},
): Promise<PermitAuthorization> {
  const a: PermitAuthorization = {
    id: `pauth_${(++n).toString(16).padStart(24, "0")}`,
    apiKeyId,
    payer: `0x${"aa".repeat(20)}`,
    permitId: hex32().toLowerCase() as Hex,
    expiresAt: NOW + 3600,
    issuedAt: NOW,
    totalCap: caps.totalCap ?? 0n,
    perRequestCap: caps.perRequestCap ?? 0n,
    period: caps.period ?? "",
    periodCap: caps.periodCap ?? 0n,
    warnAt: caps.warnAt ?? 0n,
    createdAt: NOW,
    revokedAt: null,
    revokedBy: null,
  };
  expect(
    await insertPermitAuthorization(test.db.pool, a, {
      nonce: id("nonce"),
      signature: `0x${"11".repeat(65)}`,
    }),
  ).toBe("inserted");
  return a;
}

/** The cap's ledger row; undefined while the authorization has none. */
async function capLedger(authorizationId: string) {
  const { rows } = await test.db.pool.query<{ reserved: string; used: string; total_cap: string }>(
    "SELECT reserved, used, total_cap FROM authorization_ledgers WHERE authorization_id = $1",
    [authorizationId],
  );
  const row = rows[0];
  return row === undefined
    ? undefined
    : { reserved: BigInt(row.reserved), used: BigInt(row.used), totalCap: BigInt(row.total_cap) };
}

async function recorded(requestId: string) {
  const { rows } = await test.db.pool.query<{
    authorization_id: string | null;
    authorization_capped: boolean;
  }>("SELECT authorization_id, authorization_capped FROM inference_requests WHERE id = $1", [
    requestId,
  ]);
  return rows[0];
}

/** A reservation on `a`'s permit through `a`, capped when it has a total cap. */
function through(a: PermitAuthorization, overrides: Partial<ReserveInput> = {}): ReserveInput {
  return reservation({
    permitId: a.permitId,
    authorizationId: a.id,
    capped: a.totalCap !== 0n,
    deposit: 10n ** 9n,
    ...overrides,
  });
}

const use = async (a: PermitAuthorization) =>
  (await getPermitAuthorization(test.db.pool, a.id))!.use;

describe("an authorization's total cap, reserved like a deposit", () => {
  it("holds a capped request's maximum against the cap and keeps its charge as use when it closes", async () => {
    const a = await authorization({ totalCap: 2_500n });
    const first = through(a);
    expect(await reserve(test.db.pool, first)).toEqual({ ok: true });
    expect(await recorded(first.requestId)).toEqual({
      authorization_id: a.id,
      authorization_capped: true,
    });
    expect(await capLedger(a.id)).toEqual({ reserved: 1_000n, used: 0n, totalCap: 2_500n });
    expect(await use(a)).toEqual({ creditsUsed: 0n, creditsReserved: 1_000n, lastUsedAt: NOW });

    expect(await finalize(test.db.pool, completion(first.requestId, 400n))).toEqual({
      finalized: true,
      creditsCharged: 400n,
    });
    expect(await capLedger(a.id)).toEqual({ reserved: 0n, used: 400n, totalCap: 2_500n });
    // Exactly once: a second close changes nothing.
    await finalize(test.db.pool, completion(first.requestId, 900n));
    expect(await capLedger(a.id)).toEqual({ reserved: 0n, used: 400n, totalCap: 2_500n });
    expect(await use(a)).toEqual({ creditsUsed: 400n, creditsReserved: 0n, lastUsedAt: NOW });
  });

  it("refuses authorization_cap_exhausted the request that does not fit what is left, holding nothing of it, and admits it once a close frees enough", async () => {
    const a = await authorization({ totalCap: 2_500n });
    const [one, two, three] = [through(a), through(a), through(a)];
    expect(await reserve(test.db.pool, one)).toEqual({ ok: true });
    expect(await reserve(test.db.pool, two)).toEqual({ ok: true });
    // 2 500 - 2 000 held = 500 < 1 000: refused, with everything it did rolled back.
    expect(await reserve(test.db.pool, three)).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
    expect(await recorded(three.requestId)).toBeUndefined();
    expect(await getQuote(test.db.pool, three.quoteId)).toBeUndefined();
    expect(await permitLedger(test.db.pool, a.permitId)).toMatchObject({ reserved: 2_000n });
    expect(await capLedger(a.id)).toMatchObject({ reserved: 2_000n, used: 0n });

    // One closes charging 600: 2 500 - 1 000 held - 600 used = 900, still short.
    await finalize(test.db.pool, completion(one.requestId, 600n));
    const four = through(a);
    expect(await reserve(test.db.pool, four)).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
    // A request that fits exactly what is left is admitted (no false refusal).
    const exact = through(a, { maximumCredits: 900n });
    expect(await reserve(test.db.pool, exact)).toEqual({ ok: true });
    expect(await capLedger(a.id)).toMatchObject({ reserved: 1_900n, used: 600n });
    expect(await reserve(test.db.pool, through(a, { maximumCredits: 1n }))).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
  });

  it("a first request above the cap makes no ledger row and is refused", async () => {
    const a = await authorization({ totalCap: 999n });
    expect(await reserve(test.db.pool, through(a))).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
    expect(await capLedger(a.id)).toBeUndefined();
  });

  it("refuses a request marked capped through an authorization without a total cap", async () => {
    const a = await authorization();
    expect(await reserve(test.db.pool, through(a, { capped: true }))).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
    expect(await capLedger(a.id)).toBeUndefined();
  });

  it("releases a void close's, a voided reservation's and an orphan's whole reservation", async () => {
    const a = await authorization({ totalCap: 5_000n });
    const failed = through(a);
    const lost = through(a);
    const dead = id("instance");
    await heartbeat(test.db.pool, dead, NOW);
    const orphan = through(a, { instanceId: dead });
    for (const r of [failed, lost, orphan])
      expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    expect(await capLedger(a.id)).toMatchObject({ reserved: 3_000n, used: 0n });

    await finalize(test.db.pool, {
      ...completion(failed.requestId, 0n),
      status: "failed",
      billing: "void",
    });
    expect(await capLedger(a.id)).toMatchObject({ reserved: 2_000n, used: 0n });

    const voidClose = {
      requestId: lost.requestId,
      status: "failed" as const,
      inputTokens: 0n,
      outputTokens: 0n,
      creditsCharged: 0n,
      billing: "void" as const,
      usageSource: "gateway" as const,
      error: "reservation failed",
      now: NOW + 1,
    };
    expect(await voidReservation(test.db.pool, lost, voidClose)).toEqual({
      finalized: true,
      creditsCharged: 0n,
    });
    expect(await capLedger(a.id)).toMatchObject({ reserved: 1_000n, used: 0n });

    expect(await reconcileOrphans(test.db.pool, { now: NOW + 100, staleAfterSeconds: 30 })).toBe(1);
    expect(await capLedger(a.id)).toMatchObject({ reserved: 0n, used: 0n });
    expect(await use(a)).toMatchObject({ creditsUsed: 0n, creditsReserved: 0n });
  });

  it("a void written before the reservation lands makes it fail whole, its cap part too", async () => {
    const a = await authorization({ totalCap: 5_000n });
    const late = through(a);
    await voidReservation(test.db.pool, late, {
      requestId: late.requestId,
      status: "failed",
      inputTokens: 0n,
      outputTokens: 0n,
      creditsCharged: 0n,
      billing: "void",
      usageSource: "gateway",
      error: "reservation failed",
      now: NOW + 1,
    });
    await expect(reserve(test.db.pool, late)).rejects.toMatchObject({ code: "23505" });
    expect((await capLedger(a.id)) ?? { reserved: 0n }).toMatchObject({ reserved: 0n });
  });

  it("resizes a capped request's reservation with its maximum on failover, refusing a growth the cap cannot hold", async () => {
    const a = await authorization({ totalCap: 1_500n });
    const r = through(a);
    expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    const to = (maximumCredits: bigint) => ({
      requestId: r.requestId,
      offerId: hex32(),
      maximumCredits,
      tariffVersion: 1n,
      maxConcurrency: 10,
      deposit: 10n ** 9n,
      chainSettled: 0n,
    });
    expect(await switchOffer(test.db.pool, to(1_600n))).toBe(false);
    expect(await capLedger(a.id)).toMatchObject({ reserved: 1_000n });
    expect(await switchOffer(test.db.pool, to(1_500n))).toBe(true);
    expect(await capLedger(a.id)).toMatchObject({ reserved: 1_500n });
    expect(await switchOffer(test.db.pool, to(700n))).toBe(true);
    expect(await capLedger(a.id)).toMatchObject({ reserved: 700n });
    await finalize(test.db.pool, completion(r.requestId, 650n));
    expect(await capLedger(a.id)).toMatchObject({ reserved: 0n, used: 650n });
  });

  it("batched reservations and closes keep the cap the same way", async () => {
    const a = await authorization({ totalCap: 3_000n });
    const batcher = createLedgerBatcher(test.db.pool, { maxBatch: 8 });
    const items = Array.from({ length: 5 }, () => through(a));
    const results = await Promise.all(items.map((r) => batcher.reserve(r)));
    expect(results.filter((r) => r.ok)).toHaveLength(3);
    expect(results.filter((r) => !r.ok)).toEqual([
      { ok: false, reason: "authorization_cap_exhausted" },
      { ok: false, reason: "authorization_cap_exhausted" },
    ]);
    expect(await capLedger(a.id)).toMatchObject({ reserved: 3_000n, used: 0n });
    const admitted = items.filter((_, i) => results[i]!.ok);
    await Promise.all(
      admitted.map((r, i) => batcher.finalize(completion(r.requestId, BigInt(100 * (i + 1))))),
    );
    expect(await capLedger(a.id)).toEqual({ reserved: 0n, used: 600n, totalCap: 3_000n });
  });
});

describe("an authorization's periodic cap (issue 38, migration 039)", () => {
  const day = 86_400;
  const today = Math.floor(NOW / day) * day;
  /** The period's part of the cap's ledger row. */
  async function periodLedger(authorizationId: string) {
    const { rows } = await test.db.pool.query<{
      period_start: string;
      period_reserved: string;
      period_used: string;
      reserved: string;
      used: string;
    }>(
      `SELECT period_start, period_reserved, period_used, reserved, used
       FROM authorization_ledgers WHERE authorization_id = $1`,
      [authorizationId],
    );
    const row = rows[0]!;
    return {
      start: Number(row.period_start),
      reserved: BigInt(row.period_reserved),
      used: BigInt(row.period_used),
      total: { reserved: BigInt(row.reserved), used: BigInt(row.used) },
    };
  }
  const inPeriod = (a: PermitAuthorization, start: number, overrides: Partial<ReserveInput> = {}) =>
    through(a, { capped: true, periodStart: start, ...overrides });
  const periodOf = async (requestId: string) =>
    (
      await test.db.pool.query<{ p: string | null }>(
        "SELECT authorization_period_start::text AS p FROM inference_requests WHERE id = $1",
        [requestId],
      )
    ).rows[0]!.p;

  it("refuses with the period's code what the period cannot hold, and with the total's what the total cannot", async () => {
    const daily = await authorization({ period: "day", periodCap: 1_500n });
    expect(await reserve(test.db.pool, inPeriod(daily, today))).toEqual({ ok: true });
    expect(await reserve(test.db.pool, inPeriod(daily, today))).toEqual({
      ok: false,
      reason: "authorization_period_cap_exhausted",
    });
    // Above the cap from the first request: no row is made, the period's code still.
    const tiny = await authorization({ period: "week", periodCap: 10n });
    expect(await reserve(test.db.pool, inPeriod(tiny, today))).toEqual({
      ok: false,
      reason: "authorization_period_cap_exhausted",
    });
    const both = await authorization({ totalCap: 1_500n, period: "day", periodCap: 5_000n });
    expect(await reserve(test.db.pool, inPeriod(both, today))).toEqual({ ok: true });
    expect(await reserve(test.db.pool, inPeriod(both, today))).toEqual({
      ok: false,
      reason: "authorization_cap_exhausted",
    });
  });

  it("counts a request of a process whose clock is behind in the row's newer period, and records that period", async () => {
    const daily = await authorization({ period: "day", periodCap: 2_500n });
    const tomorrow = inPeriod(daily, today + day);
    expect(await reserve(test.db.pool, tomorrow)).toEqual({ ok: true });
    const late = inPeriod(daily, today);
    expect(await reserve(test.db.pool, late)).toEqual({ ok: true });
    expect(await periodOf(late.requestId)).toBe(String(today + day));
    expect(await periodLedger(daily.id)).toMatchObject({ start: today + day, reserved: 2_000n });
    expect(await reserve(test.db.pool, inPeriod(daily, today))).toEqual({
      ok: false,
      reason: "authorization_period_cap_exhausted",
    });
    await finalize(test.db.pool, completion(late.requestId, 300n));
    expect(await periodLedger(daily.id)).toMatchObject({ reserved: 1_000n, used: 300n });
  });

  it("resizes the period's reservation on failover while the period is the request's, and only the total's after a rollover", async () => {
    const daily = await authorization({ period: "day", periodCap: 1_500n });
    const r = inPeriod(daily, today);
    expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    const to = (maximumCredits: bigint) => ({
      requestId: r.requestId,
      offerId: hex32(),
      maximumCredits,
      tariffVersion: 1n,
      maxConcurrency: 10,
      deposit: 10n ** 9n,
      chainSettled: 0n,
    });
    expect(await switchOffer(test.db.pool, to(1_600n))).toBe(false);
    expect(await switchOffer(test.db.pool, to(1_500n))).toBe(true);
    expect(await periodLedger(daily.id)).toMatchObject({ reserved: 1_500n });
    expect(await switchOffer(test.db.pool, to(900n))).toBe(true);
    expect(await periodLedger(daily.id)).toMatchObject({ reserved: 900n });
    // The next day's first request rolls the row over: the open request's resize is the
    // total's alone, and its close charges the earlier day, not this one.
    const next = inPeriod(daily, today + day);
    expect(await reserve(test.db.pool, next)).toEqual({ ok: true });
    expect(await switchOffer(test.db.pool, to(1_200n))).toBe(true);
    expect(await periodLedger(daily.id)).toMatchObject({
      start: today + day,
      reserved: 1_000n,
      used: 0n,
      total: { reserved: 2_200n, used: 0n },
    });
    await finalize(test.db.pool, completion(r.requestId, 1_100n));
    expect(await periodLedger(daily.id)).toMatchObject({
      reserved: 1_000n,
      used: 0n,
      total: { reserved: 1_000n, used: 1_100n },
    });
  });
});

describe("an authorization's use, shown in its listing", () => {
  it("records the admitting authorization on an uncapped request too, and sums its charges", async () => {
    const a = await authorization({ perRequestCap: 5_000n });
    const [one, two, open] = [through(a), through(a), through(a, { createdAt: NOW + 7 })];
    for (const r of [one, two, open]) expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    expect(await recorded(one.requestId)).toEqual({
      authorization_id: a.id,
      authorization_capped: false,
    });
    await finalize(test.db.pool, completion(one.requestId, 120n));
    await finalize(test.db.pool, completion(two.requestId, 30n));
    // No cap ledger: its use is its requests'.
    expect(await capLedger(a.id)).toBeUndefined();
    const listed = (await listPermitAuthorizations(test.db.pool, apiKeyId)).find(
      (x) => x.id === a.id,
    );
    expect(listed?.use).toEqual({
      creditsUsed: 150n,
      creditsReserved: 1_000n,
      lastUsedAt: NOW + 7,
    });
    // Never used: nothing, and no last use.
    const idle = await authorization();
    expect(await use(idle)).toEqual({ creditsUsed: 0n, creditsReserved: 0n, lastUsedAt: null });
  });
});
