import { describe, expect, it } from "vitest";
import type { Usage } from "./types.js";
import {
  declaredHiddenReasoningRatio,
  judgeUsage,
  reasoningPolicyOf,
  stopTokensOf,
  toleranceOf,
  usagePolicyOf,
  type UsageCount,
} from "./usage.js";

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
    const j = judgeUsage(undefined, count({ reasoningTokens: 7n }), { ...none, outputBound: 40n });
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
    const j = judgeUsage(claim({ outputTokens: 55n }), count(), { ...none, outputBound: 50n });
    expect(j.charged.outputTokens).toBe(50n);
    expect(j.diverged).toBe(false);
  });

  it("charges hidden reasoning only as claimed reasoning, up to the ratio of the visible output", () => {
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

  it("gives a ratio nothing when no reasoning is claimed: 64x the output claimed is charged the visible output", () => {
    // The reproduction: an offer declaring 64 claims 65 times the visible output.
    const c = claim({ outputTokens: 65n * 50n, reasoningTokens: 0n });
    const j = judgeUsage(c, count(), { hiddenReasoningRatio: 64n });
    expect(j.charged.outputTokens).toBe(50n);
    expect(j.charged.reasoningTokens).toBe(0n);
    expect(j.diverged).toBe(true);
    // Reasoning claimed no more than the visible reasoning is visible: nothing hidden either.
    const visible = count({ outputTokens: 80n, reasoningTokens: 30n });
    const same = judgeUsage(claim({ outputTokens: 80n + 500n, reasoningTokens: 30n }), visible, {
      hiddenReasoningRatio: 64n,
    });
    expect(same.charged.outputTokens).toBe(80n);
    // Claimed beyond it, only the part beyond it is hidden.
    const beyond = judgeUsage(claim({ outputTokens: 80n + 100n, reasoningTokens: 130n }), visible, {
      hiddenReasoningRatio: 64n,
    });
    expect(beyond.charged.outputTokens).toBe(180n);
    expect(beyond.diverged).toBe(false);
  });

  it("widens a stopped choice's output tolerance by its longest stop string", () => {
    // 50 counted + 9 tolerance; the provider counts the 20-token stop string it generated.
    const c = claim({ outputTokens: 50n + 9n + 20n });
    expect(judgeUsage(c, count(), none).diverged).toBe(true);
    const stopped = judgeUsage(c, count(), { ...none, stopTokens: 20n });
    expect(stopped.charged).toEqual(c);
    expect(stopped.diverged).toBe(false);
    // Per stopped choice: two choices, one stopped on a string.
    const two = count({ choices: 2n, stopped: 1n });
    const c2 = claim({ outputTokens: 50n + 17n + 20n });
    expect(judgeUsage(c2, two, { ...none, stopTokens: 20n }).diverged).toBe(false);
    expect(
      judgeUsage(claim({ outputTokens: 50n + 17n + 21n }), two, { ...none, stopTokens: 20n })
        .diverged,
    ).toBe(true);
    // No choice stopped: no widening.
    expect(judgeUsage(c, count({ stopped: 0n }), { ...none, stopTokens: 20n }).diverged).toBe(true);
    // The byte bound earns none.
    expect(toleranceOf(count({ exact: false }), 20n).outputTokens).toBe(0n);
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

describe("stopTokensOf", () => {
  it("is the longest stop string's tokens, 0 without any", () => {
    const byLength = (text: string) => BigInt(text.length);
    expect(stopTokensOf([], byLength)).toBe(0n);
    expect(stopTokensOf(["ab", "abcd", "a"], byLength)).toBe(4n);
  });
});

describe("declaredHiddenReasoningRatio", () => {
  it.each([
    [{ hidden_reasoning_ratio: 4 }, 4n],
    [{ hidden_reasoning_ratio: 64 }, 64n],
    [{ hidden_reasoning_ratio: 65 }, 0n],
    [{ hidden_reasoning_ratio: 1.5 }, 0n],
    [{ hidden_reasoning_ratio: "4" }, 0n],
    [{ hidden_reasoning_ratio: -1 }, 0n],
    [{}, 0n],
  ])("%j declares a ratio of %s", (capabilities, ratio) => {
    expect(declaredHiddenReasoningRatio(capabilities)).toBe(ratio);
  });
});

describe("reasoningPolicyOf", () => {
  const hides = { hidesReasoning: true };
  it("is the tariff's ratio, capped by the configuration, for a model that hides its reasoning", () => {
    expect(reasoningPolicyOf({ hiddenReasoningRatio: 4n }, hides, 8n).hiddenReasoningRatio).toBe(
      4n,
    );
    expect(reasoningPolicyOf({ hiddenReasoningRatio: 64n }, hides, 8n).hiddenReasoningRatio).toBe(
      8n,
    );
    expect(reasoningPolicyOf({ hiddenReasoningRatio: 64n }, hides).hiddenReasoningRatio).toBe(8n);
    expect(reasoningPolicyOf({}, hides, 8n).hiddenReasoningRatio).toBe(0n);
    expect(reasoningPolicyOf({ hiddenReasoningRatio: 4n }, hides, 0n).hiddenReasoningRatio).toBe(
      0n,
    );
  });

  it("is 0 for a model that shows its reasoning, whatever the tariff says", () => {
    for (const model of [{}, { hidesReasoning: false }]) {
      expect(
        reasoningPolicyOf({ hiddenReasoningRatio: 64n }, model, 64n).hiddenReasoningRatio,
      ).toBe(0n);
    }
  });

  it("charges an offer's hidden reasoning on a hiding model only (issue 35, item 9)", () => {
    const tariff = { hiddenReasoningRatio: 64n };
    // 50 visible tokens, 300 reasoning tokens claimed that the client never saw.
    const c = claim({ outputTokens: 350n, reasoningTokens: 300n });
    const hiding = judgeUsage(c, count(), reasoningPolicyOf(tariff, hides, 8n));
    expect(hiding.charged).toEqual(c);
    const showing = judgeUsage(c, count(), reasoningPolicyOf(tariff, { hidesReasoning: false }));
    expect(showing.charged.outputTokens).toBe(50n);
    expect(showing.charged.reasoningTokens).toBe(0n);
    // A declared 64 with no reasoning claimed: the visible output only, hiding model or not.
    const bare = claim({ outputTokens: 65n * 50n });
    expect(
      judgeUsage(bare, count(), reasoningPolicyOf(tariff, hides, 64n)).charged.outputTokens,
    ).toBe(50n);
  });
});

describe("usagePolicyOf", () => {
  it("puts the terms together: the capped ratio on a hiding model, the priced output, the stop tokens", () => {
    const terms = {
      tariff: { hiddenReasoningRatio: 64n },
      ratioMax: 8n,
      outputBound: 300n,
      stop: ["</answer>", "STOP"],
      countOutput: (text: string) => BigInt(text.length),
    };
    expect(usagePolicyOf({ ...terms, hidesReasoning: true })).toEqual({
      hiddenReasoningRatio: 8n,
      outputBound: 300n,
      stopTokens: 9n,
    });
    expect(usagePolicyOf({ ...terms, hidesReasoning: undefined, stop: [] })).toEqual({
      hiddenReasoningRatio: 0n,
      outputBound: 300n,
      stopTokens: 0n,
    });
  });
});
