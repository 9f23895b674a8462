import type { Hex } from "viem";
import type { ModelRecord } from "../catalog.js";
import { parseChatRequest, type ChatRequest, type JsonBounds } from "./request/index.js";
import { canonicalBody, dialects, type DialectName } from "../dialects/index.js";
import { GatewayError } from "../errors.js";
import { isHex32, normalizeHex } from "../hex.js";
import type { Metering } from "../tokens.js";
import type { InferenceDeps, QuoteStore, ShownQuote } from "./ports.js";
import { rankCandidates, type Candidate, type RoutingContext } from "./routing.js";
import { quoteLifetimeSeconds, type QuoteRecord } from "./types.js";

/**
 * Quotes: made on request (`POST /v1/quotes`, {@link createQuote}), checked and bound to their
 * offer when a chat supplies one ({@link boundQuote}), and made internally for every request that
 * brings none ({@link quoteRecord}).
 */

/** What making a quote needs of the pipeline. */
export interface Quoting {
  readonly deps: Pick<InferenceDeps, "catalog" | "quotes" | "clock">;
  readonly newId: () => Hex;
  readonly bounds: { maxBytes: number } & JsonBounds;
  readonly routing: RoutingContext;
}

const bound: Metering = { kind: "bound" };

export async function createQuote(
  q: Quoting,
  input: { apiKeyId: string; body: Uint8Array; dialect?: DialectName | undefined },
): Promise<ShownQuote> {
  const { deps } = q;
  const body =
    input.dialect === undefined
      ? input.body
      : canonicalBody(dialects[input.dialect], input.body, q.bounds).body;
  const req = parseChatRequest(body, q.bounds);
  const now = deps.clock();
  const { model, offers } = await deps.catalog.routingView(req.model);
  const [best] = rankCandidates(offers, model, req, [req.offer], now, q.routing);
  if (best === undefined) throw noEligibleOffer(req);
  const quote = quoteRecord(q.newId(), input.apiKeyId, req, model, best, now, false);
  await deps.quotes.insert(quote);
  return { ...quote, metering: model.metering ?? bound };
}

export function quoteRecord(
  quoteId: Hex,
  apiKeyId: string,
  req: ChatRequest,
  model: ModelRecord,
  c: Candidate,
  now: number,
  internal: boolean,
): QuoteRecord {
  return {
    quoteId,
    apiKeyId,
    model: req.model,
    modelId: model.modelId,
    offerId: c.offer.offerId,
    tariffVersion: c.offer.tariff.version,
    inputTokens: c.inputTokens,
    maxOutputTokens: c.maxOutputTokens,
    wakesEndpoint: c.wakes,
    maximumCredits: c.maximumCredits,
    fingerprint: req.fingerprint,
    createdAt: now,
    expiresAt: now + quoteLifetimeSeconds,
    internal,
    usedBy: null,
  };
}

/**
 * 503 `model_loading`: the model's tokenizer is still loading (start-up, or the indexer just
 * added the model). It is never loaded on a request's path, and the request is not served by
 * the byte bound meanwhile: refused before anything is reserved.
 */
export function modelLoading(model: string): GatewayError {
  return new GatewayError(
    "model_loading",
    `the tokenizer of model ${model} is still loading; retry shortly`,
    { retryAfterSeconds: 1 },
  );
}

export function noEligibleOffer(req: ChatRequest): GatewayError {
  return new GatewayError(
    "no_eligible_offer",
    req.offer === undefined
      ? `no verified, active offer of '${req.model.slice(0, 200)}' can serve this request now`
      : `offer ${req.offer} cannot serve this request now (not active, verified and registered for this model, or out of routing for usage claims above the gateway's count until it is verified again)`,
  );
}

/** Checks a supplied quote, in the order DESIGN.md gives; returns it bound to its offer. */
export async function boundQuote(
  quotes: QuoteStore,
  quoteId: string,
  apiKeyId: string,
  req: ChatRequest,
  now: number,
): Promise<QuoteRecord> {
  if (!isHex32(quoteId)) throw new GatewayError("invalid_hex", "X-Gateway-Quote must be a Hex32");
  const quote = await quotes.get(normalizeHex(quoteId));
  if (quote === undefined || quote.apiKeyId !== apiKeyId || quote.internal) {
    throw new GatewayError("quote_not_found", `quote ${quoteId} does not exist`);
  }
  // The stored expiry decides (quotes are made with createdAt + quoteLifetimeSeconds).
  if (now > quote.expiresAt) {
    throw new GatewayError("quote_expired", `quote ${quoteId} expired at ${quote.expiresAt}`);
  }
  if (quote.fingerprint !== req.fingerprint) {
    throw new GatewayError(
      "quote_mismatch",
      "the request differs from the quoted one in model, messages, n, output limit, tools, tool choice or response format",
    );
  }
  if (quote.usedBy !== null)
    throw new GatewayError("quote_used", `quote ${quoteId} has already been used`);
  return quote;
}
