/**
 * Closes at the ledger (ledger.ts): a request's one close (`gw_close_request`), the void close
 * of a reservation whose outcome is unknown, and a close's columns as the statements take them.
 */
import type pg from "pg";
import type { CloseRecord, UsageFigures } from "../../../domain/chat/index.js";
import { LedgerInconsistencyError, requireAmount, requireFigures } from "../ledger-tx.js";
import { reserveArgs, type ReserveInput } from "./reserve.js";
import type { Billing, FinalRequestStatus, UsageSource } from "../requests.js";

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
export function finalizeClosing(input: FinalizeInput): Closing {
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

/** A close as {@link closeRequest} writes it: a {@link CloseRecord}, or the orphan rule's. */
export interface Closing extends Omit<CloseRecord, "inputTokens" | "outputTokens" | "usageSource"> {
  /** null keeps what the request has. */
  readonly inputTokens: bigint | null;
  readonly outputTokens: bigint | null;
  readonly usageSource: UsageSource | null;
}

/**
 * The one place a request becomes final. With `orphanedBefore`, only if the request is (still)
 * an orphan by the rule of {@link reconcileOrphans}, checked in the same statement.
 */
export async function closeRequest(
  pool: pg.Pool,
  requestId: string,
  closing: Closing,
  orphanedBefore?: number,
): Promise<FinalizeResult> {
  return closeOne(pool, closeArgs(requestId, closing), orphanedBefore);
}

export async function closeOne(
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
export interface CloseArgs extends CloseColumns {
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

export function closeArgs(requestId: string, closing: Closing): CloseArgs {
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

export function closeResult(row: CloseRow): FinalizeResult {
  return { finalized: row.finalized, creditsCharged: BigInt(row.credits_charged) };
}
