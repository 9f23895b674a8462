import type { Hex } from "viem";
import type { JsonValue } from "./catalog.js";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";

/**
 * Provider preferences (DESIGN.md section 9): OpenRouter's `provider` request object
 * (https://openrouter.ai/docs/features/provider-routing), applied to this market's offers.
 *
 * - `order`: offer ids tried first, in this order; the other eligible offers follow (in the
 *   default or `sort` order) unless `allow_fallbacks` is false.
 * - `only` / `ignore`: offer ids routing is restricted to / never routes to.
 * - `allow_fallbacks` (default true): false keeps routing to the `order` list (failing over only
 *   within it); without `order`, to the first offer routing ranks.
 * - `sort`: `price` (lowest quoted maximum first), `latency` (lowest measured time to first
 *   token first) or `throughput` (highest measured output tokens per second first); offers not
 *   measured yet come after the measured ones. As on OpenRouter, an explicit order replaces the
 *   default ranking.
 * - `max_price`: `{prompt, completion}` in credit base units per million tokens (decimal
 *   strings); offers whose tariff is above either are excluded, and when none remain the request
 *   is refused.
 * - `require_parameters`: only offers whose verification proved every feature the request uses
 *   (tools, a `response_format` JSON schema, usage on a stream).
 *
 * OpenRouter's other members (data_collection, zdr, quantizations, ...) describe providers this
 * market does not state, so they are refused rather than silently ignored.
 */

export const providerSorts = ["price", "latency", "throughput"] as const;
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
}

/** Most offer ids one list may name (a bound on the work one request asks of routing). */
export const maxPreferenceOffers = 64;

const members = new Set([
  "order",
  "only",
  "ignore",
  "allow_fallbacks",
  "sort",
  "max_price",
  "require_parameters",
]);

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

function isObject(value: unknown): value is { [key: string]: JsonValue } {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function offerList(value: JsonValue | undefined, key: string): Hex[] | undefined {
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value) || value.length > maxPreferenceOffers) {
    invalid(`'provider.${key}' must be an array of at most ${maxPreferenceOffers} offer ids`);
  }
  return value.map((id, index) => {
    if (typeof id !== "string" || !isHex32(id)) {
      invalid(`'provider.${key}[${index}]' must be an offer id (0x followed by 64 hex digits)`);
    }
    return normalizeHex(id);
  });
}

function flag(value: JsonValue | undefined, key: string, fallback: boolean): boolean {
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "boolean") invalid(`'provider.${key}' must be a boolean`);
  return value;
}

/** A price per million tokens: a decimal integer string of credit base units (uint256). */
function price(value: JsonValue | undefined, key: string): bigint | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== "string" || !/^(0|[1-9][0-9]{0,77})$/.test(value)) {
    invalid(
      `'provider.max_price.${key}' must be a decimal string of credit base units per million tokens`,
    );
  }
  return BigInt(value);
}

/**
 * Validates the request's `provider` member (absent or null: undefined). Throws
 * `invalid_request` naming the offending field.
 */
export function parseProviderPreferences(
  value: JsonValue | undefined,
): ProviderPreferences | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isObject(value)) invalid("'provider' must be an object");
  for (const key of Object.keys(value)) {
    if (!members.has(key)) {
      invalid(
        `'provider.${key.slice(0, 100)}' is not supported (supported: ${[...members].join(", ")})`,
      );
    }
  }
  const sort = value["sort"];
  if (
    sort !== undefined &&
    sort !== null &&
    !(typeof sort === "string" && (providerSorts as readonly string[]).includes(sort))
  ) {
    invalid(`'provider.sort' must be one of ${providerSorts.join(", ")}`);
  }
  const maxPriceValue = value["max_price"];
  let maxPrice: ProviderPreferences["maxPrice"];
  if (maxPriceValue !== undefined && maxPriceValue !== null) {
    if (!isObject(maxPriceValue)) invalid("'provider.max_price' must be an object");
    for (const key of Object.keys(maxPriceValue)) {
      if (key !== "prompt" && key !== "completion") {
        invalid(
          `'provider.max_price.${key.slice(0, 100)}' is not supported (supported: prompt, completion)`,
        );
      }
    }
    const prompt = price(maxPriceValue["prompt"], "prompt");
    const completion = price(maxPriceValue["completion"], "completion");
    maxPrice = {
      ...(prompt === undefined ? {} : { prompt }),
      ...(completion === undefined ? {} : { completion }),
    };
  }
  return {
    order: offerList(value["order"], "order"),
    only: offerList(value["only"], "only"),
    ignore: offerList(value["ignore"], "ignore"),
    allowFallbacks: flag(value["allow_fallbacks"], "allow_fallbacks", true),
    sort: (sort ?? undefined) as ProviderSort | undefined,
    maxPrice,
    requireParameters: flag(value["require_parameters"], "require_parameters", false),
  };
}
