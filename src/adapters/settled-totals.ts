import type pg from "pg";
import type { Address, PublicClient } from "viem";
import type { SettledTotals } from "../domain/reconciliation.js";
import { chainSettledTotals } from "./chain/settlement.js";
import { settledSums } from "./pg/settlement.js";

/**
 * The reconciliation's two sides (src/domain/reconciliation.ts): the ledger's settled sums in
 * the database, and the market's `ChargeSettled` events from `startBlock` on.
 */
export function createSettledTotals(deps: {
  readonly pool: pg.Pool;
  readonly chain: PublicClient;
  readonly market: Address;
  readonly startBlock: bigint;
}): SettledTotals {
  return {
    gateway: () => settledSums(deps.pool),
    chain: () => chainSettledTotals(deps.chain, deps.market, deps.startBlock),
  };
}
