/**
 * The batch plan: one read of the queue aggregated per (permit, offer), cut into batches that
 * simulate cleanly under the gas bound, with the charges the chain would refuse taken out.
 */
import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import type { Flusher } from "./context.js";
import type {
  FlushOptions,
  PendingCharge,
  PlannedCharge,
  SettleRevert,
  UnsettleableMark,
} from "./types.js";

/** Gas a batch costs besides its entries, and a first guess of one entry's (refined by estimation). */
const baseGasGuess = 60_000n;
const chargeGasGuess = 30_000n;
/** Most charges read for one batch. */
export const selectLimit = 20_000;

/** Sums charges per (permit, offer), in the order each pair first appears (the queue's priority). */
export function aggregateCharges(charges: readonly PendingCharge[]): PlannedCharge[] {
  const byPair = new Map<
    string,
    {
      permitId: Hex;
      offerId: Hex;
      amount: bigint;
      ids: string[];
      payment?: PendingCharge["payment"];
    }
  >();
  for (const charge of charges) {
    const key = `${charge.permitId}:${charge.offerId}`;
    let entry = byPair.get(key);
    if (entry === undefined) {
      entry = { permitId: charge.permitId, offerId: charge.offerId, amount: 0n, ids: [] };
      if (charge.payment !== undefined) entry.payment = charge.payment;
      byPair.set(key, entry);
    }
    entry.amount += charge.credits;
    entry.ids.push(charge.requestId);
  }
  return [...byPair.values()].map((e) => ({
    permitId: e.permitId,
    offerId: e.offerId,
    amount: e.amount,
    requests: e.ids.length,
    requestIds: e.ids,
    ...(e.payment === undefined ? {} : { payment: e.payment }),
  }));
}

/** Entries the contract would process up to `gasBound`, by the first guess of an entry's gas. */
export function entriesUnder(gasBound: bigint): number {
  const n = (gasBound - baseGasGuess) / chargeGasGuess;
  return n < 1n ? 1 : Number(n);
}

const reasonOf = (revert: SettleRevert): string => {
  switch (revert.name) {
    case "ChargeExceedsDeposit":
      return "exceeds_deposit";
    case "OfferMismatch":
      return "offer_mismatch";
    case "InvalidState":
      return "permit_closed";
    case "NotFound":
      return "not_found";
    case "PaymentFailed":
      return revert.detail === undefined ? "payment_failed" : `payment_failed: ${revert.detail}`;
    default:
      return revert.name;
  }
};

/** A failure that makes every batch revert, not one charge: configuration, never unsettleable. */
const batchWideErrors = new Set(["NotSettlementOperator", "BatchAlreadySettled"]);

/** A batch ready to store: what simulates cleanly under the gas bound, and what never will. */
export interface Prepared {
  readonly good: PlannedCharge[];
  readonly bad: UnsettleableMark[];
  readonly badEntries: PlannedCharge[];
  readonly calldata: Hex | undefined;
  readonly gas: bigint;
}

const newBatchId = (): Hex => `0x${randomBytes(32).toString("hex")}`;

/**
 * Takes the charges the chain would refuse out of `entries` (marking nothing: the caller
 * decides), until the rest simulates cleanly under the gas bound.
 */
async function prepare(
  f: Flusher,
  batchId: Hex,
  entries: readonly PlannedCharge[],
): Promise<Prepared> {
  const { chain, deps } = f;
  let candidate = [...entries];
  const bad: UnsettleableMark[] = [];
  const badEntries: PlannedCharge[] = [];
  const remove = (culprits: readonly PlannedCharge[], reason: string) => {
    for (const c of culprits) {
      badEntries.push(c);
      bad.push({
        permitId: c.permitId,
        offerId: c.offerId,
        requestIds: c.requestIds,
        credits: c.amount,
        reason,
      });
    }
    candidate = candidate.filter((c) => !culprits.includes(c));
  };
  for (;;) {
    if (candidate.length === 0) return { good: [], bad, badEntries, calldata: undefined, gas: 0n };
    const calldata = chain.encode(batchId, candidate);
    const result = await chain.simulate(calldata);
    if (result.ok) {
      if (result.gas > deps.maxBatchGas && candidate.length > 1) {
        const keep = Number(
          (BigInt(candidate.length) * deps.maxBatchGas * 9n) / (result.gas * 10n),
        );
        candidate = candidate.slice(0, Math.max(1, Math.min(keep, candidate.length - 1)));
        continue;
      }
      return { good: candidate, bad, badEntries, calldata, gas: result.gas };
    }
    const revert = result.revert;
    if (batchWideErrors.has(revert.name)) {
      throw new Error(`settlement refused by the market: ${revert.message}`);
    }
    // 1. The revert names the charge.
    if (revert.permitId !== undefined) {
      const culprit = candidate.find(
        (c) =>
          c.permitId === revert.permitId &&
          (revert.offerId === undefined || c.offerId === revert.offerId) &&
          (revert.amount === undefined || c.amount === revert.amount),
      );
      if (culprit !== undefined) {
        remove([culprit], reasonOf(revert));
        continue;
      }
    }
    // 2. Permits the chain no longer takes charges for (an x402 payment is no permit until
    // it settles: step 3 judges it).
    const permits = [
      ...new Set(candidate.filter((c) => c.payment === undefined).map((c) => c.permitId)),
    ];
    const states = await Promise.all(permits.map((p) => chain.permitState(p)));
    const gone = new Map<Hex, string>();
    permits.forEach((p, i) => {
      if (states[i] === "closed") gone.set(p, "permit_closed");
      if (states[i] === "none") gone.set(p, "permit_not_found");
    });
    if (gone.size > 0) {
      for (const [permitId, reason] of gone)
        remove(
          candidate.filter((c) => c.permitId === permitId),
          reason,
        );
      continue;
    }
    // 3. Each entry alone.
    const alone = await Promise.all(
      candidate.map((c) => chain.simulate(chain.encode(batchId, [c]))),
    );
    const culprits = candidate.filter((_, i) => !alone[i]!.ok);
    if (culprits.length === 0) {
      throw new Error(`settlement batch reverts in simulation: ${revert.message}`);
    }
    for (const c of culprits) {
      const r = alone[candidate.indexOf(c)]!;
      remove([c], r.ok ? "rejected" : reasonOf(r.revert));
    }
  }
}

/**
 * Batches from one read of the queue: its charges aggregated per (permit, offer), each pair in
 * one batch, as many pairs per batch as simulate under the gas bound.
 */
export async function* plan(
  f: Flusher,
  options: FlushOptions,
  limit: number,
): AsyncGenerator<Prepared & { batchId: Hex }> {
  const pending = await f.store.pendingCharges({ limit, permits: options.permits });
  let entries = aggregateCharges(pending);
  const maxEntries = entriesUnder(f.deps.maxBatchGas);
  while (entries.length > 0) {
    const batchId = newBatchId();
    const prepared = await prepare(f, batchId, entries.slice(0, maxEntries));
    const taken = new Set([...prepared.good, ...prepared.badEntries]);
    entries = entries.filter((e) => !taken.has(e));
    yield { batchId, ...prepared };
  }
}
