import { describe, expect, it } from "vitest";
import type { Usage } from "./metering.js";
import { judgeUsage, reasoningPolicyOf, toleranceOf, type UsageCount } from "./usage.js";

const count = (over: Partial<UsageCount> = {}): UsageCount => ({
  inputTokens: 100n,
  outputTokens: 50n,
  reasoningTokens: 0n,
  choices: 1n,
  toolCalls: 0n,
  exact: true,
  ...over,
});
const claim = (over: Partial<Usage> = {}): Usage => ({
  inputTokens: 100n,
  outputTokens: 50n,
  cachedInputTokens: 0n,
  reasoningTokens: 0n,
  ...over,
});
const none = { hiddenReasoningRatio: 0n };

describe("toleranceOf", () => {
  it("is small for an exact count: 32 + 2% of the input; 8 a choice, 16 a tool call and 2% of the output", () => {
    expect(toleranceOf(count())).toEqual({ inputTokens: 34n, outputTokens: 9n });
    expect(toleranceOf(count({ choices: 3n, toolCalls: 2n, outputTokens: 1_000n }))).toEqual({
      inputTokens: 34n,
      outputTokens: 24n + 32n + 20n,
    });
  });

  it("is none for the byte bound, which is above any honest claim already", () => {
    expect(toleranceOf(count({ exact: false }))).toEqual({ inputTokens: 0n, outputTokens: 0n });
  });
});

describe("judgeUsage", () => {
  it("charges an honest claim exactly as claimed, within tolerance either way", () => {
    for (const c of [
      claim(),
      claim({ inputTokens: 134n, outputTokens: 59n }),
      claim({ inputTokens: 3n, outputTokens: 1n }),
    ]) {
      const j = judgeUsage(c, count(), none);
      expect(j.charged).toEqual(c);
      expect(j.chargedClaim).toBe(true);
      expect(j.diverged).toBe(false);
    }
  });

  it("charges the count itself for a claim above the count plus tolerance, and says it diverged", () => {
    const j = judgeUsage(claim({ inputTokens: 3_550n, outputTokens: 2_000n }), count(), none);
    expect(j.charged).toEqual(claim({ inputTokens: 100n, outputTokens: 50n }));
    expect(j.chargedClaim).toBe(false);
    expect(j.diverged).toBe(true);
    // One token over on one side is enough.
    expect(judgeUsage(claim({ outputTokens: 60n }), count(), none).diverged).toBe(true);
    expect(judgeUsage(claim({ inputTokens: 135n }), count(), none).diverged).toBe(true);
  });

  it("charges the count without a claim, never above the priced output", () => {
    const j = judgeUsage(undefined, count({ reasoningTokens: 7n }), { ...none, outputLimit: 40n });
    expect(j.charged).toEqual({
      inputTokens: 100n,
      outputTokens: 40n,
      cachedInputTokens: 0n,
      reasoningTokens: 7n,
    });
    expect(j.chargedClaim).toBe(false);
    expect(j.diverged).toBe(false);
  });

  it("caps every charge at the priced output, tolerance or not", () => {
    const j = judgeUsage(claim({ outputTokens: 55n }), count(), { ...none, outputLimit: 50n });
    expect(j.charged.outputTokens).toBe(50n);
    expect(j.diverged).toBe(false);
  });

  it("charges hidden reasoning only for an offer that declares it, up to its ratio of the visible output", () => {
    // 50 visible tokens; the provider claims 450 output, 400 of them reasoning nobody saw.
    const c = claim({ outputTokens: 450n, reasoningTokens: 400n });
    const undeclared = judgeUsage(c, count(), none);
    expect(undeclared.charged.outputTokens).toBe(50n);
    expect(undeclared.charged.reasoningTokens).toBe(0n);
    expect(undeclared.diverged).toBe(true);
    const declared = judgeUsage(c, count(), { hiddenReasoningRatio: 8n });
    expect(declared.charged).toEqual(c);
    expect(declared.diverged).toBe(false);
    const tooMuch = judgeUsage(claim({ outputTokens: 1_000n, reasoningTokens: 950n }), count(), {
      hiddenReasoningRatio: 8n,
    });
    expect(tooMuch.charged.outputTokens).toBe(50n + 400n);
    expect(tooMuch.charged.reasoningTokens).toBe(400n);
    expect(tooMuch.diverged).toBe(true);
  });

  it("charges visible reasoning the gateway counted, like any output", () => {
    const j = judgeUsage(claim({ reasoningTokens: 30n }), count({ reasoningTokens: 30n }), none);
    expect(j.charged.reasoningTokens).toBe(30n);
    expect(j.chargedClaim).toBe(true);
  });

  it("keeps cached tokens at most the input charged", () => {
    const j = judgeUsage(claim({ inputTokens: 3_000n, cachedInputTokens: 2_900n }), count(), none);
    expect(j.charged.inputTokens).toBe(100n);
    expect(j.charged.cachedInputTokens).toBe(100n);
  });

  it("holds a claim to the byte bound alone when the tokenizer is unknown", () => {
    const bound = count({ exact: false, inputTokens: 400n, outputTokens: 20n });
    expect(judgeUsage(claim({ inputTokens: 400n, outputTokens: 20n }), bound, none).diverged).toBe(
      false,
    );
    const j = judgeUsage(claim({ inputTokens: 401n, outputTokens: 2_000n }), bound, none);
    expect(j.charged).toEqual(claim({ inputTokens: 400n, outputTokens: 20n }));
    expect(j.diverged).toBe(true);
  });
});

describe("reasoningPolicyOf", () => {
  it.each([
    [{ hidden_reasoning_ratio: 4 }, 4n],
    [{ hidden_reasoning_ratio: 64 }, 64n],
    [{ hidden_reasoning_ratio: 65 }, 0n],
    [{ hidden_reasoning_ratio: 1.5 }, 0n],
    [{ hidden_reasoning_ratio: "4" }, 0n],
    [{ hidden_reasoning_ratio: -1 }, 0n],
    [{}, 0n],
  ])("%j declares a ratio of %s", (capabilities, ratio) => {
    expect(reasoningPolicyOf(capabilities).hiddenReasoningRatio).toBe(ratio);
  });
});
