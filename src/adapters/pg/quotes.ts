import type { Hex } from "viem";
import type { QuoteRecord } from "../../domain/inference.js";
import type { Queryable } from "./registrations.js";

/**
 * A row of `quotes`: the domain's quote record (amounts as bigint, times as Unix seconds), whose
 * id is whatever string was stored (the gateway makes Hex32 ids; tests may use others).
 */
export type QuoteRow = Omit<QuoteRecord, "quoteId"> & { readonly quoteId: string };

/** A quote about to be stored: never used yet. */
export type NewQuote = Omit<QuoteRow, "usedBy">;

/**
 * Stores a new, unused quote. The ids are stored lower-case, as everywhere else, so that the
 * quote's offer matches `offers` and `offer_loads`. A duplicate `quoteId` throws (unique
 * violation): quote ids are random and never reused.
 */
export async function insertQuote(db: Queryable, quote: NewQuote): Promise<void> {
  await db.query(
    `INSERT INTO quotes (quote_id, api_key_id, model, model_id, offer_id, tariff_version,
       input_tokens, max_output_tokens, wakes_endpoint, maximum_credits, fingerprint, created_at,
       expires_at, internal)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
    [
      quote.quoteId,
      quote.apiKeyId,
      quote.model,
      quote.modelId.toLowerCase(),
      quote.offerId.toLowerCase(),
      quote.tariffVersion.toString(),
      quote.inputTokens.toString(),
      quote.maxOutputTokens.toString(),
      quote.wakesEndpoint,
      quote.maximumCredits.toString(),
      quote.fingerprint,
      quote.createdAt,
      quote.expiresAt,
      quote.internal,
    ],
  );
}

/**
 * The quote, or undefined when there is none. Not scoped to an API key: the caller decides
 * what a quote made with another key means for its request.
 */
export async function getQuote(db: Queryable, quoteId: string): Promise<QuoteRow | undefined> {
  const { rows } = await db.query<{
    quote_id: string;
    api_key_id: string;
    model: string;
    model_id: string;
    offer_id: string;
    tariff_version: string;
    input_tokens: string;
    max_output_tokens: string;
    wakes_endpoint: boolean;
    maximum_credits: string;
    fingerprint: string;
    created_at: string;
    expires_at: string;
    internal: boolean;
    used_by: string | null;
  }>(
    `SELECT quote_id, api_key_id, model, model_id, offer_id, tariff_version, input_tokens,
       max_output_tokens, wakes_endpoint, maximum_credits, fingerprint, created_at, expires_at,
       internal, used_by
     FROM quotes WHERE quote_id = $1`,
    [quoteId],
  );
  const row = rows[0];
  if (!row) return undefined;
  return {
    quoteId: row.quote_id,
    apiKeyId: row.api_key_id,
    model: row.model,
    modelId: row.model_id as Hex,
    offerId: row.offer_id as Hex,
    tariffVersion: BigInt(row.tariff_version),
    inputTokens: BigInt(row.input_tokens),
    maxOutputTokens: BigInt(row.max_output_tokens),
    wakesEndpoint: row.wakes_endpoint,
    maximumCredits: BigInt(row.maximum_credits),
    fingerprint: row.fingerprint,
    createdAt: Number(row.created_at),
    expiresAt: Number(row.expires_at),
    internal: row.internal,
    usedBy: row.used_by,
  };
}
