import type { Hex } from "viem";
import type { Tariff } from "../catalog.js";
import { chargeFor, type PriceSchedule } from "../pricing.js";
import type { CloseRecord, Metering, Usage, UsageFigures } from "./types.js";

/**
 * Metering: the usage a provider reported (or the gateway's own count) and the charge it makes,
 * one implementation for every path of the pipeline.
 */

/**
 * The usage a provider reported, in OpenAI's chat shape (`usage.prompt_tokens`,
 * `usage.completion_tokens`), or undefined when it reported none that is credible. Its details
 * (`prompt_tokens_details.cached_tokens`, `completion_tokens_details.reasoning_tokens`) are
 * untrusted as well: each is kept only as a safe integer between 0 and its total (cached at most
 * the prompt, reasoning at most the completion), else 0, so a provider cannot corrupt a record
 * with them; a bad detail never discards the totals the charge is made of.
 */
export function usageOf(value: unknown): Usage | undefined {
  const usage = (
    value as {
      usage?: {
        prompt_tokens?: unknown;
        completion_tokens?: unknown;
        prompt_tokens_details?: unknown;
        completion_tokens_details?: unknown;
      };
    } | null
  )?.usage;
  if (usage === undefined || usage === null) return undefined;
  const { prompt_tokens: p, completion_tokens: c } = usage;
  if (
    !Number.isSafeInteger(p) ||
    !Number.isSafeInteger(c) ||
    (p as number) < 0 ||
    (c as number) < 0
  )
    return undefined;
  return {
    inputTokens: BigInt(p as number),
    outputTokens: BigInt(c as number),
    cachedInputTokens: detailOf(usage.prompt_tokens_details, "cached_tokens", p as number),
    reasoningTokens: detailOf(usage.completion_tokens_details, "reasoning_tokens", c as number),
  };
}

/** A usage detail if it is a safe integer in [0, total], else 0. */
function detailOf(details: unknown, name: string, total: number): bigint {
  if (typeof details !== "object" || details === null) return 0n;
  const n: unknown = (details as Record<string, unknown>)[name];
  return Number.isSafeInteger(n) && (n as number) >= 0 && (n as number) <= total
    ? BigInt(n as number)
    : 0n;
}

/**
 * How many choices of a stream chunk carry generated text: the gateway's own count of a
 * stream's output is one token per such piece, so a chunk of a request with `n` choices that
 * carries text for several of them counts each (OpenAI streams one choice per chunk, vLLM may
 * batch several). `0n` exactly when `deltaText(chunk) === ""`, without building the text.
 */
export function deltaTextChoices(chunk: unknown): bigint {
  const choices = (chunk as { choices?: { delta?: { content?: unknown } }[] } | null)?.choices;
  if (!Array.isArray(choices)) return 0n;
  let count = 0n;
  for (const c of choices) {
    const content = c?.delta?.content;
    if (typeof content === "string" && content !== "") count += 1n;
  }
  return count;
}

export function isUsageOnly(chunk: unknown): boolean {
  const c = chunk as { choices?: unknown[]; usage?: unknown } | null;
  return (
    Array.isArray(c?.choices) &&
    c.choices.length === 0 &&
    c?.usage !== undefined &&
    c?.usage !== null
  );
}

/**
 * The UTF-8 bytes of a text, as a plain Uint8Array over Node's buffer pool: several times
 * cheaper than a TextEncoder for a chunk-sized text, and not a Buffer (whose toJSON would change
 * how a stored idempotent answer keeps its chunks).
 */
export function utf8Bytes(text: string): Uint8Array {
  const buffer = Buffer.from(text, "utf8");
  return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
}

/**
 * A stream's metering after one of its chunks: the tokens so far and what they cost, priced
 * when read. The RPC stream sends the credits with every chunk; the REST facade reads none of
 * them, so a chunk relayed to it costs no pricing (the charge is priced once, at the close).
 */
export class StreamMetering implements Metering {
  constructor(
    private readonly tariff: PriceSchedule,
    private readonly maximum: bigint,
    readonly inputTokens: bigint,
    readonly outputTokens: bigint,
  ) {}

  /** The price of the tokens so far, capped at the request's maximum. */
  get credits(): bigint {
    return chargeFor(this.tariff, this, false, this.maximum).credits;
  }

  /** The plain {@link Metering} (what a stored idempotent answer keeps). */
  toJSON(): Metering {
    return {
      inputTokens: this.inputTokens,
      outputTokens: this.outputTokens,
      credits: this.credits,
    };
  }
}

/**
 * How a request ends, decided in memory before the ledger records it (as a
 * {@link CloseRecord}: the usage's tokens, `charge` as `creditsCharged`, and the time).
 */
export interface Closing extends Pick<
  CloseRecord,
  "status" | "billing" | "usageSource" | "claimed" | "counted"
> {
  readonly usage: Usage;
  /** The provider's usage claim; absent when it reported none. */
  readonly claimed?: UsageFigures | undefined;
  /** The gateway's own count; absent when no answer was counted. */
  readonly counted?: UsageFigures | undefined;
  readonly error: string | undefined;
  readonly charge: bigint;
  /** The provider reported usage priced above the quote's maximum (the offer gets flagged). */
  readonly aboveQuote: boolean;
  readonly offerId: Hex;
}

/**
 * How a request closes, in memory: the charge of `usage` on `tariff` (the wake fee only for a
 * completed request whose quote said it wakes the endpoint), capped at `maximum`; a charge of 0
 * is void whatever the billing asked.
 */
export function closingOf(
  input: Omit<Closing, "charge" | "aboveQuote"> & {
    readonly tariff: Tariff;
    readonly wakes: boolean;
    readonly maximum: bigint;
  },
): Closing {
  const { credits: charge, capped } =
    input.billing === "void"
      ? { credits: 0n, capped: false }
      : chargeFor(
          input.tariff,
          input.usage,
          input.wakes && input.status === "completed",
          input.maximum,
        );
  return {
    status: input.status,
    usage: input.usage,
    billing: charge === 0n ? "void" : input.billing,
    usageSource: input.usageSource,
    claimed: input.claimed,
    counted: input.counted,
    error: input.error,
    charge,
    aboveQuote: capped && input.usageSource === "provider",
    offerId: input.offerId,
  };
}

/**
 * OpenAI's chat `usage` object of what was charged: the usage a client's SDK reads is the
 * charge (DESIGN.md 10). The provider's claim and the gateway's count are shown beside it
 * (`x_gateway`, the record, the RPC's completed event), never in its place.
 */
export function chatUsageView(usage: Usage) {
  const prompt = Number(usage.inputTokens);
  const completion = Number(usage.outputTokens);
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: Number(usage.cachedInputTokens ?? 0n) },
    completion_tokens_details: { reasoning_tokens: Number(usage.reasoningTokens ?? 0n) },
  };
}

/**
 * Makes a JSON answer's `usage` what was charged. Returns whether it changed the answer: an
 * honest provider's usage, charged as claimed, is left as it came (no new serialization).
 */
export function showCharged(body: unknown, usage: Usage): boolean {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return false;
  const answer = body as Record<string, unknown>;
  if (showsUsage(answer["usage"], usage)) return false;
  answer["usage"] = chatUsageView(usage);
  return true;
}

/** Whether a provider's usage object shows exactly `usage` in every figure a client reads. */
function showsUsage(shown: unknown, usage: Usage): boolean {
  if (typeof shown !== "object" || shown === null) return false;
  const u = shown as Record<string, unknown>;
  const prompt = Number(usage.inputTokens);
  const completion = Number(usage.outputTokens);
  return (
    u["prompt_tokens"] === prompt &&
    u["completion_tokens"] === completion &&
    u["total_tokens"] === prompt + completion &&
    detail(u["prompt_tokens_details"], "cached_tokens") === Number(usage.cachedInputTokens ?? 0n) &&
    detail(u["completion_tokens_details"], "reasoning_tokens") ===
      Number(usage.reasoningTokens ?? 0n)
  );
}

function detail(details: unknown, name: string): unknown {
  if (details === undefined || details === null) return 0;
  if (typeof details !== "object") return undefined;
  return (details as Record<string, unknown>)[name] ?? 0;
}

/** Whether a chunk carries a usage (a provider's claim on a chunk with choices). */
export function hasUsage(chunk: unknown): chunk is Record<string, unknown> {
  const usage = (chunk as { usage?: unknown } | null | undefined)?.usage;
  return usage !== undefined && usage !== null;
}

export function withoutUsage(chunk: Record<string, unknown>): Record<string, unknown> {
  const copy = { ...chunk };
  delete copy["usage"];
  return copy;
}
