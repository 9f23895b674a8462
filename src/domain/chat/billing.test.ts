import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { decideClose, type Outcome } from "./billing.js";
import type { Usage } from "./types.js";
import { judgeUsage } from "./usage.js";

// 1.5 credits per input token, 7 per output token, a wake fee of 9. The expected charges
// below are worked out by hand from these numbers (DESIGN.md section 3), not by pricing.ts.
const tariff = {
  version: 3n,
  inputPricePerMTok: 1_500_000n,
  outputPricePerMTok: 7_000_000n,
  wakeFee: 9n,
};
const offerId: Hex = `0x${"ab".repeat(32)}`;
const maximum = 1_000n;

interface Row {
  readonly name: string;
  readonly outcome: Outcome;
  readonly wakes?: boolean;
  readonly free?: boolean;
  readonly aboveQuote?: boolean;
  /** The close expected: status, billing, usage, usage source, charge and error text. */
  readonly closes: readonly [
    status: "completed" | "failed" | "cancelled",
    billing: "billed" | "partial" | "void",
    usage: Usage,
    usageSource: "provider" | "gateway",
    charge: bigint,
    error?: string,
  ];
}

const reported: Usage = {
  inputTokens: 10n,
  outputTokens: 4n,
  cachedInputTokens: 2n,
  reasoningTokens: 1n,
};
const tokens = (inputTokens: bigint, outputTokens: bigint): Usage => ({
  inputTokens,
  outputTokens,
});
const none = tokens(0n, 0n);
/** A judged usage: every detail present (0 when none). */
const full = (inputTokens: bigint, outputTokens: bigint): Usage => ({
  inputTokens,
  outputTokens,
  cachedInputTokens: 0n,
  reasoningTokens: 0n,
});
/**
 * A completed answer: the provider's claim (or none) against the gateway's count of `input`
 * and `output` tokens (the byte bound unless `exact`; its visible reasoning as claimed).
 */
const completed = (
  provided: Usage | undefined,
  input: bigint,
  output: bigint,
  exact = false,
): Outcome => ({
  kind: "completed",
  judgment: judgeUsage(
    provided,
    {
      inputTokens: input,
      outputTokens: output,
      reasoningTokens: provided?.reasoningTokens ?? 0n,
      choices: 1n,
      toolCalls: 0n,
      exact,
    },
    { hiddenReasoningRatio: 0n },
  ),
});
// A cancellation's error texts.
const left = "client disconnected";
const cut = "cut by the gateway's shutdown";
const notSent = "before the provider got the request";

const rows: Row[] = [
  {
    name: "completed, provider usage: billed at its price (15 + 28)",
    outcome: completed(reported, 50n, 9n),
    closes: ["completed", "billed", reported, "provider", 43n],
  },
  {
    name: "completed on a woken endpoint: the wake fee is added (15 + 28 + 9)",
    outcome: completed(reported, 50n, 9n),
    wakes: true,
    closes: ["completed", "billed", reported, "provider", 52n],
  },
  {
    name: "completed without provider usage: the gateway's count, each side rounded up (ceil 4.5 + 28)",
    outcome: completed(undefined, 3n, 4n),
    closes: ["completed", "billed", full(3n, 4n), "gateway", 33n],
  },
  {
    name: "completed, provider usage above the quote (150 + 1400): capped, flagged",
    outcome: completed(tokens(100n, 200n), 100n, 200n),
    aboveQuote: true,
    closes: ["completed", "billed", full(100n, 200n), "provider", maximum],
  },
  {
    name: "completed, the gateway's count above the quote: capped, not flagged",
    outcome: completed(undefined, 100n, 200n),
    closes: ["completed", "billed", full(100n, 200n), "gateway", maximum],
  },
  {
    // Issue 35: never void because its output is empty (members that make a provider count
    // what the client never sees could otherwise make an honest offer serve for nothing).
    name: "completed with zero output tokens: its input is charged, the wake fee too (15 + 9)",
    outcome: completed(tokens(10n, 0n), 50n, 0n),
    wakes: true,
    closes: ["completed", "billed", full(10n, 0n), "provider", 24n],
  },
  {
    name: "completed with zero output by the gateway's count: its input is charged (75)",
    outcome: completed(undefined, 50n, 0n),
    closes: ["completed", "billed", full(50n, 0n), "gateway", 75n],
  },
  {
    name: "completed on a free tariff: a charge of 0 is void",
    outcome: completed(reported, 50n, 9n),
    free: true,
    closes: ["completed", "void", reported, "provider", 0n],
  },
  {
    name: "completed, a claim above the exact count plus tolerance: the count (12 in, 5 out: 18 + 35)",
    outcome: completed(tokens(3_550n, 2_000n), 12n, 5n, true),
    closes: ["completed", "billed", full(12n, 5n), "gateway", 53n],
  },
  {
    name: "completed, an honest claim within the exact count's tolerance: charged as claimed (ceil 21 + 42)",
    outcome: completed(tokens(14n, 6n), 12n, 5n, true),
    closes: ["completed", "billed", full(14n, 6n), "provider", 63n],
  },
  {
    name: "the answer's body could not be read: void",
    outcome: { kind: "unreadable" },
    wakes: true,
    closes: ["failed", "void", none, "gateway", 0n, "the provider failed while answering"],
  },
  {
    name: "the answer is not JSON: void",
    outcome: { kind: "invalid_json" },
    closes: ["failed", "void", none, "gateway", 0n, "the provider answered invalid JSON"],
  },
  {
    name: "a stream none of whose events was JSON: void, however its prompt counts",
    outcome: {
      ...(completed(undefined, 50n, 0n) as Extract<Outcome, { kind: "completed" }>),
      readable: false,
    },
    closes: ["failed", "void", none, "gateway", 0n, "the provider's stream carried no JSON event"],
  },
  {
    name: "the provider failed mid-stream: the output delivered only (28), no wake fee",
    outcome: { kind: "provider_failed", delivered: 4n },
    wakes: true,
    closes: ["failed", "partial", tokens(0n, 4n), "gateway", 28n, "the provider failed mid-stream"],
  },
  {
    name: "the provider failed mid-stream before any output: void",
    outcome: { kind: "provider_failed", delivered: 0n },
    closes: ["failed", "void", none, "gateway", 0n, "the provider failed mid-stream"],
  },
  {
    name: "the orphan rule took the request while served: the output delivered (28)",
    outcome: { kind: "orphaned", delivered: 4n },
    closes: [
      "failed",
      "partial",
      tokens(0n, 4n),
      "gateway",
      28n,
      "closed by the orphan rule while served",
    ],
  },
  {
    name: "the client left mid-answer: input plus the output delivered (15 + 28), no wake fee",
    outcome: { kind: "cancelled", by: "client", dispatched: true, input: 10n, delivered: 4n },
    wakes: true,
    closes: ["cancelled", "partial", tokens(10n, 4n), "gateway", 43n, left],
  },
  {
    name: "shutdown cut a dispatched call before any output: its input (ceil 4.5)",
    outcome: { kind: "cancelled", by: "shutdown", dispatched: true, input: 3n, delivered: 0n },
    closes: ["cancelled", "partial", tokens(3n, 0n), "gateway", 5n, cut],
  },
  {
    name: "a cancellation charged above the quote: capped",
    outcome: { kind: "cancelled", by: "client", dispatched: true, input: 100n, delivered: 200n },
    closes: ["cancelled", "partial", tokens(100n, 200n), "gateway", maximum, left],
  },
  {
    name: "the client left before the provider got the request: void, nothing charged",
    outcome: { kind: "cancelled", by: "client", dispatched: false, input: 50n, delivered: 0n },
    wakes: true,
    closes: ["cancelled", "void", none, "gateway", 0n, `${left} ${notSent}`],
  },
  {
    name: "shutdown before the provider got the request: void",
    outcome: { kind: "cancelled", by: "shutdown", dispatched: false, input: 50n, delivered: 0n },
    closes: ["cancelled", "void", none, "gateway", 0n, `${cut} ${notSent}`],
  },
  {
    name: "a step before the first byte failed with its own message: void",
    outcome: { kind: "failed", reason: "the provider answered HTTP 400" },
    wakes: true,
    closes: ["failed", "void", none, "gateway", 0n, "the provider answered HTTP 400"],
  },
  {
    name: "a step before the first byte failed without a message: void",
    outcome: { kind: "failed", reason: undefined },
    closes: ["failed", "void", none, "gateway", 0n, "the provider failed before the first byte"],
  },
];

describe("decideClose", () => {
  it.each(rows)("$name", (row) => {
    const closing = decideClose(row.outcome, {
      tariff: row.free
        ? { ...tariff, inputPricePerMTok: 0n, outputPricePerMTok: 0n, wakeFee: 0n }
        : tariff,
      wakes: row.wakes ?? false,
      maximum,
      offerId,
    });
    const [status, billing, usage, usageSource, charge, error] = row.closes;
    // Claim and count are the judgment's (usage.test.ts); here, what the close decides.
    const { claimed: _claimed, counted: _counted, ...decided } = closing;
    expect(decided).toEqual({
      status,
      usage,
      billing,
      usageSource,
      error,
      charge,
      aboveQuote: row.aboveQuote ?? false,
      offerId,
    });
  });

  it("never charges more than the maximum, whatever happened", () => {
    for (const row of rows) {
      const closing = decideClose(row.outcome, { tariff, wakes: true, maximum: 7n, offerId });
      expect(closing.charge <= 7n).toBe(true);
      expect(closing.charge === 0n).toBe(closing.billing === "void");
    }
  });
});
