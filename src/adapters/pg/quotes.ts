import type { Hex } from "viem";
import type { QuoteRecord } from "../../domain/chat/index.js";
import type { Queryable } from "./registrations.js";

/**
 * A row of `quotes`: the domain's quote record (amounts as bigint, times as Unix seconds), whose
 * id is whatever string was stored (the gateway makes Hex32 ids; tests may use others).
 */
export type QuoteRow = Omit<QuoteRecord, "quoteId"> & { readonly quoteId: string };

/** A quote about to be stored: never used yet. */
export type NewQuote = Omit<QuoteRow, "usedBy">;

/**
 * The quote as a `quotes` row in JSON (snake_case columns, ids lower-case, amounts as decimal
 * strings), for `jsonb_populate_record(NULL::quotes, ...)`: the one mapping from a quote to its
 * columns, used here and by the ledger's reservation.
 */
export function quoteColumns(quote: NewQuote): string {
  return JSON.stringify({
    quote_id: quote.quoteId,
    api_key_id: quote.apiKeyId,
    model: quote.model,
    model_id: quote.modelId.toLowerCase(),
    offer_id: quote.offerId.toLowerCase(),
    tariff_version: quote.tariffVersion.toString(),
    input_tokens: quote.inputTokens.toString(),
    max_output_tokens: quote.maxOutputTokens.toString(),
    wakes_endpoint: quote.wakesEndpoint,
    maximum_credits: quote.maximumCredits.toString(),
    fingerprint: quote.fingerprint,
    created_at: quote.createdAt,
    expires_at: quote.expiresAt,
    internal: quote.internal,
    used_by: null,
  });
}

/**
 * Stores a new, unused quote. A duplicate `quoteId` throws (unique violation): quote ids are
 * random and never reused.
 */
export async function insertQuote(db: Queryable, quote: NewQuote): Promise<void> {
  await db.query(
    "INSERT INTO quotes SELECT * FROM jsonb_populate_record(NULL::quotes, $1::jsonb)",
    [quoteColumns(quote)],
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
