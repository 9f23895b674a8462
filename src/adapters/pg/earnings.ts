import type { Hex } from "viem";
import type {
  EarningsBatch,
  EarningsRows,
  EarningsState,
  EarningsStore,
} from "../../domain/offer-earnings.js";
import type { BatchRecord } from "../../domain/settlement/index.js";
import type { Queryable } from "./api-keys.js";

export type { BatchRecord };

/**
 * What providers and the settlement console read of settlement: an offer's charges over a
 * window by settlement state (with the batches that carry them), and the recent batches. Reads
 * only; the settlement module (settlement.ts) writes these rows.
 */

type BatchStatus = EarningsBatch["status"];

interface GroupJson {
  state: EarningsState;
  reason: string | null;
  requests: string;
  input_tokens: string;
  output_tokens: string;
  credits: string;
}

interface DayJson {
  starts_at: string | number;
  requests: string;
  credits: string;
  settled_credits: string;
}

interface BatchJson {
  batch_id: string;
  status: BatchStatus;
  tx_hash: string | null;
  created_at: number;
  settled_at: number | null;
  requests: string;
  credits: string;
}

/**
 * One statement, so the totals and the batches are one snapshot: a flush that settles a batch
 * between two reads would otherwise show its charges both settling and in a settled batch.
 * Sums are cast to text inside the JSON (a JSON number would not survive above 2^53); the days
 * are the same charges by UTC day of completion (earnings over time). The charges
 * are a final request's with a charge (`credits_charged > 0`: open requests have none, void ones
 * are 0), found through inference_charges (migration 031), indexed on (offer_id, completed_at).
 */
export async function readOfferEarnings(
  db: Queryable,
  args: { offerId: Hex; from: number; to: number; limit: number },
): Promise<EarningsRows> {
  const { rows } = await db.query<{
    groups: GroupJson[] | null;
    days: DayJson[] | null;
    batches: BatchJson[] | null;
  }>(
    `WITH charges AS (
       SELECT r.settlement_status, r.settlement_reason, r.batch_id, r.input_tokens,
         r.output_tokens, r.credits_charged, c.completed_at
       FROM inference_charges c JOIN inference_requests r ON r.id = c.request_id
       WHERE c.offer_id = $1 AND c.completed_at >= $2 AND c.completed_at < $3
         AND r.credits_charged > 0
         AND r.settlement_status IN ('unsettled', 'settling', 'settled', 'unsettleable')
     ), groups AS (
       SELECT settlement_status AS state,
         CASE WHEN settlement_status = 'unsettleable' THEN settlement_reason END AS reason,
         count(*)::text AS requests, sum(input_tokens)::text AS input_tokens,
         sum(output_tokens)::text AS output_tokens, sum(credits_charged)::text AS credits
       FROM charges GROUP BY 1, 2
     ), days AS (
       SELECT (completed_at / 86400) * 86400 AS starts_at, count(*)::text AS requests,
         sum(credits_charged)::text AS credits,
         coalesce(sum(credits_charged) FILTER (WHERE settlement_status = 'settled'), 0)::text
           AS settled_credits
       FROM charges GROUP BY 1
     ), in_batches AS (
       SELECT batch_id, count(*)::text AS requests, sum(credits_charged)::text AS credits
       FROM charges WHERE batch_id IS NOT NULL GROUP BY batch_id
     ), batches AS (
       SELECT b.batch_id, b.status, b.tx_hash, b.created_at, b.settled_at, c.requests, c.credits
       FROM in_batches c JOIN settlement_batches b ON b.batch_id = c.batch_id
       ORDER BY b.created_at DESC, b.batch_id DESC
       LIMIT $4
     )
     SELECT (SELECT json_agg(groups) FROM groups) AS groups,
       (SELECT json_agg(days ORDER BY starts_at) FROM days) AS days,
       (SELECT json_agg(batches ORDER BY created_at DESC, batch_id DESC) FROM batches) AS batches`,
    [args.offerId, args.from, args.to, args.limit + 1],
  );
  const row = rows[0];
  return {
    groups: (row?.groups ?? []).map((g) => ({
      state: g.state,
      reason: g.reason,
      requests: Number(g.requests),
      inputTokens: BigInt(g.input_tokens),
      outputTokens: BigInt(g.output_tokens),
      credits: BigInt(g.credits),
    })),
    days: (row?.days ?? []).map((d) => ({
      startsAt: Number(d.starts_at),
      requests: Number(d.requests),
      credits: BigInt(d.credits),
      settledCredits: BigInt(d.settled_credits),
    })),
    batches: (row?.batches ?? []).map((b) => ({
      batchId: b.batch_id as Hex,
      status: b.status,
      txHash: b.tx_hash as Hex | null,
      createdAt: Number(b.created_at),
      settledAt: b.settled_at === null ? null : Number(b.settled_at),
      requests: Number(b.requests),
      credits: BigInt(b.credits),
    })),
  };
}

export function createPgEarningsStore(db: Queryable): EarningsStore {
  return { read: (args) => readOfferEarnings(db, args) };
}

/** The most recent batches (all accounts), newest first; `status` filters. */
export async function listBatches(
  db: Queryable,
  args: { limit: number; status?: BatchStatus | undefined },
): Promise<BatchRecord[]> {
  const { rows } = await db.query<{
    batch_id: string;
    status: BatchStatus;
    requests: number;
    credits: string;
    tx_hash: string | null;
    created_at: string;
    settled_at: string | null;
    error: string | null;
  }>(
    `SELECT batch_id, status, requests, credits, tx_hash, created_at, settled_at, error
     FROM settlement_batches WHERE $2::text IS NULL OR status = $2
     ORDER BY created_at DESC, batch_id DESC LIMIT $1`,
    [args.limit, args.status ?? null],
  );
  return rows.map((r) => ({
    batchId: r.batch_id as Hex,
    status: r.status,
    requests: Number(r.requests),
    credits: BigInt(r.credits),
    txHash: r.tx_hash as Hex | null,
    createdAt: Number(r.created_at),
    settledAt: r.settled_at === null ? null : Number(r.settled_at),
    error: r.error,
  }));
}
