import type { Hex } from "viem";
import type { Billing, UsageFigures, UsageSource } from "../../domain/chat/types.js";
import type {
  FinalRequestStatus,
  RequestRecord,
  RequestStatus,
  SettlementStatus,
} from "../../domain/requests.js";
import type { Queryable } from "./registrations.js";

export type {
  Billing,
  FinalRequestStatus,
  RequestRecord,
  RequestStatus,
  SettlementStatus,
  UsageSource,
};

/** A row of `inference_requests` as {@link recordColumns} selects it. */
export interface RequestDbRow {
  id: string;
  api_key_id: string;
  instance_id: string;
  model: string;
  model_id: string;
  offer_id: string;
  permit_id: string;
  quote_id: string;
  stream: boolean;
  status: RequestStatus;
  input_tokens: string;
  output_tokens: string;
  cached_input_tokens: string;
  reasoning_tokens: string;
  maximum_credits: string;
  credits_charged: string | null;
  billing: Billing | null;
  usage_source: UsageSource | null;
  claimed_input_tokens: string | null;
  claimed_output_tokens: string | null;
  claimed_cached_input_tokens: string | null;
  claimed_reasoning_tokens: string | null;
  counted_input_tokens: string | null;
  counted_output_tokens: string | null;
  counted_cached_input_tokens: string | null;
  counted_reasoning_tokens: string | null;
  tariff_version: string;
  error: string | null;
  created_at: string;
  completed_at: string | null;
  settlement_status: SettlementStatus;
  batch_id: string | null;
  tx_hash: string | null;
  settled_at: string | null;
  settlement_reason: string | null;
}

/**
 * The request's record, or undefined when there is none or when another API key made it: a
 * record is visible only to its own key, and "not yours" must look exactly like "not found"
 * (404 `request_not_found`), so that request ids cannot be probed.
 */
export async function getRequest(
  db: Queryable,
  id: string,
  apiKeyId: string,
): Promise<RequestRecord | undefined> {
  const { rows } = await db.query<RequestDbRow>(
    `SELECT ${recordColumns} FROM inference_requests WHERE id = $1 AND api_key_id = $2`,
    [id, apiKeyId],
  );
  const row = rows[0];
  return row ? toRequestRecord(row) : undefined;
}

/** The columns of a request's record (what {@link toRequestRecord} reads). */
export const recordColumns = `id, api_key_id, instance_id, model, model_id, offer_id, permit_id, quote_id,
  stream, status, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens,
  maximum_credits, credits_charged, billing, usage_source, tariff_version, error, created_at,
  completed_at, settlement_status, batch_id, tx_hash, settled_at, settlement_reason,
  claimed_input_tokens, claimed_output_tokens, claimed_cached_input_tokens,
  claimed_reasoning_tokens, counted_input_tokens, counted_output_tokens,
  counted_cached_input_tokens, counted_reasoning_tokens`;

/** {@link recordColumns} of the request row `r`. */
const chargedColumns = recordColumns
  .split(",")
  .map((c) => `r.${c.trim()}`)
  .join(", ");

/**
 * The charged records of a permit, whichever API key made them, in the order they closed
 * (`completed_at`, then id), at most `limit`, from after the record `startingAfter` (a request
 * id of the permit; one that is not gives an empty page). What receipts are listed from
 * (`GET /v1/permits/{id}/receipts`); the caller decides who may see them. Each record's
 * `batchId` is the settlement batch that settled it or is settling it: a batch's requests are
 * the records that name it (migration 008; a failed batch's records are released and name none).
 * Served by inference_charges (migration 031: a row per charged close, indexed by permit and
 * completion), joined to the records by id.
 */
export async function listChargedRequests(
  db: Queryable,
  permitId: Hex,
  limit: number,
  startingAfter: string | undefined,
): Promise<RequestRecord[]> {
  const { rows } =
    startingAfter === undefined
      ? await db.query<RequestDbRow>(
          `SELECT ${chargedColumns} FROM inference_charges c
           JOIN inference_requests r ON r.id = c.request_id
           WHERE c.permit_id = $1
           ORDER BY c.completed_at, c.request_id LIMIT $2`,
          [permitId, limit],
        )
      : await db.query<RequestDbRow>(
          `SELECT ${chargedColumns} FROM inference_charges c
           JOIN inference_requests r ON r.id = c.request_id
           WHERE c.permit_id = $1
             AND (c.completed_at, c.request_id) > (
               SELECT a.completed_at, a.request_id FROM inference_charges a
               WHERE a.permit_id = $1 AND a.request_id = $3)
           ORDER BY c.completed_at, c.request_id LIMIT $2`,
          [permitId, limit, startingAfter],
        );
  return rows.map(toRequestRecord);
}

export function toRequestRecord(row: RequestDbRow): RequestRecord {
  return {
    id: row.id,
    apiKeyId: row.api_key_id,
    instanceId: row.instance_id,
    model: row.model,
    modelId: row.model_id as Hex,
    offerId: row.offer_id as Hex,
    permitId: row.permit_id as Hex,
    quoteId: row.quote_id,
    stream: row.stream,
    status: row.status,
    inputTokens: BigInt(row.input_tokens),
    outputTokens: BigInt(row.output_tokens),
    cachedInputTokens: BigInt(row.cached_input_tokens),
    reasoningTokens: BigInt(row.reasoning_tokens),
    maximumCredits: BigInt(row.maximum_credits),
    creditsCharged: row.credits_charged === null ? null : BigInt(row.credits_charged),
    billing: row.billing,
    usageSource: row.usage_source,
    claimed: figures(
      row.claimed_input_tokens,
      row.claimed_output_tokens,
      row.claimed_cached_input_tokens,
      row.claimed_reasoning_tokens,
    ),
    counted: figures(
      row.counted_input_tokens,
      row.counted_output_tokens,
      row.counted_cached_input_tokens,
      row.counted_reasoning_tokens,
    ),
    tariffVersion: BigInt(row.tariff_version),
    error: row.error,
    createdAt: Number(row.created_at),
    completedAt: row.completed_at === null ? null : Number(row.completed_at),
    settlementStatus: row.settlement_status,
    batchId: row.batch_id,
    txHash: row.tx_hash as Hex | null,
    settledAt: row.settled_at === null ? null : Number(row.settled_at),
    settlementReason: row.settlement_reason,
  };
}

/** One group of figure columns (written whole or not at all); null when none was written. */
function figures(
  input: string | null,
  output: string | null,
  cached: string | null,
  reasoning: string | null,
): UsageFigures | null {
  if (input === null || output === null) return null;
  return {
    inputTokens: BigInt(input),
    outputTokens: BigInt(output),
    cachedInputTokens: BigInt(cached ?? "0"),
    reasoningTokens: BigInt(reasoning ?? "0"),
  };
}
