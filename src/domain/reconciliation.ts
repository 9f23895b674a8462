import type { Hex } from "viem";
import type { PermitReader } from "./permits.js";
import { reconcile, type Reconciliation } from "./settlement/index.js";

/**
 * SettlementService.Reconcile's reading (docs/decisions/settlement.md): the gateway's settled sums against
 * the chain's, each permit's own `settled` read afresh. The sums come through
 * {@link SettledTotals} (src/adapters/settled-totals.ts); the report is {@link reconcile}'s.
 */

/** The settled amounts as each side records them. */
export interface SettledTotals {
  /** The gateway's ledger: per permit and per offer. */
  gateway(): Promise<Parameters<typeof reconcile>[0]["gateway"]>;
  /** The chain's `ChargeSettled` events summed, per offer and per permit. */
  chain(): Promise<{ offers: Map<Hex, bigint>; permits: Map<Hex, bigint> }>;
}

export async function reconcileSettled(deps: {
  readonly totals: SettledTotals;
  readonly permits: PermitReader;
  /** The settlement account reported (`0x` without one). */
  readonly account: Hex;
}): Promise<Reconciliation> {
  const { permits } = deps;
  const gateway = await deps.totals.gateway();
  const events = await deps.totals.chain();
  // The chain's own `settled` of every permit the gateway knows, over the event sums.
  const chainPermits = new Map(events.permits);
  for (const p of gateway.permits) {
    permits.invalidate(p.permitId);
    const permit = await permits.get(p.permitId);
    chainPermits.set(p.permitId, permit?.settled ?? 0n);
  }
  return reconcile({
    account: deps.account,
    gateway,
    chainPermits,
    chainOffers: events.offers,
  });
}
