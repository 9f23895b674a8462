/**
 * Admission at the ledger (ledger.ts): a request's reservation (`gw_reserve`), its move to
 * streaming, and failover's switch to another offer.
 */
import type pg from "pg";
import type { Hex } from "viem";
import type {
  ReserveInput as Reservation,
  ReserveRefusal,
  ReserveResult,
} from "../../../domain/chat/ports.js";
import { quoteColumns, type NewQuote } from "../quotes.js";
import type { Queryable } from "../registrations.js";
import { expectOneRow, inTransaction, refuse, requireAmount } from "../ledger-tx.js";

/**
 * A reservation as the database takes it: the domain's port ({@link Reservation}, declared once
 * in src/domain/chat/ports.ts) less what only the leases read, with the serving process, an
 * internal quote as its row, and a test's placing in time.
 */
export interface ReserveInput extends Omit<
  Reservation,
  "requestId" | "quoteId" | "now" | "durable" | "permitExpiresAt" | "quote"
> {
  readonly requestId: string;
  readonly quoteId: string;
  /** The gateway process serving the request (see {@link heartbeat}). */
  readonly instanceId: string;
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
}

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

export async function reserveOne(pool: pg.Pool, args: ReserveArgs): Promise<ReserveResult> {
  try {
    // One statement, committed on its own: see migration 005 for why and how.
    await pool.query(
      `SELECT gw_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::numeric, $11::numeric,
         $12::numeric, $13::numeric, $14::numeric, $15::integer, $16::bigint, $17::jsonb, $18,
         $19::boolean, $20::bigint)`,
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
export interface ReserveArgs {
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
  /** The start of the period a periodically capped request counts against; null: none. */
  readonly period_start: number | null;
}

/** Checks a reservation and maps it to gw_reserve's arguments. */
export function reserveArgs(input: ReserveInput): ReserveArgs {
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
  if (input.periodStart !== undefined && input.capped !== true) {
    throw new RangeError("reserve: a request counted against a period is capped");
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
    period_start: input.periodStart ?? null,
  };
}

const REFUSALS: readonly string[] = [
  "quote_used",
  "offer_at_capacity",
  "insufficient_credits",
  "authorization_cap_exhausted",
  "authorization_period_cap_exhausted",
] satisfies readonly ReserveRefusal[];

/** The refusal that `text` names after `prefix`, if it names one. */
export function refusal(text: string, prefix: string): ReserveRefusal | undefined {
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
      authorization_period_start: string | null;
    }>(
      `SELECT offer_id, permit_id, maximum_credits, authorization_id, authorization_capped,
              authorization_period_start
       FROM inference_requests WHERE id = $1 AND status = 'pending' FOR UPDATE`,
      [input.requestId],
    );
    const request = rows[0];
    if (!request) return refuse(false);

    if (newOffer !== request.offer_id) {
      // Both offer rows are locked in ascending id order (see "Lock order", ledger.ts).
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
    // A capped request's cap reservation follows its maximum, after the permit (lock order),
    // and so does its period's, while the row's period is still the request's (migration 039).
    if (request.authorization_capped && growth !== 0n) {
      const resized = await client.query(
        `UPDATE authorization_ledgers SET reserved = reserved + $2::numeric,
           period_reserved = CASE WHEN period_start = $3::bigint
             THEN period_reserved + $2::numeric ELSE period_reserved END
         WHERE authorization_id = $1 AND ($2::numeric < 0 OR (
           (total_cap = 0 OR total_cap - used - reserved >= $2::numeric)
           AND (period_cap = 0 OR period_start IS DISTINCT FROM $3::bigint
                OR period_cap - period_used - period_reserved >= $2::numeric)))`,
        [request.authorization_id, growth.toString(), request.authorization_period_start],
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

/**
 * Takes one of the offer's `maxConcurrency` slots; false when all are taken. One statement: a
 * missing row is created with this slot in it, an existing one is incremented only while below
 * the limit, checked on its newest version (see ledger.ts).
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
