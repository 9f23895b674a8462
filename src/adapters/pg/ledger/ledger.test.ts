import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../../test/helpers/db.js";
import {
  completion,
  hex32,
  id,
  newQuote,
  NOW,
  reservation,
  offerInFlight,
} from "../../../../test/helpers/ledger.js";
import {
  availableCredits,
  finalize,
  heartbeat,
  markStreaming,
  permitLedger,
  reconcileOrphans,
  recordOfferFlag,
  reserve,
  switchOffer,
  voidReservation,
} from "./index.js";
import { getQuote, insertQuote } from "../quotes.js";
import { getRequest } from "../requests.js";

const test = useTestDatabase();

function inFlight(offerId: Hex): Promise<number> {
  return offerInFlight(test.db.pool, offerId);
}

async function count(table: string, where: string, param: string): Promise<number> {
  const { rows } = await test.db.pool.query<{ n: string }>(
    `SELECT count(*) AS n FROM ${table} WHERE ${where} = $1`,
    [param],
  );
  return Number(rows[0]?.n);
}

describe("reserve and finalize", () => {
  it("reserves the maximum, then turns it into the charge and frees the slot", async () => {
    const input = reservation({ stream: true });
    expect(await reserve(test.db.pool, input)).toEqual({ ok: true });

    expect(await permitLedger(test.db.pool, input.permitId)).toEqual({
      reserved: 1_000n,
      charged: 0n,
      settled: 0n,
      unsettleable: 0n,
    });
    expect(await inFlight(input.offerId)).toBe(1);
    expect((await getQuote(test.db.pool, input.quoteId))?.usedBy).toBe(input.requestId);
    const pending = await getRequest(test.db.pool, input.requestId, "key_a");
    expect(pending).toMatchObject({
      id: input.requestId,
      status: "pending",
      stream: true,
      maximumCredits: 1_000n,
      inputTokens: 100n,
      creditsCharged: null,
      billing: null,
      offerId: input.offerId,
      permitId: input.permitId,
      createdAt: NOW,
      completedAt: null,
    });

    expect(await markStreaming(test.db.pool, input.requestId)).toBe(true);
    expect(await markStreaming(test.db.pool, input.requestId)).toBe(false);
    expect((await getRequest(test.db.pool, input.requestId, "key_a"))?.status).toBe("streaming");

    expect(await finalize(test.db.pool, completion(input.requestId, 420n))).toEqual({
      finalized: true,
      creditsCharged: 420n,
    });
    expect(await permitLedger(test.db.pool, input.permitId)).toEqual({
      reserved: 0n,
      charged: 420n,
      settled: 0n,
      unsettleable: 0n,
    });
    expect(await inFlight(input.offerId)).toBe(0);
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      status: "completed",
      inputTokens: 90n,
      outputTokens: 150n,
      maximumCredits: 1_000n,
      creditsCharged: 420n,
      billing: "billed",
      usageSource: "provider",
      error: null,
      completedAt: NOW + 5,
      settlementStatus: "unsettled",
    });
  });

  it("shows a request only to the API key that made it", async () => {
    const input = reservation();
    await reserve(test.db.pool, input);
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toBeDefined();
    expect(await getRequest(test.db.pool, input.requestId, "key_b")).toBeUndefined();
    expect(await getRequest(test.db.pool, "req_missing", "key_a")).toBeUndefined();
  });

  it("refuses insufficient credits and writes nothing", async () => {
    const first = reservation({ deposit: 1_500n });
    expect(await reserve(test.db.pool, first)).toEqual({ ok: true });

    const second = reservation({ permitId: first.permitId, deposit: 1_500n });
    expect(await reserve(test.db.pool, second)).toEqual({
      ok: false,
      reason: "insufficient_credits",
    });
    expect(await permitLedger(test.db.pool, first.permitId)).toMatchObject({ reserved: 1_000n });
    expect(await inFlight(second.offerId)).toBe(0);
    expect(await getQuote(test.db.pool, second.quoteId)).toBeUndefined();
    expect(await count("inference_requests", "id", second.requestId)).toBe(0);

    // A permit never seen before, whose deposit is too small: no ledger row either.
    const fresh = reservation({ deposit: 999n });
    expect(await reserve(test.db.pool, fresh)).toEqual({
      ok: false,
      reason: "insufficient_credits",
    });
    expect(await count("permit_ledgers", "permit_id", fresh.permitId)).toBe(0);
  });

  it("admits exactly the deposit", async () => {
    const first = reservation({ deposit: 2_000n });
    const second = reservation({ permitId: first.permitId, deposit: 2_000n });
    expect(await reserve(test.db.pool, first)).toEqual({ ok: true });
    expect(await reserve(test.db.pool, second)).toEqual({ ok: true });
    expect(await permitLedger(test.db.pool, first.permitId)).toMatchObject({ reserved: 2_000n });
  });

  it("counts charges against the deposit once the reservation is released", async () => {
    const first = reservation({ deposit: 1_500n });
    await reserve(test.db.pool, first);
    await finalize(test.db.pool, completion(first.requestId, 600n));
    // 1500 - 600 charged = 900 left: a 1000 maximum no longer fits, 900 does.
    const tooBig = reservation({ permitId: first.permitId, deposit: 1_500n });
    expect(await reserve(test.db.pool, tooBig)).toMatchObject({ ok: false });
    const fits = reservation({ permitId: first.permitId, deposit: 1_500n, maximumCredits: 900n });
    expect(await reserve(test.db.pool, fits)).toEqual({ ok: true });
  });

  it("refuses an offer at capacity and writes nothing", async () => {
    const first = reservation({ maxConcurrency: 1 });
    expect(await reserve(test.db.pool, first)).toEqual({ ok: true });
    const second = reservation({ offerId: first.offerId, maxConcurrency: 1 });
    expect(await reserve(test.db.pool, second)).toEqual({
      ok: false,
      reason: "offer_at_capacity",
    });
    expect(await inFlight(first.offerId)).toBe(1);
    expect(await permitLedger(test.db.pool, second.permitId)).toMatchObject({ reserved: 0n });
    expect(await getQuote(test.db.pool, second.quoteId)).toBeUndefined();

    // The slot comes back when the first request ends.
    await finalize(test.db.pool, completion(first.requestId, 1n));
    const third = reservation({ offerId: first.offerId, maxConcurrency: 1 });
    expect(await reserve(test.db.pool, third)).toEqual({ ok: true });

    // max_concurrency 0 admits nothing, even on an offer never seen before.
    const none = reservation({ maxConcurrency: 0 });
    expect(await reserve(test.db.pool, none)).toEqual({ ok: false, reason: "offer_at_capacity" });
  });

  it("uses a quote once", async () => {
    const quote = newQuote({ internal: false });
    await insertQuote(test.db.pool, quote);
    expect(await getQuote(test.db.pool, quote.quoteId)).toEqual({ ...quote, usedBy: null });

    const base = { quoteId: quote.quoteId, quote: undefined, offerId: quote.offerId };
    const first = reservation({ ...base, requestId: id("req") });
    expect(await reserve(test.db.pool, first)).toEqual({ ok: true });
    const second = reservation({ ...base, requestId: id("req") });
    expect(await reserve(test.db.pool, second)).toEqual({ ok: false, reason: "quote_used" });
    expect(await inFlight(quote.offerId)).toBe(1);
    expect(await permitLedger(test.db.pool, second.permitId)).toMatchObject({ reserved: 0n });
    expect((await getQuote(test.db.pool, quote.quoteId))?.usedBy).toBe(first.requestId);

    // A refused reservation leaves its quote unused, so it can be used again.
    const small = newQuote();
    await insertQuote(test.db.pool, small);
    const refused = reservation({ quoteId: small.quoteId, quote: undefined, deposit: 1n });
    expect(await reserve(test.db.pool, refused)).toMatchObject({ ok: false });
    expect((await getQuote(test.db.pool, small.quoteId))?.usedBy).toBeNull();
  });

  it("finalizes once: the second finalize changes nothing", async () => {
    const input = reservation();
    await reserve(test.db.pool, input);
    expect(await finalize(test.db.pool, completion(input.requestId, 300n))).toEqual({
      finalized: true,
      creditsCharged: 300n,
    });
    const before = await getRequest(test.db.pool, input.requestId, "key_a");
    const again = await finalize(test.db.pool, {
      ...completion(input.requestId, 700n),
      status: "cancelled",
      billing: "partial",
    });
    expect(again).toEqual({ finalized: false, creditsCharged: 300n });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toEqual(before);
    expect(await permitLedger(test.db.pool, input.permitId)).toEqual({
      reserved: 0n,
      charged: 300n,
      settled: 0n,
      unsettleable: 0n,
    });
    expect(await inFlight(input.offerId)).toBe(0);
    expect(await finalize(test.db.pool, completion("req_missing", 1n))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
  });

  it("records the usage details with the close, once, and none when none are given", async () => {
    const input = reservation();
    await reserve(test.db.pool, input);
    const open = await getRequest(test.db.pool, input.requestId, "key_a");
    expect(open).toMatchObject({ cachedInputTokens: 0n, reasoningTokens: 0n });
    await finalize(test.db.pool, {
      ...completion(input.requestId, 300n),
      cachedInputTokens: 60n,
      reasoningTokens: 40n,
    });
    const closed = await getRequest(test.db.pool, input.requestId, "key_a");
    expect(closed).toMatchObject({
      inputTokens: 90n,
      outputTokens: 150n,
      cachedInputTokens: 60n,
      reasoningTokens: 40n,
      creditsCharged: 300n,
    });
    // A second close (a retry, the orphan rule) leaves them as they are.
    await finalize(test.db.pool, {
      ...completion(input.requestId, 1n),
      cachedInputTokens: 1n,
      reasoningTokens: 1n,
    });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toEqual(closed);

    const plain = reservation();
    await reserve(test.db.pool, plain);
    await finalize(test.db.pool, completion(plain.requestId, 300n));
    expect(await getRequest(test.db.pool, plain.requestId, "key_a")).toMatchObject({
      cachedInputTokens: 0n,
      reasoningTokens: 0n,
    });
    await expect(
      finalize(test.db.pool, { ...completion("req_x", 1n), reasoningTokens: -1n }),
    ).rejects.toThrow(RangeError);
  });

  it("records the provider's claim and the gateway's count with the close (migration 026)", async () => {
    const claimed = {
      inputTokens: 3_550n,
      outputTokens: 2_000n,
      cachedInputTokens: 0n,
      reasoningTokens: 0n,
    };
    const counted = {
      inputTokens: 12n,
      outputTokens: 5n,
      cachedInputTokens: 0n,
      reasoningTokens: 0n,
    };
    const input = reservation();
    await reserve(test.db.pool, input);
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      claimed: null,
      counted: null,
    });
    await finalize(test.db.pool, {
      ...completion(input.requestId, 300n),
      inputTokens: 12n,
      outputTokens: 5n,
      usageSource: "gateway",
      claimed,
      counted,
    });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      inputTokens: 12n,
      outputTokens: 5n,
      usageSource: "gateway",
      claimed,
      counted,
    });
    // Figures past 2^64 survive (numeric(78, 0)); a count without a claim reads back so.
    const big = reservation();
    await reserve(test.db.pool, big);
    const huge = { ...counted, outputTokens: 2n ** 70n, reasoningTokens: 7n };
    await finalize(test.db.pool, { ...completion(big.requestId, 300n), counted: huge });
    expect(await getRequest(test.db.pool, big.requestId, "key_a")).toMatchObject({
      claimed: null,
      counted: huge,
    });
    // Neither: a void close (nothing counted) keeps none.
    const none = reservation();
    await reserve(test.db.pool, none);
    await finalize(test.db.pool, {
      ...completion(none.requestId, 0n),
      status: "failed",
      billing: "void",
      usageSource: "gateway",
    });
    expect(await getRequest(test.db.pool, none.requestId, "key_a")).toMatchObject({
      claimed: null,
      counted: null,
    });
    await expect(
      finalize(test.db.pool, {
        ...completion("req_x", 1n),
        claimed: { ...claimed, cachedInputTokens: -1n },
      }),
    ).rejects.toThrow(RangeError);
  });

  it("clamps a charge above the maximum", async () => {
    const input = reservation({ maximumCredits: 500n });
    await reserve(test.db.pool, input);
    expect(await finalize(test.db.pool, completion(input.requestId, 10_000n))).toEqual({
      finalized: true,
      creditsCharged: 500n,
    });
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({
      reserved: 0n,
      charged: 500n,
    });
    expect((await getRequest(test.db.pool, input.requestId, "key_a"))?.creditsCharged).toBe(500n);
  });

  it("records a void request as charged nothing and not to be settled", async () => {
    const input = reservation();
    await reserve(test.db.pool, input);
    const result = await finalize(test.db.pool, {
      ...completion(input.requestId, 0n),
      status: "failed",
      billing: "void",
      error: "upstream_error",
    });
    expect(result).toEqual({ finalized: true, creditsCharged: 0n });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      status: "failed",
      billing: "void",
      creditsCharged: 0n,
      error: "upstream_error",
      settlementStatus: "none",
    });
    await expect(
      finalize(test.db.pool, { ...completion(input.requestId, 1n), billing: "void" }),
    ).rejects.toThrow(RangeError);
  });

  it("rejects negative amounts before touching the database", async () => {
    await expect(reserve(test.db.pool, reservation({ maximumCredits: -1n }))).rejects.toThrow(
      RangeError,
    );
    await expect(finalize(test.db.pool, completion("req_x", -1n))).rejects.toThrow(RangeError);
  });

  it("stores the internal quote with the reservation", async () => {
    const input = reservation();
    await reserve(test.db.pool, input);
    expect(await getQuote(test.db.pool, input.quoteId)).toEqual({
      ...input.quote,
      usedBy: input.requestId,
    });
  });
});

describe("chain settlements", () => {
  it("counts what settled on chain beyond the gateway's own settlements", async () => {
    const permitId = hex32();
    // Nothing reserved or charged here, but 600 settled on chain (another gateway, say).
    const refused = reservation({ permitId, deposit: 1_500n, chainSettled: 600n });
    expect(await reserve(test.db.pool, refused)).toEqual({
      ok: false,
      reason: "insufficient_credits",
    });
    const fits = reservation({
      permitId,
      deposit: 1_500n,
      chainSettled: 600n,
      maximumCredits: 900n,
    });
    expect(await reserve(test.db.pool, fits)).toEqual({ ok: true });
    await finalize(test.db.pool, completion(fits.requestId, 400n));

    // The gateway settles its 400: on chain that is 1000 settled, of which 400 are ours.
    await test.db.pool.query("UPDATE permit_ledgers SET settled = 400 WHERE permit_id = $1", [
      permitId,
    ]);
    const ledger = await permitLedger(test.db.pool, permitId);
    expect(ledger).toEqual({ reserved: 0n, charged: 400n, settled: 400n, unsettleable: 0n });
    // 1500 - (400 charged + (1000 - 400) beyond ours) = 500 available.
    expect(availableCredits(ledger, 1_500n, 1_000n)).toBe(500n);
    const tooBig = reservation({
      permitId,
      deposit: 1_500n,
      chainSettled: 1_000n,
      maximumCredits: 501n,
    });
    expect(await reserve(test.db.pool, tooBig)).toMatchObject({ ok: false });
    const exact = reservation({
      permitId,
      deposit: 1_500n,
      chainSettled: 1_000n,
      maximumCredits: 500n,
    });
    expect(await reserve(test.db.pool, exact)).toEqual({ ok: true });
  });

  it("does not count our own settlement twice while the chain lags behind it", async () => {
    const permitId = hex32();
    const first = reservation({ permitId, deposit: 1_000n, maximumCredits: 400n });
    await reserve(test.db.pool, first);
    await finalize(test.db.pool, completion(first.requestId, 400n));
    await test.db.pool.query("UPDATE permit_ledgers SET settled = 400 WHERE permit_id = $1", [
      permitId,
    ]);
    // The chain still reads 0 settled: available is 1000 - 400, not less.
    const next = reservation({ permitId, deposit: 1_000n, chainSettled: 0n, maximumCredits: 600n });
    expect(await reserve(test.db.pool, next)).toEqual({ ok: true });
  });
});

describe("switchOffer", () => {
  it("moves the slot and resizes the reservation", async () => {
    const input = reservation({ deposit: 3_000n });
    await reserve(test.db.pool, input);
    const other = hex32();

    expect(
      await switchOffer(test.db.pool, {
        requestId: input.requestId,
        offerId: other,
        maximumCredits: 2_500n,
        tariffVersion: 7n,
        maxConcurrency: 4,
        deposit: 3_000n,
        chainSettled: 0n,
      }),
    ).toBe(true);
    expect(await inFlight(input.offerId)).toBe(0);
    expect(await inFlight(other)).toBe(1);
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({ reserved: 2_500n });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      offerId: other,
      maximumCredits: 2_500n,
      tariffVersion: 7n,
    });

    // Shrinking releases the difference.
    expect(
      await switchOffer(test.db.pool, {
        requestId: input.requestId,
        offerId: input.offerId,
        maximumCredits: 800n,
        tariffVersion: 1n,
        maxConcurrency: 4,
        deposit: 3_000n,
        chainSettled: 0n,
      }),
    ).toBe(true);
    expect(await inFlight(input.offerId)).toBe(1);
    expect(await inFlight(other)).toBe(0);
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({ reserved: 800n });

    expect(await finalize(test.db.pool, completion(input.requestId, 5_000n))).toEqual({
      finalized: true,
      creditsCharged: 800n,
    });
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({
      reserved: 0n,
      charged: 800n,
    });
    expect(await inFlight(input.offerId)).toBe(0);
  });

  it("changes nothing when the new offer is full or the credits do not cover it", async () => {
    const input = reservation({ deposit: 2_000n });
    await reserve(test.db.pool, input);
    const full = reservation({ maxConcurrency: 1 });
    await reserve(test.db.pool, full);
    const base = {
      requestId: input.requestId,
      tariffVersion: 2n,
      deposit: 2_000n,
      chainSettled: 0n,
    };

    expect(
      await switchOffer(test.db.pool, {
        ...base,
        offerId: full.offerId,
        maximumCredits: 1_000n,
        maxConcurrency: 1,
      }),
    ).toBe(false);
    expect(
      await switchOffer(test.db.pool, {
        ...base,
        offerId: hex32(),
        maximumCredits: 2_001n,
        maxConcurrency: 5,
      }),
    ).toBe(false);
    expect(await inFlight(input.offerId)).toBe(1);
    expect(await inFlight(full.offerId)).toBe(1);
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({ reserved: 1_000n });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      offerId: input.offerId,
      maximumCredits: 1_000n,
      tariffVersion: 1n,
    });

    // Not after the first byte.
    await markStreaming(test.db.pool, input.requestId);
    expect(
      await switchOffer(test.db.pool, {
        ...base,
        offerId: hex32(),
        maximumCredits: 1_000n,
        maxConcurrency: 5,
      }),
    ).toBe(false);
  });
});

describe("orphans", () => {
  it("voids the open requests of a dead process and releases what they held", async () => {
    const permitId = hex32();
    const offerId = hex32();
    const dead = id("instance");
    const live = id("instance");
    await heartbeat(test.db.pool, dead, NOW);
    await heartbeat(test.db.pool, live, NOW);

    const common = { permitId, offerId, deposit: 10_000n, now: NOW };
    const orphan = reservation({ ...common, instanceId: dead });
    const streamingOrphan = reservation({ ...common, instanceId: dead });
    const finished = reservation({ ...common, instanceId: dead });
    const alive = reservation({ ...common, instanceId: live });
    const unknownInstance = reservation({ ...common, instanceId: id("never_beat") });
    for (const r of [orphan, streamingOrphan, finished, alive, unknownInstance]) {
      expect(await reserve(test.db.pool, r)).toEqual({ ok: true });
    }
    await markStreaming(test.db.pool, streamingOrphan.requestId);
    await finalize(test.db.pool, completion(finished.requestId, 250n));
    expect(await permitLedger(test.db.pool, permitId)).toMatchObject({
      reserved: 4_000n,
      charged: 250n,
    });

    // 100 s later the live process has beaten, the dead one has not.
    await heartbeat(test.db.pool, live, NOW + 100);
    // Not stale yet with a 120 s threshold.
    expect(await reconcileOrphans(test.db.pool, { now: NOW + 100, staleAfterSeconds: 120 })).toBe(
      0,
    );
    const reconciled = await reconcileOrphans(test.db.pool, {
      now: NOW + 100,
      staleAfterSeconds: 30,
    });
    expect(reconciled).toBeGreaterThanOrEqual(3);

    for (const r of [orphan, streamingOrphan, unknownInstance]) {
      expect(await getRequest(test.db.pool, r.requestId, "key_a")).toMatchObject({
        status: "failed",
        billing: "void",
        creditsCharged: 0n,
        error: "orphaned",
        completedAt: NOW + 100,
        settlementStatus: "none",
        inputTokens: 100n,
        outputTokens: 0n,
      });
    }
    expect((await getRequest(test.db.pool, alive.requestId, "key_a"))?.status).toBe("pending");
    expect((await getRequest(test.db.pool, finished.requestId, "key_a"))?.creditsCharged).toBe(
      250n,
    );
    expect(await permitLedger(test.db.pool, permitId)).toMatchObject({
      reserved: 1_000n,
      charged: 250n,
    });
    expect(await inFlight(offerId)).toBe(1);

    // The owner coming back cannot finalize or stream an orphan any more.
    expect(await finalize(test.db.pool, completion(orphan.requestId, 999n))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
    expect(await markStreaming(test.db.pool, orphan.requestId)).toBe(false);
    expect(await reconcileOrphans(test.db.pool, { now: NOW + 100, staleAfterSeconds: 30 })).toBe(0);
  });

  it("leaves a fresh request of a process that has not beaten yet", async () => {
    const input = reservation({ instanceId: id("starting"), createdAt: NOW + 10_000 });
    await reserve(test.db.pool, input);
    await reconcileOrphans(test.db.pool, { now: NOW + 10_010, staleAfterSeconds: 30 });
    expect((await getRequest(test.db.pool, input.requestId, "key_a"))?.status).toBe("pending");
    await reconcileOrphans(test.db.pool, { now: NOW + 10_031, staleAfterSeconds: 30 });
    expect((await getRequest(test.db.pool, input.requestId, "key_a"))?.status).toBe("failed");
  });

  it("keeps the newest heartbeat", async () => {
    const instance = id("instance");
    await heartbeat(test.db.pool, instance, NOW + 50);
    await heartbeat(test.db.pool, instance, NOW + 10);
    const { rows } = await test.db.pool.query<{ started_at: string; heartbeat_at: string }>(
      "SELECT started_at, heartbeat_at FROM gateway_instances WHERE instance_id = $1",
      [instance],
    );
    expect(rows[0]).toEqual({ started_at: String(NOW + 50), heartbeat_at: String(NOW + 50) });
  });
});

describe("voidReservation (a reservation whose outcome is unknown)", () => {
  const voidClose = (requestId: string) => ({
    requestId,
    status: "failed" as const,
    inputTokens: 0n,
    outputTokens: 0n,
    creditsCharged: 0n,
    billing: "void" as const,
    usageSource: "gateway" as const,
    error: "reservation failed",
    now: NOW + 1,
  });

  it("closes a reservation that landed, once", async () => {
    const input = reservation({ maximumCredits: 700n });
    expect(await reserve(test.db.pool, input)).toEqual({ ok: true });
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({ reserved: 700n });
    expect(await voidReservation(test.db.pool, input, voidClose(input.requestId))).toEqual({
      finalized: true,
      creditsCharged: 0n,
    });
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({
      reserved: 0n,
      charged: 0n,
    });
    expect(await inFlight(input.offerId)).toBe(0);
    expect(await voidReservation(test.db.pool, input, voidClose(input.requestId))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      status: "failed",
      billing: "void",
      creditsCharged: 0n,
      error: "reservation failed",
      settlementStatus: "none",
    });
  });

  it("written before the reservation arrives, makes the reservation fail whole: nothing is held", async () => {
    const input = reservation({ maximumCredits: 700n });
    expect(await voidReservation(test.db.pool, input, voidClose(input.requestId))).toEqual({
      finalized: false,
      creditsCharged: 0n,
    });
    expect(await getRequest(test.db.pool, input.requestId, "key_a")).toMatchObject({
      status: "failed",
      billing: "void",
      creditsCharged: 0n,
      maximumCredits: 700n,
      error: "reservation failed",
      settlementStatus: "none",
      completedAt: NOW + 1,
    });
    // The late reservation: refused on the request id, rolled back with its quote.
    await expect(reserve(test.db.pool, input)).rejects.toMatchObject({ code: "23505" });
    expect(await permitLedger(test.db.pool, input.permitId)).toMatchObject({
      reserved: 0n,
      charged: 0n,
    });
    expect(await inFlight(input.offerId)).toBe(0);
    expect(await getQuote(test.db.pool, input.quoteId)).toBeUndefined();
  });
});

describe("offer flags", () => {
  it("records a flag", async () => {
    const offerId = hex32();
    await recordOfferFlag(test.db.pool, {
      offerId,
      requestId: "req_flagged",
      reason: "usage_above_maximum",
      now: NOW,
    });
    const { rows } = await test.db.pool.query(
      "SELECT offer_id, request_id, reason, created_at FROM offer_flags WHERE offer_id = $1",
      [offerId],
    );
    expect(rows).toEqual([
      {
        offer_id: offerId,
        request_id: "req_flagged",
        reason: "usage_above_maximum",
        created_at: String(NOW),
      },
    ]);
  });
});
