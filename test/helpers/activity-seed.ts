import type { Queryable } from "../../src/adapters/pg/registrations.js";

/**
 * Request records in bulk, shaped as the gateway writes them (migration 004 and after: open
 * records with no charge, closed ones with counts, claim, count and charge), for the activity
 * suites and bench/activity.ts: one INSERT ... SELECT over generate_series.
 *
 * Record i (0-based) of a seed: model `models[i % 3]`, offer `offers[i % 3][(i / 3) % 2]`, permit
 * `permits[(i / 2) % 2]`, made at `start + floor(i / 2) * step` (pairs share a second, so the
 * id breaks ties), status by i % 20 (16 completed, 2 failed, 1 cancelled, 1 pending); charged
 * counts and credits (1e12 base units per token weight, so sums exceed 2^53) on closed ones; a
 * claim on all closed but every fifth, a count on all closed but every seventh.
 */
export interface SeedSpec {
  readonly apiKeyId: string;
  readonly count: number;
  /** Unix seconds of record 0. */
  readonly start: number;
  /** Seconds between the pairs of records. */
  readonly step: number;
  readonly models: readonly [string, string, string];
  readonly offers: readonly [
    readonly [string, string],
    readonly [string, string],
    readonly [string, string],
  ];
  readonly permits: readonly [string, string];
  /** Distinguishes the ids of seeds on one database. */
  readonly tag: string;
  /** The authorization every record was admitted through (a payer's usage reads by it). */
  readonly authorizationId?: string;
}

export async function seedRequests(db: Queryable, spec: SeedSpec): Promise<void> {
  await db.query(
    `WITH s AS (
       SELECT i, (ARRAY['pending','completed','completed','completed','completed','completed',
                        'completed','completed','completed','completed','completed','completed',
                        'completed','completed','completed','completed','completed','failed',
                        'failed','cancelled'])[i % 20 + 1] AS status
       FROM generate_series(0, $2::int - 1) AS i)
     INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
       permit_id, quote_id, stream, status, input_tokens, output_tokens, maximum_credits,
       credits_charged, billing, usage_source, tariff_version, error, created_at, completed_at,
       settlement_status, claimed_input_tokens, claimed_output_tokens, counted_input_tokens,
       counted_output_tokens, leased, authorization_id)
     SELECT '0x' || encode(sha256(($8 || ':' || i)::bytea), 'hex'), $1, 'gw_seed',
       ($5::text[])[i % 3 + 1], '0x' || encode(sha256(($5::text[])[i % 3 + 1]::bytea), 'hex'),
       ($6::text[])[(i % 3) * 2 + (i / 3) % 2 + 1], ($7::text[])[(i / 2) % 2 + 1],
       '0x' || encode(sha256(($8 || ':q:' || i)::bytea), 'hex'), i % 2 = 0, status,
       CASE WHEN status = 'pending' THEN 0 ELSE 10 + i % 50 END,
       CASE WHEN status = 'pending' THEN 0 ELSE i % 37 END,
       1000000000000000000,
       CASE WHEN status = 'pending' THEN NULL
            ELSE ((10 + i % 50) * 3 + (i % 37) * 7)::numeric * 1000000000000 END,
       CASE WHEN status = 'pending' THEN NULL WHEN status = 'completed' THEN 'billed'
            ELSE 'partial' END,
       CASE WHEN status = 'pending' THEN NULL ELSE 'gateway' END,
       0, CASE WHEN status = 'failed' THEN 'upstream_error' END,
       $3::bigint + (i / 2) * $4::bigint,
       CASE WHEN status = 'pending' THEN NULL ELSE $3::bigint + (i / 2) * $4::bigint + 2 END,
       'unsettled',
       CASE WHEN status = 'pending' OR i % 5 = 0 THEN NULL ELSE 11 + i % 50 END,
       CASE WHEN status = 'pending' OR i % 5 = 0 THEN NULL ELSE i % 37 END,
       CASE WHEN status = 'pending' OR i % 7 = 0 THEN NULL ELSE 10 + i % 50 END,
       CASE WHEN status = 'pending' OR i % 7 = 0 THEN NULL ELSE 1 + i % 37 END,
       true, $9::text
     FROM s`,
    [
      spec.apiKeyId,
      spec.count,
      spec.start,
      spec.step,
      spec.models,
      spec.offers.flat(),
      spec.permits,
      spec.tag,
      spec.authorizationId ?? null,
    ],
  );
}

/** Record i of a seed as {@link seedRequests} writes it, computed here independently. */
export interface SeededRecord {
  readonly model: string;
  readonly offerId: string;
  readonly permitId: string;
  readonly status: "pending" | "completed" | "failed" | "cancelled";
  readonly createdAt: number;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly claimedInput: bigint;
  readonly claimedOutput: bigint;
  readonly countedInput: bigint;
  readonly countedOutput: bigint;
  readonly credits: bigint;
}

export function seededRecord(spec: SeedSpec, i: number): SeededRecord {
  const r = i % 20;
  const status = r === 0 ? "pending" : r <= 16 ? "completed" : r <= 18 ? "failed" : "cancelled";
  const open = status === "pending";
  const input = open ? 0n : BigInt(10 + (i % 50));
  const output = open ? 0n : BigInt(i % 37);
  const claimed = !open && i % 5 !== 0;
  const counted = !open && i % 7 !== 0;
  return {
    model: spec.models[i % 3]!,
    offerId: spec.offers[i % 3]![Math.floor(i / 3) % 2]!,
    permitId: spec.permits[Math.floor(i / 2) % 2]!,
    status,
    createdAt: spec.start + Math.floor(i / 2) * spec.step,
    inputTokens: input,
    outputTokens: output,
    claimedInput: claimed ? BigInt(11 + (i % 50)) : 0n,
    claimedOutput: claimed ? BigInt(i % 37) : 0n,
    countedInput: counted ? BigInt(10 + (i % 50)) : 0n,
    countedOutput: counted ? BigInt(1 + (i % 37)) : 0n,
    credits: open ? 0n : (input * 3n + output * 7n) * 1_000_000_000_000n,
  };
}
