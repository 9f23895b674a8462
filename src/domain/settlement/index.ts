/**
 * Settlement: every charge reaches the chain exactly once (DESIGN.md sections 2 and 3).
 *
 * The chain is the authority on what has been paid: `settle(batchId, charges)` accepts a batch
 * id once, and `isBatchSettled(batchId)` says whether it did. The flusher is a transaction
 * manager in the style of Chainlink's, persisted before every side effect:
 *
 *   unsettled --store (batch, calldata, signed tx, hash, nonce)--> settling / batch `pending`
 *   pending --broadcast--> `submitted` --receipt with BatchSettled, CONFIRMATIONS deep--> settled
 *   submitted --an attempt reverted, CONFIRMATIONS deep, none succeeded, and the chain asked
 *     once more says the batch id has not settled--> `failed`: charges unsettled
 *
 * - One flusher per settlement account at a time (a lease on the database clock; every write
 *   is fenced by it), and one transaction in flight per account: a batch is driven to its end
 *   before the next is made.
 * - Every signed attempt is stored before it is broadcast, and kept. A batch is settled only
 *   when the chain says its id settled; before any resend the chain is asked first.
 * - An attempt the node took (`sentBlock`) and left unmined for `replaceAfterBlocks` blocks is
 *   replaced: same nonce, same calldata, fees raised by `feeBumpPercent` (at least 15), never
 *   above `feeCap`. An attempt the node never took (its broadcast failed or was refused) is
 *   re-sent as it is: a higher fee cures neither an unreachable node nor an empty account, and
 *   raising it on every failed try would ratchet without end. An attempt whose nonce another
 *   transaction took is re-sent under a new nonce with the same batch id (the chain refuses a
 *   second settlement of one id, so whichever lands, it lands once).
 * - A batch is simulated before it is stored; a charge the chain would refuse (its permit
 *   closed or unknown, an offer mismatch, beyond the deposit) is taken out and marked
 *   `unsettleable` with the reason, so one bad permit never holds up the others.
 * - Charges are aggregated per (permit, offer): one `Charge` entry per pair per batch.
 */
export type {
  ApprovalItem,
  BatchCharge,
  BatchRecord,
  BatchReport,
  BatchState,
  BroadcastOutcome,
  Fees,
  FlushOptions,
  FlushResult,
  InFlightBatch,
  PaymentItem,
  PendingCharge,
  PermitChainState,
  PlannedCharge,
  SettleRevert,
  SettlementAttempt,
  SettlementChain,
  SettlementFlusher,
  SettlementFlusherDeps,
  SettlementObserver,
  SettlementStore,
  Sign,
  Simulation,
  UnsettleableMark,
  UnsettleableReport,
} from "./types.js";
export { bump, capFees, minReplacementBumpPercent, replacementFees } from "./fees.js";
export { aggregateCharges, entriesUnder } from "./plan.js";
export { createSettlementFlusher } from "./flusher.js";
export {
  reconcile,
  type OfferReconciliation,
  type PermitReconciliation,
  type Reconciliation,
} from "./reconcile.js";
