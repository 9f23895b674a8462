import type { Usage } from "./metering.js";

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
  /** Counted with the model's own tokenizer (else the counts are upper bounds). */
  readonly exact: boolean;
}

/** What the offer declares about output its clients never see. */
export interface ReasoningPolicy {
  /**
   * Hidden reasoning tokens charged at most this many times the visible output
   * (`capabilities.hidden_reasoning_ratio`, a positive integer); 0: the offer declares none,
   * and reasoning the client never saw is not charged.
   */
  readonly hiddenReasoningRatio: bigint;
  /**
   * The most output the request was priced for (the limit times its choices): no charge
   * passes it, whatever the tolerance allows.
   */
  readonly outputLimit?: bigint | undefined;
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
export function toleranceOf(count: UsageCount): Tolerance {
  if (!count.exact) return { inputTokens: 0n, outputTokens: 0n };
  return {
    inputTokens: inputToleranceFixed + percentOf(count.inputTokens),
    outputTokens:
      outputTolerancePerChoice * (count.choices > 0n ? count.choices : 1n) +
      outputTolerancePerToolCall * count.toolCalls +
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
 * - output: the claim if at most `count + tolerance + hidden`, else `count + hidden`, where
 *   `hidden` is the offer's declared ratio times the visible output (0 without a declaration);
 *   never above the priced output (`outputLimit`);
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
        outputTokens: min(counted.outputTokens, policy.outputLimit ?? counted.outputTokens),
        cachedInputTokens: 0n,
        reasoningTokens: min(
          counted.reasoningTokens,
          policy.outputLimit ?? counted.reasoningTokens,
        ),
      },
      claimed,
      counted,
      chargedClaim: false,
      diverged: false,
    };
  }
  const tolerance = toleranceOf(counted);
  const hidden = policy.hiddenReasoningRatio * counted.outputTokens;
  const inputAllowed = counted.inputTokens + tolerance.inputTokens;
  const outputAllowed = counted.outputTokens + tolerance.outputTokens + hidden;
  const reasoningAllowed = counted.reasoningTokens + tolerance.outputTokens + hidden;
  const inputTokens = within(claimed.inputTokens, inputAllowed, counted.inputTokens);
  const outputTokens = min(
    within(claimed.outputTokens, outputAllowed, counted.outputTokens + hidden),
    policy.outputLimit ?? claimed.outputTokens,
  );
  const claimedCached = claimed.cachedInputTokens ?? 0n;
  const claimedReasoning = claimed.reasoningTokens ?? 0n;
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
 * A claim within what the count allows is charged as claimed; one above it, the count itself:
 * the tolerance is for honest differences, and a claim past it earns none of it.
 */
function within(claim: bigint, allowed: bigint, count: bigint): bigint {
  return claim <= allowed ? claim : min(count, claim);
}

function min(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}

/** The offer's reasoning declaration, from its capabilities (anything else: none). */
export function reasoningPolicyOf(
  capabilities: Readonly<Record<string, unknown>>,
): Pick<ReasoningPolicy, "hiddenReasoningRatio"> {
  const ratio = capabilities["hidden_reasoning_ratio"];
  return {
    hiddenReasoningRatio:
      typeof ratio === "number" && Number.isSafeInteger(ratio) && ratio > 0 && ratio <= 64
        ? BigInt(ratio)
        : 0n,
  };
}
