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
 */
import type pg from "pg";
import { BaseError } from "../../domain/base-error.js";
import type { Hex } from "viem";
import {
  availableCredits,
  emptyPermitLedger,
  type PermitLedger,
} from "../../domain/permit-balance.js";
import { createBatcher, type BatcherStats, type ItemOutcome } from "./batcher.js";
import { quoteColumns, type NewQuote } from "./quotes.js";
import type { Queryable } from "./registrations.js";
import type { CloseRecord, UsageFigures } from "../../domain/chat/index.js";
import type { Billing, FinalRequestStatus, UsageSource } from "./requests.js";

/** The ledger found itself inconsistent (a bug, or a hand edit); the transaction was undone. */
export class LedgerInconsistencyError extends BaseError {
  readonly reason = "ledger_inconsistent";
  override readonly name = "LedgerInconsistencyError";
}

export interface ReserveInput {
  readonly requestId: string;
  readonly apiKeyId: string;
  /** The gateway process serving the request (see {@link heartbeat}). */
  readonly instanceId: string;
  readonly model: string;
  readonly modelId: Hex;
  readonly offerId: Hex;
  readonly permitId: Hex;
  readonly quoteId: string;
  readonly stream: boolean;
  /** The quote's maximum credits: what is reserved, and the most the request can be charged. */
  readonly maximumCredits: bigint;
  readonly tariffVersion: bigint;
  /** Stored as the request's input tokens until it is finalized (the quote's upper bound). */
  readonly inputTokens: bigint;
  /** The permit's deposit, read live from the chain. */
  readonly deposit: bigint;
  /** What has settled on chain against the permit, read live from the chain. */
  readonly chainSettled: bigint;
  /** The offer's `max_concurrency`; below 1 the offer admits nothing. */
  readonly maxConcurrency: number;
  /**
   * The request's `created_at`, Unix seconds on the database's clock, only where a test places
   * a request in time (as {@link heartbeat}'s `now`). Absent, as in production: the database's
   * clock at insert. Never a host's clock: the orphan rule compares `created_at` with heartbeats,
   * so a host whose clock runs ahead would keep its requests from it, one behind would expose
   * them to it (docs/decisions/chat-quotes-and-money.md, "Orphans").
   */
  readonly createdAt?: number;
  /** An internal quote (made by the gateway for a request without one), stored first. */
  readonly quote?: NewQuote;
  /** The permit authorization that admits the request, recorded on it; absent: none recorded. */
  readonly authorizationId?: string | undefined;
  /**
   * The authorization has a total cap: the maximum is reserved against it as well (its
   * `authorization_ledgers` row, migration 030), and its close gives the rest back there.
   */
  readonly capped?: boolean | undefined;
}

export type ReserveRefusal =
  "insufficient_credits" | "offer_at_capacity" | "quote_used" | "authorization_cap_exhausted";
export type ReserveResult = { ok: true } | { ok: false; reason: ReserveRefusal };

/**
 * Admits a request, in one transaction: stores the internal quote if one is given, consumes the
 * quote, takes a slot on the offer, reserves `maximumCredits` on the permit (and, `capped`, on
 * its authorization's total cap) and inserts the request as `pending`. A refusal (checked in
 * that order: `quote_used`, `offer_at_capacity`, `insufficient_credits`,
 * `authorization_cap_exhausted`) rolls all of it back. A quote that does not exist reads as
 * `quote_used`; the caller looks the quote up first to answer `quote_not_found`.
 *
 * Availability: `deposit - (charged + max(0, chainSettled - settled)) - reserved`, where
 * `charged` includes what this gateway has settled, and settlements on chain that this gateway
 * has not recorded (another gateway, or one whose record is not written yet) count too.
 *
 * When this throws, the outcome may be unknown (a COMMIT whose answer was lost, or a statement
 * still running): the caller must not call upstream, and should close the request with
 * {@link voidReservation}, which also covers a reservation that lands after it.
 */
export async function reserve(pool: pg.Pool, input: ReserveInput): Promise<ReserveResult> {
  return reserveOne(pool, reserveArgs(input));
}

async function reserveOne(pool: pg.Pool, args: ReserveArgs): Promise<ReserveResult> {
  try {
    // One statement, committed on its own: see migration 005 for why and how.
    await pool.query(
      `SELECT gw_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::numeric, $11::numeric,
         $12::numeric, $13::numeric, $14::numeric, $15::integer, $16::bigint, $17::jsonb, $18,
         $19::boolean)`,
      Object.values(args),
    );
    return { ok: true };
  } catch (error) {
    const message = (error as { message?: unknown }).message;
    const reason = typeof message === "string" ? refusal(message, "gw:") : undefined;
    if (reason !== undefined) return { ok: false, reason };
    throw error;
  }
}

/**
 * gw_reserve's arguments, in its parameter order and named as it names them without the `p_`,
 * as JSON values (amounts as decimal strings): the positional parameters of {@link reserve}
 * and an item of `gw_batch_reserve`.
 */
interface ReserveArgs {
  readonly request_id: string;
  readonly api_key_id: string;
  readonly instance_id: string;
  readonly model: string;
  readonly model_id: string;
  readonly offer_id: string;
  readonly permit_id: string;
  readonly quote_id: string;
  readonly stream: boolean;
  readonly maximum: string;
  readonly tariff_version: string;
  readonly input_tokens: string;
  readonly deposit: string;
  readonly chain_settled: string;
  readonly max_concurrency: number;
  /** The request's `created_at`; null (production): the database's clock at insert. */
  readonly now: number | null;
  /** The JSON text of the internal quote's row, or null. */
  readonly quote: string | null;
  readonly authorization_id: string | null;
  readonly capped: boolean;
}

/** Checks a reservation and maps it to gw_reserve's arguments. */
function reserveArgs(input: ReserveInput): ReserveArgs {
  requireAmount("maximumCredits", input.maximumCredits);
  requireAmount("tariffVersion", input.tariffVersion);
  requireAmount("inputTokens", input.inputTokens);
  requireAmount("deposit", input.deposit);
  requireAmount("chainSettled", input.chainSettled);
  if (input.quote !== undefined && input.quote.quoteId !== input.quoteId) {
    throw new RangeError("reserve: quote.quoteId differs from quoteId");
  }
  if (input.capped === true && input.authorizationId === undefined) {
    throw new RangeError("reserve: a capped request names its authorization");
  }
  return {
    request_id: input.requestId,
    api_key_id: input.apiKeyId,
    instance_id: input.instanceId,
    model: input.model,
    model_id: input.modelId.toLowerCase(),
    offer_id: input.offerId.toLowerCase(),
    permit_id: input.permitId.toLowerCase(),
    quote_id: input.quoteId,
    stream: input.stream,
    maximum: input.maximumCredits.toString(),
    tariff_version: input.tariffVersion.toString(),
    input_tokens: input.inputTokens.toString(),
    deposit: input.deposit.toString(),
    chain_settled: input.chainSettled.toString(),
    max_concurrency: Number.isFinite(input.maxConcurrency) ? Math.floor(input.maxConcurrency) : 0,
    now: input.createdAt ?? null,
    quote: input.quote === undefined ? null : quoteColumns(input.quote),
    authorization_id: input.authorizationId ?? null,
    capped: input.capped === true,
  };
}

const REFUSALS: readonly string[] = [
  "quote_used",
  "offer_at_capacity",
  "insufficient_credits",
  "authorization_cap_exhausted",
] satisfies readonly ReserveRefusal[];

/** The refusal that `text` names after `prefix`, if it names one. */
function refusal(text: string, prefix: string): ReserveRefusal | undefined {
  if (!text.startsWith(prefix)) return undefined;
  const reason = text.slice(prefix.length);
  return REFUSALS.includes(reason) ? (reason as ReserveRefusal) : undefined;
}

/**
 * pending -> streaming, when the first byte goes to the client. False when the request is not
 * pending any more: if it was finalized meanwhile (reconciled as an orphan, say), the caller
 * must stop serving it, since nothing it delivers can be charged.
 */
export async function markStreaming(db: Queryable, requestId: string): Promise<boolean> {
  const { rowCount } = await db.query(
    "UPDATE inference_requests SET status = 'streaming' WHERE id = $1 AND status = 'pending'",
    [requestId],
  );
  return rowCount === 1;
}

/** A request's close; its charge is clamped to the request's maximum and must be 0 when `void`. */
export interface FinalizeInput extends CloseRecord {
  readonly requestId: string;
}

export interface FinalizeResult {
  /** False when the request was already final (or does not exist): nothing was changed. */
  readonly finalized: boolean;
  /** The charge recorded: the clamped charge, or the earlier one when already final. */
  readonly creditsCharged: bigint;
}

/**
 * Ends an open request, exactly once: records its final state and charge (at most its
 * maximum: `LEAST` in SQL), turns its reservation into the charge on the permit ledger and
 * frees its offer slot, all in one transaction. A request that is already final is left as it
 * is; a retry, a duplicate or a race with {@link reconcileOrphans} therefore cannot charge
 * twice.
 */
export async function finalize(pool: pg.Pool, input: FinalizeInput): Promise<FinalizeResult> {
  return closeRequest(pool, input.requestId, finalizeClosing(input));
}

/**
 * The void close of a reservation whose outcome is unknown (its statement was sent, its answer
 * lost), by its reservation's data: `gw_void_reservation` (migration 017) closes the request if
 * its row exists or is being inserted (waiting for that transaction), and otherwise inserts it
 * already final, so a reservation still under way fails on the request id when it arrives and
 * holds nothing. {@link finalize} alone would find no row while the reservation is under way,
 * and the reservation would then land and stay held for the life of the process. `close` must
 * be `failed` and `void`. Exactly once, as {@link finalize}.
 */
export async function voidReservation(
  pool: pg.Pool,
  reservation: ReserveInput,
  close: FinalizeInput,
): Promise<FinalizeResult> {
  if (close.requestId !== reservation.requestId) {
    throw new RangeError("voidReservation: the close is not the reservation's request");
  }
  if (close.status !== "failed" || close.billing !== "void" || close.creditsCharged !== 0n) {
    throw new RangeError("voidReservation: the close must be failed, void and charge nothing");
  }
  const args = reserveArgs(reservation);
  const { rows } = await pool.query<CloseRow>(
    `SELECT finalized, credits_charged::text FROM gw_void_reservation($1, $2, $3, $4, $5, $6, $7,
       $8, $9, $10::numeric, $11::numeric, $12, $13::bigint)`,
    [
      args.request_id,
      args.api_key_id,
      args.instance_id,
      args.model,
      args.model_id,
      args.offer_id,
      args.permit_id,
      args.quote_id,
      args.stream,
      args.maximum,
      args.tariff_version,
      close.error ?? null,
      close.now,
    ],
  );
  const row = rows[0];
  if (row === undefined) throw new LedgerInconsistencyError("gw_void_reservation returned nothing");
  return closeResult(row);
}

/** Checks a finalisation: it is its own {@link Closing}. */
function finalizeClosing(input: FinalizeInput): Closing {
  requireAmount("inputTokens", input.inputTokens);
  requireAmount("outputTokens", input.outputTokens);
  requireAmount("cachedInputTokens", input.cachedInputTokens ?? 0n);
  requireAmount("reasoningTokens", input.reasoningTokens ?? 0n);
  requireFigures("claimed", input.claimed);
  requireFigures("counted", input.counted);
  requireAmount("creditsCharged", input.creditsCharged);
  if (input.billing === "void" && input.creditsCharged !== 0n) {
    throw new RangeError("finalize: a void request is charged nothing");
  }
  return input;
}

/** One item of a batch failed in the database; only that item was rolled back. */
export class LedgerItemError extends BaseError {
  readonly reason = "ledger_item_failed";
  override readonly name = "LedgerItemError";
  /** The SQLSTATE, as on the errors of `pg` (e.g. `23505` for a duplicate key). */
  readonly code: string;

  constructor(code: string, message: string) {
    super(message);
    this.code = code;
  }
}

/** Batches go to `gw_batch_reserve`/`gw_close_batch` with at most this many items (migration 006). */
export const MAX_LEDGER_BATCH = 64;

export interface LedgerBatcherOptions {
  /** The most items in one transaction; at most (and by default) {@link MAX_LEDGER_BATCH}. */
  readonly maxBatch?: number;
  /** The most batches in flight at once, per kind (default 1). */
  readonly maxInFlight?: number;
  /** Items waiting per kind before a submit is refused (backpressure; default: no bound). */
  readonly maxQueued?: number | undefined;
  /** How long an item may wait for its batch before it is refused, never sent (default: no bound). */
  readonly maxWaitMs?: number | undefined;
}

/** {@link reserve} and {@link finalize}, batched. */
export interface LedgerBatcher {
  reserve(input: ReserveInput): Promise<ReserveResult>;
  finalize(input: FinalizeInput): Promise<FinalizeResult>;
  stats(): { readonly reserve: BatcherStats; readonly finalize: BatcherStats };
}

/**
 * {@link reserve} and {@link finalize} with the same inputs, checks, results and guarantees
 * (a reservation is committed before `ok` is returned; a finalisation happens once), sent in
 * natural batches (see batcher.ts): while a batch of reservations is in flight, the next ones
 * queue and then go together in one transaction (`gw_batch_reserve`), and likewise for
 * finalisations (`gw_close_batch`). An item's refusal or database error is its own; when a
 * whole batch fails (the connection was lost, say), each of its items rejects with that error
 * and its outcome is unknown, as when a single call throws. A batch of one (every request,
 * unloaded) is sent to the single function instead, which is the same transaction without the
 * batch's set-up: batching adds no latency when there is nothing to batch.
 */
export function createLedgerBatcher(
  pool: pg.Pool,
  options: LedgerBatcherOptions = {},
): LedgerBatcher {
  const maxBatch = options.maxBatch ?? MAX_LEDGER_BATCH;
  if (maxBatch > MAX_LEDGER_BATCH) {
    throw new RangeError(`maxBatch must be at most ${MAX_LEDGER_BATCH} (got ${maxBatch})`);
  }
  const bounds = { maxQueued: options.maxQueued, maxWaitMs: options.maxWaitMs };
  const reserves = createBatcher<ReserveArgs, ReserveResult>({
    run: (items) => reserveBatch(pool, items),
    maxBatch,
    maxInFlight: options.maxInFlight,
    ...bounds,
  });
  const closes = createBatcher<CloseArgs, FinalizeResult>({
    run: (items) => closeBatch(pool, items),
    maxBatch,
    maxInFlight: options.maxInFlight,
    ...bounds,
  });
  return {
    reserve: async (input) => reserves.submit(reserveArgs(input)),
    finalize: async (input) => closes.submit(closeArgs(input.requestId, finalizeClosing(input))),
    stats: () => ({ reserve: reserves.stats(), finalize: closes.stats() }),
  };
}

async function reserveBatch(
  pool: pg.Pool,
  items: readonly ReserveArgs[],
): Promise<ItemOutcome<ReserveResult>[]> {
  if (items.length === 1) return [{ ok: true, value: await reserveOne(pool, items[0]!) }];
  const { rows } = await pool.query<{ idx: number; outcome: string }>(
    "SELECT idx, outcome FROM gw_batch_reserve($1::jsonb)",
    [JSON.stringify(items)],
  );
  return inItemOrder(rows, items.length, "gw_batch_reserve").map(
    ({ outcome }): ItemOutcome<ReserveResult> => {
      if (outcome === "ok") return { ok: true, value: { ok: true } };
      const reason = refusal(outcome, "");
      if (reason !== undefined) return { ok: true, value: { ok: false, reason } };
      return { ok: false, error: itemError(outcome.replace(/^error:/, "")) };
    },
  );
}

async function closeBatch(
  pool: pg.Pool,
  items: readonly CloseArgs[],
): Promise<ItemOutcome<FinalizeResult>[]> {
  if (items.length === 1) return [{ ok: true, value: await closeOne(pool, items[0]!) }];
  const { rows } = await pool.query<{
    idx: number;
    finalized: boolean | null;
    credits_charged: string | null;
    error: string | null;
  }>("SELECT idx, finalized, credits_charged::text, error FROM gw_close_batch($1::jsonb)", [
    JSON.stringify(items),
  ]);
  return inItemOrder(rows, items.length, "gw_close_batch").map(
    ({ finalized, credits_charged, error }): ItemOutcome<FinalizeResult> => {
      if (error !== null) return { ok: false, error: itemError(error) };
      if (finalized === null || credits_charged === null) {
        return { ok: false, error: new LedgerInconsistencyError("gw_close_batch returned nulls") };
      }
      return { ok: true, value: closeResult({ finalized, credits_charged }) };
    },
  );
}

/** The rows of a batch function by item, checking there is exactly one per item. */
function inItemOrder<T extends { idx: number }>(
  rows: readonly T[],
  count: number,
  fn: string,
): T[] {
  const ordered: T[] = new Array<T>(count);
  for (const row of rows) {
    const i = row.idx - 1;
    if (!(i >= 0 && i < count) || ordered[i] !== undefined) {
      throw new LedgerInconsistencyError(`${fn} returned an unexpected item ${row.idx}`);
    }
    ordered[i] = row;
  }
  if (rows.length !== count) {
    throw new LedgerInconsistencyError(`${fn} returned ${rows.length} rows for ${count} items`);
  }
  return ordered;
}

/** `<sqlstate>: <message>`, as the batch functions report an item's error. */
function itemError(text: string): LedgerItemError {
  const match = /^([0-9A-Z]{5}): ([\s\S]*)$/.exec(text);
  return match ? new LedgerItemError(match[1]!, match[2]!) : new LedgerItemError("XX000", text);
}

export interface SwitchOfferInput {
  readonly requestId: string;
  readonly offerId: Hex;
  /** The new offer's maximum credits, which becomes the reservation. */
  readonly maximumCredits: bigint;
  readonly tariffVersion: bigint;
  /** The new offer's `max_concurrency`. */
  readonly maxConcurrency: number;
  readonly deposit: bigint;
  readonly chainSettled: bigint;
}

/**
 * Failover before the first byte: moves a pending request to another offer in one transaction,
 * releasing its slot on the old offer, taking one on the new, and resizing its reservation to
 * the new maximum (a growth is admitted like a reservation, on the permit and on a capped
 * request's authorization cap). False, with nothing changed, when the new offer is at capacity,
 * the permit or the cap cannot cover the growth, or the request is not pending any more
 * (streaming already, or final).
 */
export async function switchOffer(pool: pg.Pool, input: SwitchOfferInput): Promise<boolean> {
  requireAmount("maximumCredits", input.maximumCredits);
  requireAmount("tariffVersion", input.tariffVersion);
  requireAmount("deposit", input.deposit);
  requireAmount("chainSettled", input.chainSettled);
  const newOffer = input.offerId.toLowerCase();
  return inTransaction<boolean>(pool, async (client) => {
    const { rows } = await client.query<{
      offer_id: string;
      permit_id: string;
      maximum_credits: string;
      authorization_id: string | null;
      authorization_capped: boolean;
    }>(
      `SELECT offer_id, permit_id, maximum_credits, authorization_id, authorization_capped
       FROM inference_requests WHERE id = $1 AND status = 'pending' FOR UPDATE`,
      [input.requestId],
    );
    const request = rows[0];
    if (!request) return refuse(false);

    if (newOffer !== request.offer_id) {
      // Both offer rows are locked in ascending id order (see "Lock order" above).
      const steps = [
        { offerId: newOffer, take: true },
        { offerId: request.offer_id, take: false },
      ].sort((a, b) => (a.offerId < b.offerId ? -1 : 1));
      for (const step of steps) {
        if (step.take) {
          if (!(await takeOfferSlot(client, step.offerId, input.maxConcurrency))) {
            return refuse(false);
          }
        } else {
          await releaseOfferSlot(client, step.offerId);
        }
      }
    }

    const growth = input.maximumCredits - BigInt(request.maximum_credits);
    if (growth > 0n) {
      const grown = await client.query(
        `UPDATE permit_ledgers SET reserved = reserved + $2::numeric, updated_at = now()
         WHERE permit_id = $1
           AND gw_permit_available($3::numeric, $4::numeric, charged, settled, reserved)
             >= $2::numeric`,
        [
          request.permit_id,
          growth.toString(),
          input.deposit.toString(),
          input.chainSettled.toString(),
        ],
      );
      if (grown.rowCount !== 1) return refuse(false);
    } else if (growth < 0n) {
      const shrunk = await client.query(
        `UPDATE permit_ledgers SET reserved = reserved + $2::numeric, updated_at = now()
         WHERE permit_id = $1`,
        [request.permit_id, growth.toString()],
      );
      expectOneRow(shrunk.rowCount, `permit ledger ${request.permit_id}`);
    }
    // A capped request's cap reservation follows its maximum, after the permit (lock order).
    if (request.authorization_capped && growth !== 0n) {
      const resized = await client.query(
        `UPDATE authorization_ledgers SET reserved = reserved + $2::numeric
         WHERE authorization_id = $1 AND ($2::numeric < 0 OR total_cap - used - reserved >= $2::numeric)`,
        [request.authorization_id, growth.toString()],
      );
      if (resized.rowCount !== 1) {
        if (growth > 0n) return refuse(false);
        expectOneRow(resized.rowCount, `authorization ledger ${request.authorization_id}`);
      }
    }

    await client.query(
      `UPDATE inference_requests SET offer_id = $2, maximum_credits = $3, tariff_version = $4
       WHERE id = $1`,
      [input.requestId, newOffer, input.maximumCredits.toString(), input.tariffVersion.toString()],
    );
    return true;
  });
}

/** The database's clock in Unix seconds: liveness is judged on one clock for every process. */
export async function databaseNow(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ now: string }>(
    "SELECT extract(epoch from clock_timestamp())::bigint AS now",
  );
  return Number(rows[0]!.now);
}

/**
 * Records that the process `instanceId` is alive, on the database's clock (`now`, Unix seconds,
 * only where a test places a heartbeat in time). Every process calls this periodically, well
 * within the `staleAfterSeconds` given to {@link reconcileOrphans}. Hosts' own clocks are never
 * compared: a process whose clock runs minutes behind must not look dead to the others.
 */
export async function heartbeat(db: Queryable, instanceId: string, now?: number): Promise<void> {
  await db.query(
    `INSERT INTO gateway_instances AS g (instance_id, started_at, heartbeat_at)
     VALUES ($1, COALESCE($2::bigint, extract(epoch from clock_timestamp())::bigint),
       COALESCE($2::bigint, extract(epoch from clock_timestamp())::bigint))
     ON CONFLICT (instance_id) DO UPDATE
       SET heartbeat_at = GREATEST(g.heartbeat_at, EXCLUDED.heartbeat_at)`,
    [instanceId, now ?? null],
  );
}

export interface ReconcileOrphansInput {
  /** Unix seconds; absent (as in production): the database's clock, the one heartbeats use. */
  readonly now?: number;
  readonly staleAfterSeconds: number;
  /** At most this many orphans per call (default 1000); call again for more. */
  readonly limit?: number;
}

/**
 * Ends the requests of processes that died. The rule:
 *
 * A request that is still pending or streaming is an **orphan** when the last sign of life of
 * the process serving it is more than `staleAfterSeconds` old, that sign being the later of
 * the process's heartbeat (none if its `gateway_instances` row is missing) and the request's
 * own creation (a process that just made a request was alive then, even if it has not sent
 * its first heartbeat yet). Both are the database's clock (`created_at` is written by the
 * database at insert, migration 016), so no host's clock enters the rule. An orphan is finalized `failed`, billing `void`, charged 0, with
 * error `orphaned`, and its reservation and offer slot are released. Its client got no
 * complete answer, and the gateway cannot know what was delivered before the crash, so the
 * client is never charged for it (the provider's work is lost to the crash, as it would be
 * without the gateway).
 *
 * Each orphan is ended by the same exactly-once update as {@link finalize}, with the staleness
 * re-checked in it, so this is safe to run from every process at once and concurrently with
 * the owners' own finalize: whichever comes first wins, the others change nothing. If a process
 * was only paused and comes back, its `finalize` returns `finalized: false` and its
 * `markStreaming` false.
 *
 * @returns how many requests this call finalized.
 */
export async function reconcileOrphans(
  pool: pg.Pool,
  input: ReconcileOrphansInput,
): Promise<number> {
  const now = input.now ?? (await databaseNow(pool));
  const cutoff = now - input.staleAfterSeconds;
  const { rows } = await pool.query<{ id: string }>(
    `SELECT r.id FROM inference_requests r
     LEFT JOIN gateway_instances g ON g.instance_id = r.instance_id
     WHERE r.status IN ('pending', 'streaming') AND GREATEST(g.heartbeat_at, r.created_at) < $1
     ORDER BY r.created_at, r.id
     LIMIT $2`,
    [cutoff, input.limit ?? 1000],
  );
  let finalized = 0;
  for (const { id } of rows) {
    const result = await closeRequest(
      pool,
      id,
      {
        status: "failed",
        inputTokens: null,
        outputTokens: null,
        creditsCharged: 0n,
        billing: "void",
        usageSource: null,
        error: "orphaned",
        now,
      },
      cutoff,
    );
    if (result.finalized) finalized++;
  }
  return finalized;
}

export interface OfferFlagInput {
  readonly offerId: Hex;
  readonly requestId: string;
  /** Why, e.g. that the provider reported more usage than the gateway could account for. */
  readonly reason: string;
  readonly now: number;
}

/** Flags an offer for review; flags are evidence, they do not change routing by themselves. */
export async function recordOfferFlag(db: Queryable, flag: OfferFlagInput): Promise<void> {
  await db.query(
    "INSERT INTO offer_flags (offer_id, request_id, reason, created_at) VALUES ($1, $2, $3, $4)",
    [flag.offerId.toLowerCase(), flag.requestId, flag.reason, flag.now],
  );
}

// The ledger's shape and the availability rule are the domain's (src/domain/permit-balance.ts),
// shared with the permit balance; re-exported for this module's callers.
export { availableCredits, type PermitLedger };

/** The permit's ledger; zeros when the gateway has never reserved against it. */
export async function permitLedger(db: Queryable, permitId: Hex): Promise<PermitLedger> {
  const { rows } = await db.query<{
    reserved: string;
    charged: string;
    settled: string;
    unsettleable: string;
  }>("SELECT reserved, charged, settled, unsettleable FROM permit_ledgers WHERE permit_id = $1", [
    permitId.toLowerCase(),
  ]);
  const row = rows[0];
  if (!row) return { ...emptyPermitLedger };
  return {
    reserved: BigInt(row.reserved),
    charged: BigInt(row.charged),
    settled: BigInt(row.settled),
    unsettleable: BigInt(row.unsettleable),
  };
}

/** A close as {@link closeRequest} writes it: a {@link CloseRecord}, or the orphan rule's. */
interface Closing extends Omit<CloseRecord, "inputTokens" | "outputTokens" | "usageSource"> {
  /** null keeps what the request has. */
  readonly inputTokens: bigint | null;
  readonly outputTokens: bigint | null;
  readonly usageSource: UsageSource | null;
}

/**
 * The one place a request becomes final. With `orphanedBefore`, only if the request is (still)
 * an orphan by the rule of {@link reconcileOrphans}, checked in the same statement.
 */
async function closeRequest(
  pool: pg.Pool,
  requestId: string,
  closing: Closing,
  orphanedBefore?: number,
): Promise<FinalizeResult> {
  return closeOne(pool, closeArgs(requestId, closing), orphanedBefore);
}

async function closeOne(
  pool: pg.Pool,
  args: CloseArgs,
  orphanedBefore?: number,
): Promise<FinalizeResult> {
  // One statement, committed on its own (migration 005). The status condition makes it exactly
  // once: a concurrent close of the same request waits for our row lock, then finds it final.
  const { rows } = await pool.query<CloseRow>(
    `SELECT finalized, credits_charged::text FROM gw_close_request($1, $2, $3::numeric, $4::numeric,
       $5::numeric, $6, $7, $8, $9::bigint, $10::bigint, $11::numeric, $12::numeric, $13::jsonb,
       $14::jsonb)`,
    [
      args.request_id,
      args.status,
      args.input_tokens,
      args.output_tokens,
      args.credits_charged,
      args.billing,
      args.usage_source,
      args.error,
      args.now,
      orphanedBefore ?? null,
      args.cached_input_tokens,
      args.reasoning_tokens,
      args.claimed === null ? null : JSON.stringify(args.claimed),
      args.counted === null ? null : JSON.stringify(args.counted),
    ],
  );
  const row = rows[0];
  if (row === undefined) throw new LedgerInconsistencyError("gw_close_request returned nothing");
  return closeResult(row);
}

/**
 * gw_close_request's arguments but the orphan rule, named as it names them without the `p_`,
 * as JSON values: the arguments of {@link closeOne} and an item of `gw_close_batch`.
 */
interface CloseArgs extends CloseColumns {
  readonly request_id: string;
}

/** A close's columns as JSON values: also of an item of `gw_close_leased_batch` (leases.ts). */
export interface CloseColumns {
  readonly status: FinalRequestStatus;
  readonly input_tokens: string | null;
  readonly output_tokens: string | null;
  readonly credits_charged: string;
  readonly billing: Billing;
  readonly usage_source: UsageSource | null;
  readonly error: string | null;
  readonly now: number;
  readonly cached_input_tokens: string;
  readonly reasoning_tokens: string;
  /** The provider's claim and the gateway's count (migration 026); null: none. */
  readonly claimed: FiguresColumns | null;
  readonly counted: FiguresColumns | null;
}

/** {@link UsageFigures} as the close statements take them (decimal strings). */
export interface FiguresColumns {
  readonly input_tokens: string;
  readonly output_tokens: string;
  readonly cached_input_tokens: string;
  readonly reasoning_tokens: string;
}

function figuresColumns(figures: UsageFigures | undefined): FiguresColumns | null {
  if (figures === undefined) return null;
  return {
    input_tokens: figures.inputTokens.toString(),
    output_tokens: figures.outputTokens.toString(),
    cached_input_tokens: figures.cachedInputTokens.toString(),
    reasoning_tokens: figures.reasoningTokens.toString(),
  };
}

function closeArgs(requestId: string, closing: Closing): CloseArgs {
  return { request_id: requestId, ...closeColumns(closing) };
}

export function closeColumns(closing: Closing): CloseColumns {
  return {
    status: closing.status,
    input_tokens: closing.inputTokens?.toString() ?? null,
    output_tokens: closing.outputTokens?.toString() ?? null,
    credits_charged: closing.creditsCharged.toString(),
    billing: closing.billing,
    usage_source: closing.usageSource,
    error: closing.error ?? null,
    now: closing.now,
    cached_input_tokens: (closing.cachedInputTokens ?? 0n).toString(),
    reasoning_tokens: (closing.reasoningTokens ?? 0n).toString(),
    claimed: figuresColumns(closing.claimed),
    counted: figuresColumns(closing.counted),
  };
}

interface CloseRow {
  finalized: boolean;
  credits_charged: string;
}

function closeResult(row: CloseRow): FinalizeResult {
  return { finalized: row.finalized, creditsCharged: BigInt(row.credits_charged) };
}

/**
 * Takes one of the offer's `maxConcurrency` slots; false when all are taken. One statement: a
 * missing row is created with this slot in it, an existing one is incremented only while below
 * the limit, checked on its newest version (see the module comment).
 */
async function takeOfferSlot(
  client: pg.PoolClient,
  offerId: string,
  maxConcurrency: number,
): Promise<boolean> {
  if (!(maxConcurrency >= 1)) return false;
  const { rowCount } = await client.query(
    `INSERT INTO offer_loads AS l (offer_id, in_flight) VALUES ($1, 1)
     ON CONFLICT (offer_id) DO UPDATE SET in_flight = l.in_flight + 1 WHERE l.in_flight < $2`,
    [offerId, Math.floor(maxConcurrency)],
  );
  return rowCount === 1;
}

async function releaseOfferSlot(client: pg.PoolClient, offerId: string): Promise<void> {
  // in_flight >= 0 is a CHECK: releasing a slot nobody holds fails rather than drifting.
  const { rowCount } = await client.query(
    "UPDATE offer_loads SET in_flight = in_flight - 1 WHERE offer_id = $1",
    [offerId],
  );
  expectOneRow(rowCount, `offer load ${offerId}`);
}

function expectOneRow(rowCount: number | null, what: string): void {
  if (rowCount !== 1) throw new LedgerInconsistencyError(`${what} is missing`);
}

function requireAmount(name: string, value: bigint): void {
  if (value < 0n) throw new RangeError(`${name} must not be negative (got ${value})`);
}

function requireFigures(name: string, figures: UsageFigures | undefined): void {
  if (figures === undefined) return;
  requireAmount(`${name}.inputTokens`, figures.inputTokens);
  requireAmount(`${name}.outputTokens`, figures.outputTokens);
  requireAmount(`${name}.cachedInputTokens`, figures.cachedInputTokens);
  requireAmount(`${name}.reasoningTokens`, figures.reasoningTokens);
}

/** A transaction's result that must not be committed: everything it wrote is rolled back. */
class Refusal<T> {
  constructor(readonly value: T) {}
}

function refuse<T>(value: T): Refusal<T> {
  return new Refusal(value);
}

/**
 * Runs `body` in a transaction on one client: commits what it returns, rolls back on a
 * {@link Refusal} (returning its value) or an error (rethrown). A client whose transaction
 * state is unknown because even ROLLBACK failed is destroyed rather than returned to the pool,
 * where the next user would find itself inside our transaction; after a failed query whose
 * ROLLBACK worked, the connection is fine and goes back.
 */
export async function inTransaction<T>(
  pool: pg.Pool,
  body: (client: pg.PoolClient) => Promise<T | Refusal<T>>,
): Promise<T> {
  const client = await pool.connect();
  let discard: Error | boolean = false;
  try {
    // Explicit: a different server default must not change what the module comment relies on.
    await client.query("BEGIN ISOLATION LEVEL READ COMMITTED");
    const result = await body(client);
    if (result instanceof Refusal) {
      await client.query("ROLLBACK");
      return result.value;
    }
    await client.query("COMMIT");
    return result;
  } catch (err) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      discard = rollbackError instanceof Error ? rollbackError : true;
    }
    throw err;
  } finally {
    client.release(discard);
  }
}
