import type { Hex } from "viem";
import type { Catalog } from "./catalog.js";
import { GatewayError } from "./errors.js";
import {
  readOfferId,
  requireEarningsReader,
  type EarningsReader,
  type OfferKeyBindingStore,
} from "./offer-key-binding.js";

/**
 * An offer's earnings over a window of completion times, by settlement state (docs/decisions/settlement.md,
 * "Provider earnings"): what its charged requests add up to while unsettled, in a batch
 * (settling), settled on chain (paid to the payout), and unsettleable (with the reasons), and the
 * batches that carry them. Read from the gateway's records; money as bigint.
 */

/** A window names no `from`: this far before `to`. */
export const defaultEarningsWindowSeconds = 30 * 24 * 3600;
/** The longest window one read may cover (the read walks every charge in it). */
export const maxEarningsWindowSeconds = 366 * 24 * 3600;
/** Batches listed per answer, newest first; `batchesTruncated` says when there were more. */
export const maxEarningsBatches = 100;

export type EarningsState = "unsettled" | "settling" | "settled" | "unsettleable";

export interface EarningsTotals {
  readonly requests: number;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly credits: bigint;
}

export interface EarningsBatch {
  readonly batchId: Hex;
  readonly status: "pending" | "submitted" | "settled" | "failed";
  readonly txHash: Hex | null;
  readonly createdAt: number;
  readonly settledAt: number | null;
  /** The offer's requests and credits (of the window) in the batch. */
  readonly requests: number;
  readonly credits: bigint;
}

/** The offer's charges completed on one UTC day. */
export interface EarningsDay {
  /** Unix seconds: the start of the UTC day. */
  readonly startsAt: number;
  readonly requests: number;
  /** In every settlement state. */
  readonly credits: bigint;
  /** Of `credits`, settled on chain. */
  readonly settledCredits: bigint;
}

/** What the store answers for one offer and window (one snapshot). */
export interface EarningsRows {
  /** One entry per state, and per reason for unsettleable charges. */
  readonly groups: readonly (EarningsTotals & { state: EarningsState; reason: string | null })[];
  /** By UTC day of completion, oldest first; days without a charge left out. */
  readonly days: readonly EarningsDay[];
  /** Newest first, at most `limit + 1` (the extra one says there are more). */
  readonly batches: readonly EarningsBatch[];
}

export interface EarningsStore {
  read(args: { offerId: Hex; from: number; to: number; limit: number }): Promise<EarningsRows>;
}

export interface OfferEarnings {
  readonly offerId: Hex;
  /** The offer's model: its credit token's units are those of every amount here. */
  readonly modelId: Hex;
  readonly payout: Hex;
  readonly from: number;
  readonly to: number;
  readonly totals: Readonly<Record<EarningsState, EarningsTotals>>;
  /** Largest credits first. */
  readonly unsettleableReasons: readonly { reason: string; requests: number; credits: bigint }[];
  readonly batches: readonly EarningsBatch[];
  readonly batchesTruncated: boolean;
  /** The window's charges by UTC day of completion, oldest first (earnings over time). */
  readonly days: readonly EarningsDay[];
}

const zero: EarningsTotals = { requests: 0, inputTokens: 0n, outputTokens: 0n, credits: 0n };

const add = (a: EarningsTotals, b: EarningsTotals): EarningsTotals => ({
  requests: a.requests + b.requests,
  inputTokens: a.inputTokens + b.inputTokens,
  outputTokens: a.outputTokens + b.outputTokens,
  credits: a.credits + b.credits,
});

/** The window asked for, with its defaults; 400 `invalid_request` when it is not one. */
export function earningsWindow(
  req: { from?: number | bigint | undefined; to?: number | bigint | undefined },
  now: number,
): { from: number; to: number } {
  const read = (value: number | bigint, name: string): number => {
    const n = typeof value === "bigint" ? Number(value) : value;
    if (!Number.isSafeInteger(n) || n < 0)
      throw new GatewayError("invalid_request", `'${name}' must be Unix seconds (an integer ≥ 0)`);
    return n;
  };
  // `to` is exclusive: by default the window ends after the current second, so a charge made
  // this second is in it.
  const to = req.to === undefined ? now + 1 : read(req.to, "to");
  const from =
    req.from === undefined
      ? Math.max(0, to - defaultEarningsWindowSeconds)
      : read(req.from, "from");
  if (from >= to) throw new GatewayError("invalid_request", "'from' must be before 'to'");
  if (to - from > maxEarningsWindowSeconds) {
    throw new GatewayError(
      "invalid_request",
      `the window may span at most ${maxEarningsWindowSeconds} seconds (366 days)`,
    );
  }
  return { from, to };
}

/** Folds the store's groups into the four states and the reasons. */
export function foldEarnings(
  rows: EarningsRows,
  meta: { offerId: Hex; modelId: Hex; payout: Hex; from: number; to: number },
): OfferEarnings {
  const totals: Record<EarningsState, EarningsTotals> = {
    unsettled: zero,
    settling: zero,
    settled: zero,
    unsettleable: zero,
  };
  const reasons = new Map<string, { reason: string; requests: number; credits: bigint }>();
  for (const g of rows.groups) {
    totals[g.state] = add(totals[g.state], g);
    if (g.state !== "unsettleable") continue;
    const reason = g.reason ?? "unknown";
    const held = reasons.get(reason) ?? { reason, requests: 0, credits: 0n };
    reasons.set(reason, {
      reason,
      requests: held.requests + g.requests,
      credits: held.credits + g.credits,
    });
  }
  return {
    ...meta,
    totals,
    unsettleableReasons: [...reasons.values()].sort((a, b) =>
      a.credits === b.credits ? a.reason.localeCompare(b.reason) : a.credits > b.credits ? -1 : 1,
    ),
    batches: rows.batches.slice(0, maxEarningsBatches),
    batchesTruncated: rows.batches.length > maxEarningsBatches,
    days: rows.days,
  };
}

export interface OfferEarningsServiceDeps {
  readonly catalog: Pick<Catalog, "getOffer">;
  readonly bindings: OfferKeyBindingStore;
  readonly store: EarningsStore;
  /** Unix seconds. */
  readonly clock: () => number;
}

export interface OfferEarningsService {
  get(req: {
    reader: EarningsReader;
    offerId: string;
    from?: number | bigint | undefined;
    to?: number | bigint | undefined;
  }): Promise<OfferEarnings>;
}

export function createOfferEarningsService(deps: OfferEarningsServiceDeps): OfferEarningsService {
  return {
    async get(req) {
      const offerId = readOfferId(req.offerId);
      const now = Math.floor(deps.clock());
      const window = earningsWindow(req, now);
      const offer = await deps.catalog.getOffer(offerId);
      if (offer === undefined)
        throw new GatewayError("offer_not_found", `offer ${offerId} does not exist`);
      await requireEarningsReader(deps.bindings, req.reader, offer, now);
      let rows: EarningsRows;
      try {
        rows = await deps.store.read({ offerId, ...window, limit: maxEarningsBatches });
      } catch (err) {
        throw new GatewayError("database_unavailable", "the earnings could not be read", {
          cause: err,
        });
      }
      return foldEarnings(rows, {
        offerId,
        modelId: offer.modelId,
        payout: offer.payout,
        ...window,
      });
    },
  };
}
