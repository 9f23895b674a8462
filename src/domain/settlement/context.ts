/** What every stage of a flush reads: the flusher's dependencies and the account it settles. */
import type { Logger } from "pino";
import type { Hex } from "viem";
import type { SettlementChain, SettlementFlusherDeps, SettlementStore } from "./types.js";

export interface Flusher {
  readonly deps: SettlementFlusherDeps;
  readonly store: SettlementStore;
  readonly chain: SettlementChain;
  readonly holder: string;
  readonly logger: Logger;
  /** Unix seconds. */
  readonly clock: () => number;
  /** The settlement operator account (the chain's). */
  readonly account: Hex;
}

export function flusherOf(deps: SettlementFlusherDeps): Flusher {
  const { store, chain, holder, logger, clock } = deps;
  return { deps, store, chain, holder, logger, clock, account: chain.account };
}
