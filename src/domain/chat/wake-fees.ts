import type { Hex } from "viem";

/**
 * Wake fees the gateway saw earned (issue 27, item 10; docs/decisions/chat-quotes-and-money.md "Wake fees").
 *
 * A quote prices the wake fee when the prober last saw the offer's endpoint down: it is a
 * maximum, and routing and `provider.max_price` count it. What the close charges is another
 * matter: a provider could fail its liveness probe on purpose (while serving chat) to have every
 * request charged the fee. So the fee is charged only when the gateway's own observation holds:
 * its last probe saw the endpoint down, and no request to the offer was charged the fee in the
 * last `windowSeconds`, since which a probe has seen it down again. The claim is made on the
 * endpoint's row (`adapters/pg/endpoint-health.ts` `claimWakeFee`), so one request per offer
 * per window is charged it across every gateway sharing the database.
 */

/** The claim on the store (one conditional UPDATE); `chargedAt`: when the fee was last charged. */
export type WakeFeeClaimer = (
  offerId: Hex,
  now: number,
  windowSeconds: number,
) => Promise<{ readonly claimed: boolean; readonly chargedAt: number | undefined }>;

export interface WakeFees {
  /**
   * Whether the request now admitted to `offerId` (whose quote priced the wake fee) is charged
   * it. Never throws: a claim the store could not answer charges no fee (the payer's favour).
   */
  claim(offerId: Hex): Promise<boolean>;
}

export function createWakeFees(deps: {
  readonly claim: WakeFeeClaimer;
  /** WAKE_FEE_WINDOW_SECONDS (default 300). */
  readonly windowSeconds: number;
  /** Unix seconds. */
  readonly clock: () => number;
  /** Told when a claim failed (for the operator's log); must not throw. */
  readonly onError?: (offerId: Hex, error: unknown) => void;
}): WakeFees {
  // When each offer's window, as this process last learnt it, ends: inside it no claim can hold,
  // so requests to an endpoint the prober keeps seeing down do not reach the database each.
  const windowEnds = new Map<Hex, number>();
  return {
    async claim(offerId) {
      const now = deps.clock();
      const ends = windowEnds.get(offerId);
      if (ends !== undefined) {
        if (now < ends) return false;
        windowEnds.delete(offerId);
      }
      try {
        const { claimed, chargedAt } = await deps.claim(offerId, now, deps.windowSeconds);
        if (chargedAt !== undefined && chargedAt + deps.windowSeconds > now)
          windowEnds.set(offerId, chargedAt + deps.windowSeconds);
        return claimed;
      } catch (error) {
        deps.onError?.(offerId, error);
        return false;
      }
    },
  };
}
