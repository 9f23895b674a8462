import type { Hex } from "viem";
import {
  ProviderPreferences as ProviderPreferencesSchema,
  type ProviderPreferencesBody,
  type providerSorts,
} from "../schema/chat.js";
import { compileBody } from "./body-check.js";
import { normalizeHex } from "./hex.js";

/**
 * Provider preferences (DESIGN.md section 9): OpenRouter's `provider` request object
 * (https://openrouter.ai/docs/features/provider-routing), applied to this market's offers.
 *
 * - `order`: offer ids tried first, in this order; the other eligible offers follow (in the
 *   default or `sort` order) unless `allow_fallbacks` is false.
 * - `only` / `ignore`: offer ids routing is restricted to / never routes to.
 * - `allow_fallbacks` (default true): false keeps routing to the `order` list (failing over only
 *   within it); without `order`, to the first offer routing ranks.
 * - `sort`: `price` (lowest quoted maximum first), `latency` (lowest median time to first
 *   token first) or `throughput` (highest median output tokens per second first), the medians
 *   of the offer reputation's window (reputation/reputation.ts); offers not measured yet come after the
 *   measured ones, and failing offers (`isFailing`) last. As on OpenRouter, an explicit order replaces the
 *   default ranking.
 * - `max_price`: `{prompt, completion}` in credit base units per million tokens (decimal
 *   strings); offers whose tariff is above either, or whose maximum for the request (wake fee
 *   included) is above the request's maximum at these prices, are excluded, and when none
 *   remain the request is refused (routing.ts `fitsMaxPrice`). Unlike the other members, it also
 *   holds for a pinned request.
 * - `require_parameters`: only offers whose verification proved every feature the request uses
 *   (tools, a `response_format` JSON schema, usage on a stream).
 * - `require_exact_metering` (OpenRouter has no such member; named in its style): only offers
 *   the gateway meters with their model's own tokenizer, not by the byte bound (DESIGN.md
 *   section 10; the catalog and quotes show each offer's `metering`). Like `max_price`, it also
 *   holds for a pinned request: how a request is counted is the client's term, not a ranking.
 * - `require_audited` (the gateway's own member too): only offers whose audits pass (the
 *   catalog's `audit.state` is `passing`: audited, no evidence of another model; DESIGN.md
 *   section 12). Unaudited offers (new, or a model without a reference) are left out as well.
 *   It also holds for a pinned request: which model answers is the client's term.
 *
 * OpenRouter's other members (data_collection, zdr, quantizations, ...) describe providers this
 * market does not state, so they are refused rather than silently ignored.
 *
 * The object's structure and bounds (the members above, at most 64 offer ids per list, prices
 * of at most 78 digits) are the `ProviderPreferences` schema's (src/schema/chat.ts); this module
 * turns a valid object into what routing reads.
 */

export type ProviderSort = (typeof providerSorts)[number];

export interface ProviderPreferences {
  readonly order?: readonly Hex[] | undefined;
  readonly only?: readonly Hex[] | undefined;
  readonly ignore?: readonly Hex[] | undefined;
  readonly allowFallbacks: boolean;
  readonly sort?: ProviderSort | undefined;
  /** Credit base units per million tokens. */
  readonly maxPrice?: { readonly prompt?: bigint; readonly completion?: bigint } | undefined;
  readonly requireParameters: boolean;
  /** Only offers metered exactly (their model's own tokenizer), never by the byte bound. */
  readonly requireExactMetering: boolean;
  /** Only offers whose audits pass (`audit.state` passing). */
  readonly requireAudited: boolean;
}

/** The object's structure and bounds, compiled once (src/schema/chat.ts). */
const checkPreferences: (value: unknown, at?: string) => ProviderPreferencesBody =
  compileBody(ProviderPreferencesSchema);

/**
 * Validates the request's `provider` member against the schema (absent or null: undefined) and
 * returns it in the routing's terms: offer ids in lower case, prices as bigints, the flags'
 * defaults applied. Throws `invalid_request` naming the offending field (`provider.order[2]`).
 */
export function parseProviderPreferences(value: unknown): ProviderPreferences | undefined {
  if (value === undefined || value === null) return undefined;
  const body = checkPreferences(value, "provider");
  const maxPrice = body.max_price ?? undefined;
  return {
    order: offerIds(body.order),
    only: offerIds(body.only),
    ignore: offerIds(body.ignore),
    allowFallbacks: body.allow_fallbacks ?? true,
    sort: body.sort ?? undefined,
    maxPrice:
      maxPrice === undefined
        ? undefined
        : {
            ...(maxPrice.prompt == null ? {} : { prompt: BigInt(maxPrice.prompt) }),
            ...(maxPrice.completion == null ? {} : { completion: BigInt(maxPrice.completion) }),
          },
    requireParameters: body.require_parameters ?? false,
    requireExactMetering: body.require_exact_metering ?? false,
    requireAudited: body.require_audited ?? false,
  };
}

function offerIds(ids: readonly string[] | null | undefined): Hex[] | undefined {
  return ids == null ? undefined : ids.map(normalizeHex);
}
