/**
 * The ledger's reservations and closes in batches (group commit, ledger.ts "Batches"):
 * `gw_batch_reserve` and `gw_close_batch` behind {@link createLedgerBatcher}.
 */
import type pg from "pg";
import { BaseError } from "../../../domain/base-error.js";
import { createBatcher, type BatcherStats, type ItemOutcome } from "../batcher.js";
import {
  closeArgs,
  closeOne,
  closeResult,
  finalizeClosing,
  type CloseArgs,
  type FinalizeInput,
  type FinalizeResult,
} from "./close.js";
import {
  refusal,
  reserveArgs,
  reserveOne,
  type ReserveArgs,
  type ReserveInput,
} from "./reserve.js";
import type { ReserveResult } from "../../../domain/chat/ports.js";
import { LedgerInconsistencyError } from "../ledger-tx.js";

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
