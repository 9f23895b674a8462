import type { Hex } from "viem";
import { isEligible, type ModelRecord, type OfferRecord } from "../catalog.js";
import { inputTokenUpperBound, outputBound, type ChatRequest } from "../chat-request.js";
import { priceCredits } from "../pricing.js";

/** A candidate offer with what a request would cost on it. */
export interface Candidate {
  readonly offer: OfferRecord;
  readonly wakes: boolean;
  readonly inputTokens: bigint;
  /** The output bound: the output limit times the request's `n` (chat-request.ts). */
  readonly maxOutputTokens: bigint;
  readonly maximumCredits: bigint;
}

/** An endpoint the prober last saw down is sleeping: calling it wakes it (and costs the wake fee). */
function wakes(offer: OfferRecord): boolean {
  return offer.endpointRunning === false;
}

function candidateFor(offer: OfferRecord, req: ChatRequest): Candidate {
  const inputTokens = inputTokenUpperBound(req);
  const maxOutputTokens = outputBound(req, offer.capabilities);
  const w = wakes(offer);
  return {
    offer,
    wakes: w,
    inputTokens,
    maxOutputTokens,
    maximumCredits: priceCredits(offer.tariff, { inputTokens, outputTokens: maxOutputTokens }, w),
  };
}

/**
 * DESIGN section 6: eligible offers matching every pin, ranked by quoted
 * maximum credits, then running over sleeping, then in-flight load.
 * Capacity is enforced atomically at reservation, not here.
 */
export function rankCandidates(
  offers: readonly OfferRecord[],
  model: ModelRecord,
  req: ChatRequest,
  pins: readonly (Hex | undefined)[],
  now: number,
): Candidate[] {
  const pinned = pins.filter((p): p is Hex => p !== undefined);
  return offers
    .filter((o) => isEligible(o, model, now) && pinned.every((p) => p === o.offerId))
    .map((o) => candidateFor(o, req))
    .sort(
      (a, b) =>
        (a.maximumCredits < b.maximumCredits ? -1 : a.maximumCredits > b.maximumCredits ? 1 : 0) ||
        Number(a.wakes) - Number(b.wakes) ||
        a.offer.inFlight - b.offer.inFlight,
    );
}
