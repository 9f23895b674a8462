import type pg from "pg";
import type { Hex } from "viem";
import {
  bucketSeconds,
  type RequestFilter,
  type UsageBucket,
  type UsageGroup,
  type UsageScope,
} from "../../domain/activity.js";
import type { RequestRecord } from "../../domain/requests.js";
import { inTransaction } from "./ledger-tx.js";
import type { Queryable } from "./registrations.js";
import { recordColumns, toRequestRecord, type RequestDbRow } from "./requests.js";

/**
 * A key's requests and the usage of a key or a permit (GET /v1/requests, GET /v1/usage), read
 * through the indexes of migration 038: a key's rows by creation (api_key_id, created_at, id), a
 * permit's by creation (permit_id, created_at). Neither index names a column the close writes,
 * so what the close wrote (status, offer, counts, charge) is read from the heap rows of the range.
 */

export interface SqlQuery {
  readonly text: string;
  readonly values: unknown[];
}

/**
 * The page of a key's records newest first (created_at, then id, descending) after the record
 * `startingAfter` (a request of the same key; another id gives an empty page), narrowed by
 * `filter`: one backward range of inference_requests_key_created, the filters checked on its rows.
 */
export function listRequestsQuery(
  apiKeyId: string,
  filter: RequestFilter,
  limit: number,
  startingAfter: string | undefined,
): SqlQuery {
  const values: unknown[] = [apiKeyId];
  const param = (value: unknown): string => {
    values.push(value);
    return `$${values.length}`;
  };
  const where = ["api_key_id = $1"];
  if (filter.createdAfter !== undefined) where.push(`created_at >= ${param(filter.createdAfter)}`);
  if (filter.createdBefore !== undefined) where.push(`created_at < ${param(filter.createdBefore)}`);
  if (filter.model !== undefined) where.push(`model = ${param(filter.model)}`);
  if (filter.permitId !== undefined) where.push(`permit_id = ${param(filter.permitId)}`);
  if (filter.status !== undefined) where.push(`status = ${param(filter.status)}`);
  if (startingAfter !== undefined) {
    where.push(
      `(created_at, id) < (SELECT a.created_at, a.id FROM inference_requests a
        WHERE a.id = ${param(startingAfter)} AND a.api_key_id = $1)`,
    );
  }
  return {
    text: `SELECT ${recordColumns} FROM inference_requests WHERE ${where.join(" AND ")}
      ORDER BY created_at DESC, id DESC LIMIT ${param(limit)}`,
    values,
  };
}

/**
 * What a page is read under: no plan that sorts. The planner has no statistics to go by
 * (autovacuum is off; a key's share of the table is a guess), and with a cursor it guesses the
 * rows before it few, so it would read them all through a bitmap and sort them for the top
 * `limit` (a page costing the key's whole history). The one plan without a sort walks
 * inference_requests_key_created backwards from the cursor and stops at the page's last row.
 */
export const pageSettings = "SET LOCAL enable_sort = off";

export async function listRequests(
  pool: pg.Pool,
  apiKeyId: string,
  filter: RequestFilter,
  limit: number,
  startingAfter: string | undefined,
): Promise<RequestRecord[]> {
  const query = listRequestsQuery(apiKeyId, filter, limit, startingAfter);
  return inTransaction(pool, async (client) => {
    await client.query(pageSettings);
    const { rows } = await client.query<RequestDbRow>(query.text, query.values);
    return rows.map(toRequestRecord);
  });
}

/** The sums of a usage group, over the rows `r` of a scope's range. */
const usageSums = `count(*) AS requests,
        sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
        coalesce(sum(claimed_input_tokens), 0) AS claimed_input_tokens,
        coalesce(sum(claimed_output_tokens), 0) AS claimed_output_tokens,
        coalesce(sum(counted_input_tokens), 0) AS counted_input_tokens,
        coalesce(sum(counted_output_tokens), 0) AS counted_output_tokens,
        coalesce(sum(credits_charged), 0) AS credits`;

/** The columns a payer's two ranges give the sums (the same for both, for UNION ALL). */
const usageColumns = `ir.created_at, ir.model, ir.offer_id, ir.input_tokens, ir.output_tokens,
  ir.claimed_input_tokens, ir.claimed_output_tokens, ir.counted_input_tokens,
  ir.counted_output_tokens, ir.credits_charged`;

/**
 * The usage of a key's, a permit's or a payer's requests made in `[from, to)`, grouped by UTC
 * bucket of creation, model and offer (ordered so). A key or a permit: one range of its index,
 * summed. A payer: its authorizations (permit_authorizations_payer_nonce), each one's requests
 * of the range (inference_requests_authorization: every request on one of its permits was
 * admitted through one of them), and beside them its x402 payments' requests (their caller id's
 * range of inference_requests_key_created; they have no authorization, so the two never meet).
 */
export function usageQuery(
  scope: UsageScope,
  bucket: UsageBucket,
  from: number,
  to: number,
): SqlQuery {
  const group = "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";
  if ("payer" in scope) {
    return {
      text: `SELECT (created_at / $4) * $4 AS starts_at, model, offer_id, ${usageSums}
        FROM (
          SELECT ${usageColumns} FROM permit_authorizations a
            JOIN inference_requests ir ON ir.authorization_id = a.id
           WHERE a.payer = $1 AND ir.authorization_id IS NOT NULL
             AND ir.created_at >= $2 AND ir.created_at < $3
          UNION ALL
          SELECT ${usageColumns} FROM inference_requests ir
           WHERE ir.api_key_id = $5 AND ir.created_at >= $2 AND ir.created_at < $3
        ) r
        ${group}`,
      values: [scope.payer.toLowerCase(), from, to, bucketSeconds[bucket], scope.x402Caller],
    };
  }
  const [column, id] =
    "permitId" in scope ? ["permit_id", scope.permitId] : ["api_key_id", scope.apiKeyId];
  return {
    text: `SELECT (created_at / $4) * $4 AS starts_at, model, offer_id, ${usageSums}
      FROM inference_requests
      WHERE ${column} = $1 AND created_at >= $2 AND created_at < $3
      ${group}`,
    values: [id, from, to, bucketSeconds[bucket]],
  };
}

interface UsageRow {
  starts_at: string;
  model: string;
  offer_id: string;
  requests: string;
  input_tokens: string;
  output_tokens: string;
  claimed_input_tokens: string;
  claimed_output_tokens: string;
  counted_input_tokens: string;
  counted_output_tokens: string;
  credits: string;
}

export async function usageGroups(
  db: Queryable,
  scope: UsageScope,
  bucket: UsageBucket,
  from: number,
  to: number,
): Promise<UsageGroup[]> {
  const query = usageQuery(scope, bucket, from, to);
  const { rows } = await db.query<UsageRow>(query.text, query.values);
  return rows.map((r) => ({
    startsAt: Number(r.starts_at),
    model: r.model,
    offerId: r.offer_id as Hex,
    requests: BigInt(r.requests),
    inputTokens: BigInt(r.input_tokens),
    outputTokens: BigInt(r.output_tokens),
    claimedInputTokens: BigInt(r.claimed_input_tokens),
    claimedOutputTokens: BigInt(r.claimed_output_tokens),
    countedInputTokens: BigInt(r.counted_input_tokens),
    countedOutputTokens: BigInt(r.counted_output_tokens),
    credits: BigInt(r.credits),
  }));
}
