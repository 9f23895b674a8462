/**
 * The credit ledger: reservations, charges and offer slots in PostgreSQL, shared by every
 * gateway process on the database.
 *
 * Invariants (DESIGN.md section 3), which every function here keeps:
 * - per permit, what has settled on chain + the unsettled charges + the open reservations never
 *   exceeds the deposit;
 * - a request is charged at most its `maximum_credits` (also a CHECK on the table);
 * - every reservation ends in exactly one final state (completed, failed or cancelled), once;
 * - a request exists (and holds its reservation and its offer slot) before any upstream call:
 *   `reserve` commits before it returns `ok`.
 *
 * ## Why conditional statements are enough across processes
 *
 * Every admission is one conditional write on the row it limits, e.g. `UPDATE permit_ledgers
 * SET reserved = reserved + $m WHERE permit_id = $p AND <available> >= $m`. Under READ
 * COMMITTED (PostgreSQL's default, which these transactions ask for) a writer that finds the row
 * locked by another transaction waits for it to commit or roll back and then re-evaluates its
 * WHERE clause against the newest version of the row (EvalPlanQual), not against its snapshot.
 * So two processes that both see 10 credits available cannot both take 10: the second one
 * waits, re-reads the row with the first one's reservation in it, and its condition fails. The
 * same holds for `INSERT ... ON CONFLICT DO UPDATE ... WHERE`: the conflicting row is locked and
 * the WHERE is checked on its newest version, and a concurrent insert of the same key is waited
 * for. No read-then-write, no SERIALIZABLE retries and no advisory locks are needed.
 *
 * ## Lock order
 *
 * Transactions take row locks in one global order, so they cannot deadlock with each other:
 * quote, then request, then offer rows (ascending id), then the permit row, then the
 * authorization ledger row of a capped request (see "Authorization caps").
 *
 * ## One round trip each
 *
 * `reserve` and `finalize` run as the SQL functions `gw_reserve` and `gw_close_request`
 * (migration 005), each one statement that commits on its own: every request of a permit and an
 * offer locks the same two rows until COMMIT, and sending the steps one by one held those locks
 * across several network round trips (the bench measured ~110 req/s on one permit).
 *
 * ## Batches (group commit)
 *
 * Even so, one transaction per request admits at most one request of a permit per commit. The
 * gateway therefore goes through {@link createLedgerBatcher}: reservations (and, separately,
 * finalisations) that arrive while the previous batch is in flight go together as the next
 * batch, one call of `gw_batch_reserve` (`gw_close_batch`, migration 006), one transaction and
 * one COMMIT. Each item runs in its own subtransaction, so it is refused, fails or succeeds as
 * it would alone, and it is committed before its promise resolves. The batch functions take
 * every row lock their items need up front, in the order above, so batches cannot deadlock with
 * each other or with the single calls (migration 006 gives the argument; it also rewrote
 * gw_reserve's upserts as plain conditional UPDATEs, which behave the same).
 *
 * ## Authorization caps (issue 28, item 7; migration 030)
 *
 * A payer's authorization may cap what its key spends in all (`total_cap`) and per request
 * (`per_request_cap`). The per-request cap is signed and never changes, so the pipeline checks
 * it in memory before anything is reserved. The total cap is a deposit of its own, kept exactly
 * as a permit's: its `authorization_ledgers` row holds `reserved` (the maxima of its open
 * requests) and `used` (their charges once closed), and a capped request's reservation is one
 * more conditional UPDATE of that row in the same `gw_reserve` call, `WHERE total_cap - used -
 * reserved >= maximum`, after the permit's (the lock order above). So the argument above holds
 * for it word for word: two processes that both see room for one request cannot both take it,
 * and a request is refused `authorization_cap_exhausted` only when, on the row's newest
 * version, the cap less what is used and held is below its maximum (no false refusal). Every
 * close that ends a request ends its cap reservation in the same statement, exactly once by the
 * same status condition: `gw_close_request` (and so `gw_close_batch`, the orphan rule and
 * `gw_void_reservation`'s close of a row that landed) moves the charge to `used` and releases
 * the rest; a void row that `gw_void_reservation` inserts first makes the late reservation fail
 * whole, its cap UPDATE included; `switchOffer` resizes the cap reservation with the permit's.
 * A capped request never goes through a reservation lease (leases.ts sends it here): a lease
 * holds a permit's credits for a process, and a cap held that way would refuse another
 * process's request while credits sat idle in this one's lease. Uncapped requests run the
 * statements they ran before (`gw_reserve`'s INSERT carries the authorization's id, which a
 * leased record's INSERT carries too), so they pay nothing for the caps.
 *
 * A periodic cap (issue 38, migration 039: per UTC day, week or month) is the same deposit per
 * period, in the same row and the same UPDATE: `period_reserved` and `period_used` of the period
 * that starts at `period_start`, which a request admitted in a newer period (`periodStart`, from
 * the gateway's clock) starts over from zero. The request records the period it counts against,
 * and its close (or failover resize) touches the period's figures only while that is still the
 * row's period: a request admitted before a rollover never charges the new period. Refused
 * `authorization_period_cap_exhausted` when the period's cap, not the total, is short. Such a
 * request is `capped` too, so it never goes through a lease either.
 */
export {
  markStreaming,
  reserve,
  switchOffer,
  type ReserveInput,
  type SwitchOfferInput,
} from "./reserve.js";
export {
  closeColumns,
  finalize,
  voidReservation,
  type CloseColumns,
  type FiguresColumns,
  type FinalizeInput,
  type FinalizeResult,
} from "./close.js";
export {
  createLedgerBatcher,
  LedgerItemError,
  MAX_LEDGER_BATCH,
  type LedgerBatcher,
  type LedgerBatcherOptions,
} from "./batch.js";
export {
  databaseNow,
  heartbeat,
  reconcileOrphans,
  type ReconcileOrphansInput,
} from "./liveness.js";
export {
  availableCredits,
  permitLedger,
  recordOfferFlag,
  type OfferFlagInput,
  type PermitLedger,
} from "./queries.js";
