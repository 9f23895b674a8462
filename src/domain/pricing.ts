import type { Tariff } from "./catalog.js";

/**
 * Credits for inference (DESIGN.md section 3). Every amount is a bigint in the credit token's
 * base units; there is no floating point anywhere on this path, so a price is the same number on
 * every process and every platform.
 */

/** The part of a tariff that prices a request (prices are per million tokens). */
export type PriceSchedule = Pick<Tariff, "inputPricePerMTok" | "outputPricePerMTok" | "wakeFee">;

/** Tokens of one request: the prompt (`inputTokens`) and the completion (`outputTokens`). */
export interface TokenUsage {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
}

/** Tariff prices are quoted per this many tokens. */
export const tokensPerPriceUnit = 1_000_000n;

function ceilDiv(numerator: bigint, denominator: bigint): bigint {
  return (numerator + denominator - 1n) / denominator;
}

function requireNonNegative(value: bigint, name: string): void {
  if (value < 0n) throw new RangeError(`${name} must not be negative (got ${value})`);
}

/**
 * `ceil(in * inputPricePerMTok / 1e6) + ceil(out * outputPricePerMTok / 1e6) + (wakes ? wakeFee : 0)`,
 * exactly. Each side is rounded up on its own, so the result is never below the exact rational
 * price and at most 2 base units above it: the provider is never underpaid by rounding, and the
 * payer pays at most two base units (wei-like dust) for it. Negative inputs are a programming
 * error and throw a RangeError.
 */
export function priceCredits(tariff: PriceSchedule, usage: TokenUsage, wakes: boolean): bigint {
  requireNonNegative(tariff.inputPricePerMTok, "inputPricePerMTok");
  requireNonNegative(tariff.outputPricePerMTok, "outputPricePerMTok");
  requireNonNegative(tariff.wakeFee, "wakeFee");
  requireNonNegative(usage.inputTokens, "inputTokens");
  requireNonNegative(usage.outputTokens, "outputTokens");
  return (
    ceilDiv(usage.inputTokens * tariff.inputPricePerMTok, tokensPerPriceUnit) +
    ceilDiv(usage.outputTokens * tariff.outputPricePerMTok, tokensPerPriceUnit) +
    (wakes ? tariff.wakeFee : 0n)
  );
}

/**
 * A quote's `maximum_credits`: the price of the gateway's upper bound of input tokens and the
 * request's output bound (its output limit times its choices). Because {@link priceCredits} is monotone in every argument, no usage
 * within those bounds can cost more.
 */
export function maximumCredits(
  tariff: PriceSchedule,
  bounds: { readonly inputTokenBound: bigint; readonly outputBound: bigint },
  wakes: boolean,
): bigint {
  return priceCredits(
    tariff,
    { inputTokens: bounds.inputTokenBound, outputTokens: bounds.outputBound },
    wakes,
  );
}

/** What a request is charged, and whether the cap applied. */
export interface Charge {
  readonly credits: bigint;
  /**
   * The usage priced above the request's maximum: the provider reported more than the gateway
   * can account for, so the charge was capped and the offer should be flagged.
   */
  readonly capped: boolean;
}

/**
 * The charge for a request's usage: `min(maximumCredits, price(usage))` (DESIGN.md section 3).
 * A request is never charged more than the maximum it reserved and its client was quoted.
 */
export function chargeFor(
  tariff: PriceSchedule,
  usage: TokenUsage,
  wakes: boolean,
  maximum: bigint,
): Charge {
  requireNonNegative(maximum, "maximum");
  const price = priceCredits(tariff, usage, wakes);
  return price > maximum ? { credits: maximum, capped: true } : { credits: price, capped: false };
}
