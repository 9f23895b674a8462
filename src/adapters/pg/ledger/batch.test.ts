import type pg from "pg";
import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../../test/helpers/db.js";
import {
  completion,
  hex32,
  newQuote,
  reservation,
  offerInFlight,
} from "../../../../test/helpers/ledger.js";
import {
  createLedgerBatcher,
  LedgerItemError,
  permitLedger,
  reserve,
  type FinalizeInput,
  type LedgerBatcher,
  type ReserveInput,
} from "./index.js";
import { getQuote, insertQuote } from "../quotes.js";
import { getRequest } from "../requests.js";

// The batched ledger (migration 006) on whichever database the tests run on: what a batch
// commits, and that each item of it keeps the semantics of a single reserve/finalize.

const test = useTestDatabase();

function inFlight(offerId: Hex): Promise<number> {
  return offerInFlight(test.db.pool, offerId);
}

async function requestExists(requestId: string): Promise<boolean> {
  const { rows } = await test.db.pool.query("SELECT 1 FROM inference_requests WHERE id = $1", [
    requestId,
  ]);
  return rows.length === 1;
}

async function permitRowExists(permitId: Hex): Promise<boolean> {
  const { rows } = await test.db.pool.query("SELECT 1 FROM permit_ledgers WHERE permit_id = $1", [
    permitId.toLowerCase(),
  ]);
  return rows.length === 1;
}

/**
 * Submits `opener` and then, while its batch (of one) is in flight, all of `items`, which
 * therefore go together as the next batch; checks that they did.
 */
async function inOneBatch<I, R>(
  batcher: LedgerBatcher,
  kind: "reserve" | "finalize",
  submit: (item: I) => Promise<R>,
  opener: I,
  items: readonly I[],
): Promise<PromiseSettledResult<R>[]> {
  const before = batcher.stats()[kind];
  const results = Promise.allSettled([opener, ...items].map(submit));
  expect(batcher.stats()[kind]).toMatchObject({ queued: items.length, inFlight: 1 });
  const settled = await results;
  expect(batcher.stats()[kind]).toMatchObject({
    batches: before.batches + 2,
    items: before.items + 1 + items.length,
  });
  return settled.slice(1);
}

const value = <R>(settled: PromiseSettledResult<R> | undefined): R => {
  if (settled?.status !== "fulfilled") throw new Error(`not fulfilled: ${String(settled)}`);
  return settled.value;
};

describe("batched reservations", () => {
  it("commits the accepted items and leaves no trace of the refused or failed ones", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const opener = reservation();
    const permitId = hex32();
    const offerId = hex32();
    const shared = { permitId, offerId, deposit: 2_500n, maxConcurrency: 3 };
    const a = reservation(shared);
    const b = reservation(shared);
    // Only 500 credits left once a and b are in.
    const poor = reservation(shared);
    const c = reservation({ offerId, maxConcurrency: 3 });
    // a, b and c hold the offer's three slots.
    const full = reservation({ offerId, maxConcurrency: 3 });
    const reused = reservation({ quoteId: opener.quoteId, quote: undefined });
    // A permit never seen, whose deposit covers nothing.
    const broke = reservation({ deposit: 999n });
    const duplicate = reservation({ requestId: a.requestId });
    const last = reservation({ permitId: full.permitId });

    const settled = await inOneBatch(
      batcher,
      "reserve",
      (x: ReserveInput) => batcher.reserve(x),
      opener,
      [a, b, poor, c, full, reused, broke, duplicate, last],
    );
    expect(settled.slice(0, 7).map(value)).toEqual([
      { ok: true },
      { ok: true },
      { ok: false, reason: "insufficient_credits" },
      { ok: true },
      { ok: false, reason: "offer_at_capacity" },
      { ok: false, reason: "quote_used" },
      { ok: false, reason: "insufficient_credits" },
    ]);
    const failed = settled[7];
    expect(failed?.status).toBe("rejected");
    const error = (failed as PromiseRejectedResult).reason as LedgerItemError;
    expect(error).toBeInstanceOf(LedgerItemError);
    expect(error.code).toBe("23505");
    expect(value(settled[8])).toEqual({ ok: true });

    // The accepted ones hold what they reserved.
    expect(await permitLedger(test.db.pool, permitId)).toEqual({
      reserved: 2_000n,
      charged: 0n,
      settled: 0n,
      unsettleable: 0n,
    });
    expect(await inFlight(offerId)).toBe(3);
    for (const x of [a, b, c, last]) {
      expect(await getRequest(test.db.pool, x.requestId, "key_a")).toMatchObject({
        status: "pending",
        permitId: x.permitId,
        offerId: x.offerId,
      });
      expect((await getQuote(test.db.pool, x.quoteId))?.usedBy).toBe(x.requestId);
    }
    expect(await permitLedger(test.db.pool, last.permitId)).toMatchObject({ reserved: 1_000n });

    // The refused and failed ones: no request, no quote stored, no slot, no reservation.
    for (const x of [poor, full, broke, duplicate]) {
      expect(await getQuote(test.db.pool, x.quoteId)).toBeUndefined();
    }
    for (const x of [poor, full, reused, broke])
      expect(await requestExists(x.requestId)).toBe(false);
    expect((await getRequest(test.db.pool, a.requestId, "key_a"))?.permitId).toBe(a.permitId);
    expect((await getQuote(test.db.pool, opener.quoteId))?.usedBy).toBe(opener.requestId);
    for (const x of [reused, duplicate]) {
      expect(await inFlight(x.offerId)).toBe(0);
      expect(await permitLedger(test.db.pool, x.permitId)).toMatchObject({ reserved: 0n });
    }
    expect(await permitRowExists(broke.permitId)).toBe(false);
    expect(await permitLedger(test.db.pool, full.permitId)).toMatchObject({ reserved: 1_000n });
  });

  it("processes the items in order: a quote is consumed by the first item that names it", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const quote = newQuote({ internal: false });
    await insertQuote(test.db.pool, quote);
    const base = { quoteId: quote.quoteId, quote: undefined, offerId: quote.offerId };
    const first = reservation(base);
    const second = reservation(base);
    // An internal quote, then a reservation naming it in the same batch.
    const own = reservation();
    const naming = reservation({ quoteId: own.quoteId, quote: undefined });
    const settled = await inOneBatch(
      batcher,
      "reserve",
      (x: ReserveInput) => batcher.reserve(x),
      reservation(),
      [first, second, own, naming],
    );
    expect(settled.map(value)).toEqual([
      { ok: true },
      { ok: false, reason: "quote_used" },
      { ok: true },
      { ok: false, reason: "quote_used" },
    ]);
    expect((await getQuote(test.db.pool, quote.quoteId))?.usedBy).toBe(first.requestId);
    expect(await inFlight(quote.offerId)).toBe(1);
  });

  it("admits what the single reserve admits alongside it", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const permitId = hex32();
    const single = reservation({ permitId, deposit: 3_000n });
    expect(await reserve(test.db.pool, single)).toEqual({ ok: true });
    const more = [1, 2, 3].map(() => reservation({ permitId, deposit: 3_000n }));
    const results = await Promise.all(more.map((x) => batcher.reserve(x)));
    expect(results.map((r) => r.ok)).toEqual([true, true, false]);
    expect(await permitLedger(test.db.pool, permitId)).toMatchObject({ reserved: 3_000n });
  });

  it("checks its inputs as reserve does, before touching the database", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    await expect(batcher.reserve(reservation({ maximumCredits: -1n }))).rejects.toThrow(RangeError);
    await expect(batcher.reserve(reservation({ quoteId: "qt_other" }))).rejects.toThrow(
      "quote.quoteId differs",
    );
    await expect(batcher.finalize({ ...completion("req_x", 1n), billing: "void" })).rejects.toThrow(
      RangeError,
    );
    expect(batcher.stats().reserve.batches).toBe(0);
    expect(batcher.stats().finalize.batches).toBe(0);
    expect(() => createLedgerBatcher(test.db.pool, { maxBatch: 65 })).toThrow(RangeError);
  });

  it("fails every item of a batch whose call fails", async () => {
    const lost = new Error("Connection terminated unexpectedly");
    const broken = {
      query: () => Promise.reject(lost),
    } as unknown as pg.Pool;
    const batcher = createLedgerBatcher(broken);
    const results = await Promise.allSettled([
      batcher.reserve(reservation()),
      batcher.reserve(reservation()),
      batcher.finalize(completion("req_y", 1n)),
    ]);
    expect(results).toEqual([
      { status: "rejected", reason: lost },
      { status: "rejected", reason: lost },
      { status: "rejected", reason: lost },
    ]);
  });
});

describe("batched finalisations", () => {
  it("finalizes each request once, with duplicates in one batch and across batches", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const permitId = hex32();
    const offerId = hex32();
    const inputs = [0, 1, 2, 3].map(() => reservation({ permitId, offerId }));
    for (const x of inputs) expect(await reserve(test.db.pool, x)).toEqual({ ok: true });
    const [r0, r1, r2, r3] = inputs.map((x) => x.requestId) as [string, string, string, string];

    const settled = await inOneBatch(
      batcher,
      "finalize",
      (x: FinalizeInput) => batcher.finalize(x),
      completion(r0, 100n),
      [
        completion(r1, 200n),
        { ...completion(r1, 700n), status: "cancelled", billing: "partial" },
        completion(r0, 900n),
        completion(r2, 5_000n),
        completion("req_missing", 1n),
        completion(r2, 1n),
      ],
    );
    expect(settled.map(value)).toEqual([
      { finalized: true, creditsCharged: 200n },
      { finalized: false, creditsCharged: 200n },
      { finalized: false, creditsCharged: 100n },
      { finalized: true, creditsCharged: 1_000n },
      { finalized: false, creditsCharged: 0n },
      { finalized: false, creditsCharged: 1_000n },
    ]);
    expect(await getRequest(test.db.pool, r1, "key_a")).toMatchObject({
      status: "completed",
      billing: "billed",
      creditsCharged: 200n,
    });

    // And again, in later batches.
    const again = await Promise.all([
      batcher.finalize(completion(r1, 300n)),
      batcher.finalize(completion(r3, 300n)),
      batcher.finalize(completion(r3, 400n)),
    ]);
    expect(again).toEqual([
      { finalized: false, creditsCharged: 200n },
      { finalized: true, creditsCharged: 300n },
      { finalized: false, creditsCharged: 300n },
    ]);
    expect(await permitLedger(test.db.pool, permitId)).toEqual({
      reserved: 0n,
      charged: 100n + 200n + 1_000n + 300n,
      settled: 0n,
      unsettleable: 0n,
    });
    expect(await inFlight(offerId)).toBe(0);
  });

  it("records each item's usage details with its close (migration 018)", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const inputs = [0, 1, 2].map(() => reservation());
    for (const x of inputs) expect(await reserve(test.db.pool, x)).toEqual({ ok: true });
    const [r0, r1, r2] = inputs.map((x) => x.requestId) as [string, string, string];
    const settled = await inOneBatch(
      batcher,
      "finalize",
      (x: FinalizeInput) => batcher.finalize(x),
      { ...completion(r0, 100n), cachedInputTokens: 7n, reasoningTokens: 3n },
      [
        { ...completion(r1, 200n), cachedInputTokens: 90n, reasoningTokens: 150n },
        completion(r2, 300n),
        // A second close of r1 changes nothing, its details neither.
        { ...completion(r1, 1n), cachedInputTokens: 1n, reasoningTokens: 1n },
      ],
    );
    expect(settled.map(value)).toEqual([
      { finalized: true, creditsCharged: 200n },
      { finalized: true, creditsCharged: 300n },
      { finalized: false, creditsCharged: 200n },
    ]);
    const details = async (id: string) => {
      const r = await getRequest(test.db.pool, id, "key_a");
      return [r?.cachedInputTokens, r?.reasoningTokens];
    };
    expect(await details(r0)).toEqual([7n, 3n]);
    expect(await details(r1)).toEqual([90n, 150n]);
    expect(await details(r2)).toEqual([0n, 0n]);
  });

  it("records each item's claim and count with its close (migration 026)", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const inputs = [0, 1, 2].map(() => reservation());
    for (const x of inputs) expect(await reserve(test.db.pool, x)).toEqual({ ok: true });
    const [r0, r1, r2] = inputs.map((x) => x.requestId) as [string, string, string];
    const figures = (input: bigint, output: bigint) => ({
      inputTokens: input,
      outputTokens: output,
      cachedInputTokens: 1n,
      reasoningTokens: 2n,
    });
    await inOneBatch(
      batcher,
      "finalize",
      (x: FinalizeInput) => batcher.finalize(x),
      { ...completion(r0, 100n), claimed: figures(90n, 150n), counted: figures(88n, 151n) },
      [
        { ...completion(r1, 200n), counted: figures(5n, 6n) },
        completion(r2, 300n),
        // A second close of r1 changes nothing, its figures neither.
        { ...completion(r1, 1n), claimed: figures(9n, 9n), counted: figures(9n, 9n) },
      ],
    );
    const both = async (id: string) => {
      const r = await getRequest(test.db.pool, id, "key_a");
      return [r?.claimed, r?.counted];
    };
    expect(await both(r0)).toEqual([figures(90n, 150n), figures(88n, 151n)]);
    expect(await both(r1)).toEqual([null, figures(5n, 6n)]);
    expect(await both(r2)).toEqual([null, null]);
  });

  it("rolls back only the item that fails", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const healthy = reservation();
    const damaged = reservation();
    for (const x of [healthy, damaged])
      expect(await reserve(test.db.pool, x)).toEqual({ ok: true });
    // A hand edit the ledger cannot survive: the request's offer slot is gone.
    await test.db.pool.query("DELETE FROM offer_loads WHERE offer_id = $1", [
      damaged.offerId.toLowerCase(),
    ]);
    const settled = await inOneBatch(
      batcher,
      "finalize",
      (x: FinalizeInput) => batcher.finalize(x),
      completion(reservation().requestId, 1n),
      [completion(damaged.requestId, 10n), completion(healthy.requestId, 20n)],
    );
    expect(settled[0]?.status).toBe("rejected");
    const error = (settled[0] as PromiseRejectedResult).reason as LedgerItemError;
    expect(error).toBeInstanceOf(LedgerItemError);
    expect(error.message).toMatch(/ledger inconsistency: offer load .* is missing/);
    expect(value(settled[1])).toEqual({ finalized: true, creditsCharged: 20n });
    expect((await getRequest(test.db.pool, damaged.requestId, "key_a"))?.status).toBe("pending");
    expect(await permitLedger(test.db.pool, damaged.permitId)).toMatchObject({
      reserved: 1_000n,
      charged: 0n,
    });
    expect(await permitLedger(test.db.pool, healthy.permitId)).toMatchObject({
      reserved: 0n,
      charged: 20n,
    });
  });
});

describe("the batch functions", () => {
  it("leave no row lock behind on the rows their items wrote (no MultiXact per item)", async () => {
    const batcher = createLedgerBatcher(test.db.pool);
    const permitId = hex32();
    const offerId = hex32();
    const quote = newQuote({ internal: false, offerId });
    await insertQuote(test.db.pool, quote);
    const inputs = [
      reservation({ quoteId: quote.quoteId, quote: undefined, permitId, offerId }),
      ...[1, 2, 3, 4].map(() => reservation({ permitId, offerId })),
    ];
    const reserved = await inOneBatch(
      batcher,
      "reserve",
      (x: ReserveInput) => batcher.reserve(x),
      reservation({ permitId, offerId }),
      inputs,
    );
    expect(reserved.map(value).every((r) => r.ok)).toBe(true);
    // An explicit lock (FOR UPDATE, or an upsert's) taken by the batch or by an item would stay
    // on the newest version of the row, and each later item's write would then have to record
    // it together with its own as a MultiXact.
    const xmax = async (): Promise<string[]> => {
      const { rows } = await test.db.pool.query<{ xmax: string }>(
        `SELECT xmax::text FROM permit_ledgers WHERE permit_id = $1
         UNION ALL SELECT xmax::text FROM offer_loads WHERE offer_id = $2
         UNION ALL SELECT xmax::text FROM quotes WHERE quote_id = $3`,
        [permitId.toLowerCase(), offerId.toLowerCase(), quote.quoteId],
      );
      return rows.map((r) => r.xmax);
    };
    expect(await xmax()).toEqual(["0", "0", "0"]);

    const closed = await inOneBatch(
      batcher,
      "finalize",
      (x: FinalizeInput) => batcher.finalize(x),
      completion(reservation().requestId, 1n),
      inputs.map((x) => completion(x.requestId, 10n)),
    );
    expect(closed.map(value).every((r) => r.finalized)).toBe(true);
    expect((await xmax()).slice(0, 2)).toEqual(["0", "0"]);
    const { rows } = await test.db.pool.query<{ xmax: string }>(
      "SELECT xmax::text FROM inference_requests WHERE id = ANY($1)",
      [inputs.map((x) => x.requestId)],
    );
    expect(rows.map((r) => r.xmax)).toEqual(inputs.map(() => "0"));
  });

  it("refuse to run under another isolation level than READ COMMITTED", async () => {
    const client = await test.db.pool.connect();
    try {
      for (const fn of ["gw_batch_reserve", "gw_close_batch"]) {
        await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
        await expect(client.query(`SELECT * FROM ${fn}('[]'::jsonb)`)).rejects.toThrow(
          "needs READ COMMITTED",
        );
        await client.query("ROLLBACK");
      }
    } finally {
      client.release();
    }
  });
});
