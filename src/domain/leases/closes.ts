import type { Hex } from "viem";
import type { LeaseState } from "./state.js";
import type { Ledger } from "../chat/ports.js";

/**
 * A leased request's close (leases.ts): its slot goes back when the provider is done, its
 * charge leaves the lease in the store's close batch (after its record's write), and the rest
 * of its maximum is free again; and its move to streaming, refused once its epoch may have
 * been released.
 */

type FinalizeInput = Parameters<Ledger["finalize"]>[0];
type FinalizeResult = ReturnType<Ledger["finalize"]>;

/** Closes a request admitted here through its lease; any other, through the fallback. */
export async function finalize(s: LeaseState, input: FinalizeInput): FinalizeResult {
  const r = s.requests.get(input.requestId);
  if (r === undefined) return s.fallback.finalize(input);
  // The provider is done with the request: its slot is free now, while its credits stay
  // held until the charge is committed (a slot is in-memory accounting inside the lease).
  if (r.slotHeld) {
    r.slotHeld = false;
    s.pools.release(r.offerPool, 1n);
  }
  r.closing ??= (async () => {
    if (!r.open.sent) r.open.skip = true;
    else await r.written;
    return s.store.close({ ...input, record: r.record });
  })();
  let result: { finalized: boolean; creditsCharged: bigint };
  s.pools.closeStarted(r.permitPool);
  try {
    result = await r.closing;
  } catch (error) {
    r.closing = undefined; // the outbox tries again; the close is exactly-once
    s.pools.closeEnded(r.permitPool);
    throw error;
  }
  if (s.requests.delete(input.requestId)) {
    r.epoch.open--;
    // The charge left the lease in the same transaction; the rest of the maximum is free.
    r.permitPool.granted -= result.creditsCharged;
    s.pools.release(r.permitPool, r.record.maximumCredits);
  }
  s.pools.closeEnded(r.permitPool);
  return result;
}

/** pending -> streaming: false when the request's epoch may have been released meanwhile. */
export async function markStreaming(s: LeaseState, requestId: Hex): Promise<boolean> {
  const r = s.requests.get(requestId);
  if (r === undefined) return s.fallback.markStreaming(requestId);
  if (
    r.epoch.retired &&
    (r.epoch.forfeited ||
      (r.epoch.beatSentAt !== undefined && s.mono() > r.epoch.beatSentAt + s.staleMs))
  ) {
    return false; // the others may have released this epoch's leases: stop serving
  }
  if (!r.open.sent) {
    r.open.streaming = true;
    return true;
  }
  await r.written;
  await s.store.markStreaming(requestId);
  return true;
}
