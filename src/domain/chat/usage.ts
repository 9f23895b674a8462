import type { Usage } from "./types.js";

/**
 * The payer pays the lower (DESIGN.md section 10): a provider's usage report is a claim by the
 * party it pays; the gateway's own count is the measurement. One pure function decides, per
 * kind, what is charged and whether the claim diverged; billing, the relay and verification all
 * call it.
 */

/** What the gateway counted of one answer. */
export interface UsageCount {
  /** The prompt through the model's chat template (or the byte bound). */
  readonly inputTokens: bigint;
  /** Every choice's visible output: content, tool-call names and arguments, refusals, reasoning. */
  readonly outputTokens: bigint;
  /** Of `outputTokens`, the visible reasoning (`reasoning_content`, `reasoning`). */
  readonly reasoningTokens: bigint;
  /** Choices that carried output, and tool calls over all of them (their markup is not seen). */
  readonly choices: bigint;
  readonly toolCalls: bigint;
  /**
   * Of the choices, those that ended with `finish_reason: "stop"`, which may have stopped on a
   * stop string the provider generated and counted (see `UsagePolicy.stopTokens`); undefined:
   * not known, every choice counted may have.
   */
  readonly stopped?: bigint | undefined;
  /** Counted with the model's own tokenizer (else the counts are upper bounds). */
  readonly exact: boolean;
}

/**
 * The terms an answer's claim is judged by, beside the count: what the request was priced for
 * and what it asked of the provider.
 */
export interface ReasoningPolicy {
  /**
   * Reasoning the client never saw may be charged up to this many times the visible output:
   * the ratio of the offer's tariff version (`Tariff.hiddenReasoningRatio`), capped by the
   * gateway's configuration (`HIDDEN_REASONING_RATIO_MAX`), and 0 unless the model's tokenizer
   * registry entry says it hides its reasoning (`hidesReasoning`): see {@link reasoningPolicyOf}.
   * 0: reasoning the client never saw is not charged.
   */
  readonly hiddenReasoningRatio: bigint;
  /**
   * The most output the request was priced for (the limit times its choices): no charge
   * passes it, whatever the tolerance allows.
   */
  readonly outputBound?: bigint | undefined;
  /**
   * Tokens of the request's longest stop string (`req.stop`, counted with the model's counter:
   * {@link stopTokensOf}); 0 or absent: no stop string. A provider counts the stop string it
   * generated, which the client never sees: each stopped choice's output tolerance grows by it.
   */
  readonly stopTokens?: bigint | undefined;
}

/** The same terms, by the name that says what they are beyond reasoning. */
export type UsagePolicy = ReasoningPolicy;

/**
 * Tokens of the longest of the request's stop strings (at most 4 of 64 characters,
 * src/schema/chat.ts), as the model's counter counts each alone; 0 without any.
 */
export function stopTokensOf(
  stop: readonly string[],
  countOutput: (text: string) => bigint,
): bigint {
  let most = 0n;
  for (const text of stop) {
    const tokens = countOutput(text);
    if (tokens > most) most = tokens;
  }
  return most;
}

/** The tolerances the claim is held to, documented in docs/decisions/metering-and-tokens.md. */
export interface Tolerance {
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
}

/** Input: template differences (a default system prompt, a date header) and 2% of the count. */
export const inputToleranceFixed = 32n;
/** Output, per choice: end-of-sequence and stop tokens the client never sees. */
export const outputTolerancePerChoice = 8n;
/** Output, per tool call: the markup a model writes around a call, which the answer parses out. */
export const outputTolerancePerToolCall = 16n;
/** Both: this share of the count, in percent (tokenizing decoded text may merge differently). */
export const tolerancePercent = 2n;

function percentOf(value: bigint): bigint {
  return (value * tolerancePercent + 99n) / 100n;
}

/**
 * The tolerance of a count: small for an exact tokenizer; none for the byte bound, which is
 * already above any honest claim.
 */
export function toleranceOf(count: UsageCount, stopTokens = 0n): Tolerance {
  if (!count.exact) return { inputTokens: 0n, outputTokens: 0n };
  const choices = count.choices > 0n ? count.choices : 1n;
  const stopped = count.stopped === undefined || count.stopped > choices ? choices : count.stopped;
  return {
    inputTokens: inputToleranceFixed + percentOf(count.inputTokens),
    outputTokens:
      outputTolerancePerChoice * choices +
      outputTolerancePerToolCall * count.toolCalls +
      (stopTokens > 0n ? stopTokens * stopped : 0n) +
      percentOf(count.outputTokens),
  };
}

/** The judgment of one answer's usage. */
export interface UsageJudgment {
  /** What is charged: per kind, the lower of the claim and the count plus tolerance. */
  readonly charged: Usage;
  readonly claimed: Usage | undefined;
  readonly counted: UsageCount;
  /** The claim, where there is one, was what the charge took (every kind within tolerance). */
  readonly chargedClaim: boolean;
  /** Input or output claimed above the count plus tolerance: the offer's divergence. */
  readonly diverged: boolean;
}

/**
 * The usage charged for an answer: per kind, the claim when it is within the count plus
 * tolerance, else the count (a claim above what the count allows earns no tolerance):
 * - input: the claim if at most `count + tolerance`, else the count;
 * - output: the claim if at most `count + tolerance + hidden`, else `count + hidden`; never
 *   above the priced output (`outputBound`). The output tolerance grows by `stopTokens` for each
 *   choice that stopped (the stop string the provider generated and the client never saw);
 * - hidden reasoning: `hidden` is the reasoning the provider claims beyond the visible reasoning
 *   the gateway counted, at most `hiddenReasoningRatio` times the visible output, and 0 when the
 *   ratio is 0 (a model that does not hide its reasoning, or a tariff without a ratio). A ratio
 *   alone earns nothing: output claimed with no reasoning claimed is held to the visible count;
 * - reasoning: likewise against the visible reasoning, and at most the output;
 * - cached: at most the charged input.
 * Without a claim, the count (an exact count, or the bound). An honest claim within tolerance is
 * charged exactly as claimed. `diverged`: input or output claimed beyond what it allows.
 */
export function judgeUsage(
  claimed: Usage | undefined,
  counted: UsageCount,
  policy: ReasoningPolicy,
): UsageJudgment {
  if (claimed === undefined) {
    return {
      charged: {
        inputTokens: counted.inputTokens,
        outputTokens: min(counted.outputTokens, policy.outputBound ?? counted.outputTokens),
        cachedInputTokens: 0n,
        reasoningTokens: min(
          counted.reasoningTokens,
          policy.outputBound ?? counted.reasoningTokens,
        ),
      },
      claimed,
      counted,
      chargedClaim: false,
      diverged: false,
    };
  }
  const tolerance = toleranceOf(counted, policy.stopTokens ?? 0n);
  const claimedCached = claimed.cachedInputTokens ?? 0n;
  const claimedReasoning = claimed.reasoningTokens ?? 0n;
  const hidden = hiddenReasoning(claimedReasoning, counted, policy.hiddenReasoningRatio);
  const inputAllowed = counted.inputTokens + tolerance.inputTokens;
  const outputAllowed = counted.outputTokens + tolerance.outputTokens + hidden;
  const reasoningAllowed = counted.reasoningTokens + tolerance.outputTokens + hidden;
  const inputTokens = within(claimed.inputTokens, inputAllowed, counted.inputTokens);
  const outputTokens = min(
    within(claimed.outputTokens, outputAllowed, counted.outputTokens + hidden),
    policy.outputBound ?? claimed.outputTokens,
  );
  const cachedInputTokens = min(claimedCached, inputTokens);
  const reasoningTokens = min(
    within(claimedReasoning, reasoningAllowed, counted.reasoningTokens + hidden),
    outputTokens,
  );
  return {
    charged: { inputTokens, outputTokens, cachedInputTokens, reasoningTokens },
    claimed,
    counted,
    chargedClaim:
      inputTokens === claimed.inputTokens &&
      outputTokens === claimed.outputTokens &&
      cachedInputTokens === claimedCached &&
      reasoningTokens === claimedReasoning,
    diverged: claimed.inputTokens > inputAllowed || claimed.outputTokens > outputAllowed,
  };
}

/**
 * The hidden reasoning an answer may be charged: the reasoning claimed beyond the visible
 * reasoning counted, at most `ratio` times the visible output.
 */
export function hiddenReasoning(claimedReasoning: bigint, counted: UsageCount, ratio: bigint) {
  if (ratio <= 0n || claimedReasoning <= counted.reasoningTokens) return 0n;
  return min(claimedReasoning - counted.reasoningTokens, ratio * counted.outputTokens);
}

/**
 * A claim within what the count allows is charged as claimed; one above it, the count itself:
 * the tolerance is for honest differences, and a claim past it earns none of it.
 */
function within(claim: bigint, allowed: bigint, count: bigint): bigint {
  return claim <= allowed ? claim : min(count, claim);
}

function min(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}

/** The largest ratio an offer's capabilities may declare (the configuration caps it lower). */
export const maxDeclaredHiddenReasoningRatio = 64n;
/** `HIDDEN_REASONING_RATIO_MAX`'s default (src/config/gateway.ts). */
export const defaultHiddenReasoningRatioMax = 8n;

/**
 * The hidden reasoning ratio an offer's capabilities declare (`hidden_reasoning_ratio`, a
 * positive integer up to {@link maxDeclaredHiddenReasoningRatio}; anything else: 0). Read once
 * per tariff version, when the indexer records the version (`Tariff.hiddenReasoningRatio`): the
 * ratio is a priced term, and a later change of the capabilities alone changes nothing until
 * the offer's tariff changes (docs/decisions/metering-and-tokens.md, "Hidden reasoning").
 */
export function declaredHiddenReasoningRatio(
  capabilities: Readonly<Record<string, unknown>>,
): bigint {
  const ratio = capabilities["hidden_reasoning_ratio"];
  return typeof ratio === "number" &&
    Number.isSafeInteger(ratio) &&
    ratio > 0 &&
    BigInt(ratio) <= maxDeclaredHiddenReasoningRatio
    ? BigInt(ratio)
    : 0n;
}

/**
 * The hidden reasoning ratio an answer is judged by: the offer's tariff version's ratio, capped
 * by `ratioMax` (`HIDDEN_REASONING_RATIO_MAX`), for a model whose tokenizer registry entry says
 * it hides its reasoning (`hidesReasoning`); 0 for any other model, whose reasoning the client
 * sees and the gateway counts.
 */
export function reasoningPolicyOf(
  tariff: { readonly hiddenReasoningRatio?: bigint | undefined },
  model: { readonly hidesReasoning?: boolean | undefined },
  ratioMax: bigint = defaultHiddenReasoningRatioMax,
): Pick<ReasoningPolicy, "hiddenReasoningRatio"> {
  const ratio = tariff.hiddenReasoningRatio ?? 0n;
  if (model.hidesReasoning !== true || ratio <= 0n || ratioMax <= 0n) {
    return { hiddenReasoningRatio: 0n };
  }
  return { hiddenReasoningRatio: min(ratio, ratioMax) };
}

/**
 * The terms a request's answer is judged by (`judgeUsage`'s third argument), from what the
 * caller has: the serving offer's tariff, whether the model hides its reasoning (its tokenizer
 * registry entry's `hidesReasoning`; false for a model without one), the configuration's cap
 * (`HIDDEN_REASONING_RATIO_MAX`), the priced output (the limit times the choices), and the
 * request's stop strings with the model's counter to count them.
 */
export function usagePolicyOf(terms: {
  readonly tariff: { readonly hiddenReasoningRatio?: bigint | undefined };
  readonly hidesReasoning: boolean | undefined;
  readonly ratioMax: bigint;
  readonly outputBound: bigint;
  readonly stop: readonly string[];
  readonly countOutput: (text: string) => bigint;
}): ReasoningPolicy {
  return {
    ...reasoningPolicyOf(terms.tariff, { hidesReasoning: terms.hidesReasoning }, terms.ratioMax),
    outputBound: terms.outputBound,
    stopTokens: stopTokensOf(terms.stop, terms.countOutput),
  };
}
