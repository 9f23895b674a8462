/** Reconciliation: the gateway's settled sums against the chain's, per permit and per offer. */
import type { Hex } from "viem";

export interface PermitReconciliation {
  readonly permitId: Hex;
  readonly gatewaySettled: bigint;
  readonly ledgerSettled: bigint;
  readonly chainSettled: bigint;
  readonly unsettleable: bigint;
  readonly drift: boolean;
}

export interface OfferReconciliation {
  readonly offerId: Hex;
  readonly gatewayPaid: bigint;
  readonly chainPaid: bigint;
  readonly drift: boolean;
}

export interface Reconciliation {
  readonly account: Hex;
  readonly permits: PermitReconciliation[];
  readonly offers: OfferReconciliation[];
  readonly drift: boolean;
}

/**
 * Compares the gateway's settled sums with the chain's: per permit, the settled requests' sum,
 * the permit ledger's settled amount and the chain's `settled` must be one number; per offer,
 * the settled requests' sum and what the chain's `ChargeSettled` events paid it. A permit or
 * offer known to only one side counts with zero on the other.
 */
export function reconcile(input: {
  account: Hex;
  gateway: {
    permits: readonly {
      permitId: Hex;
      settled: bigint;
      unsettleable: bigint;
      ledgerSettled: bigint;
    }[];
    offers: readonly { offerId: Hex; settled: bigint }[];
  };
  chainPermits: ReadonlyMap<Hex, bigint>;
  chainOffers: ReadonlyMap<Hex, bigint>;
}): Reconciliation {
  const permitIds = new Set<Hex>([
    ...input.gateway.permits.map((p) => p.permitId),
    ...input.chainPermits.keys(),
  ]);
  const byPermit = new Map(input.gateway.permits.map((p) => [p.permitId, p]));
  const permits = [...permitIds].sort().map((permitId): PermitReconciliation => {
    const g = byPermit.get(permitId);
    const gatewaySettled = g?.settled ?? 0n;
    const ledgerSettled = g?.ledgerSettled ?? 0n;
    const chainSettled = input.chainPermits.get(permitId) ?? 0n;
    return {
      permitId,
      gatewaySettled,
      ledgerSettled,
      chainSettled,
      unsettleable: g?.unsettleable ?? 0n,
      drift: gatewaySettled !== chainSettled || ledgerSettled !== chainSettled,
    };
  });
  const offerIds = new Set<Hex>([
    ...input.gateway.offers.map((o) => o.offerId),
    ...input.chainOffers.keys(),
  ]);
  const byOffer = new Map(input.gateway.offers.map((o) => [o.offerId, o.settled]));
  const offers = [...offerIds].sort().map((offerId): OfferReconciliation => {
    const gatewayPaid = byOffer.get(offerId) ?? 0n;
    const chainPaid = input.chainOffers.get(offerId) ?? 0n;
    return { offerId, gatewayPaid, chainPaid, drift: gatewayPaid !== chainPaid };
  });
  return {
    account: input.account,
    permits,
    offers,
    drift: permits.some((p) => p.drift) || offers.some((o) => o.drift),
  };
}
