import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { decideClose, type Outcome } from "./billing.js";
import type { Usage } from "./metering.js";

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
  readonly status: "completed" | "failed" | "cancelled";
  readonly billing: "billed" | "partial" | "void";
  readonly usage: Usage;
  readonly usageSource: "provider" | "gateway";
  readonly charge: bigint;
  readonly aboveQuote?: boolean;
  readonly error?: string;
}

const reported: Usage = {
  inputTokens: 10n,
  outputTokens: 4n,
  cachedInputTokens: 2n,
  reasoningTokens: 1n,
};
const none = { inputTokens: 0n, outputTokens: 0n };

const rows: Row[] = [
  {
    name: "completed, provider usage: billed at its price (15 + 28)",
    outcome: { kind: "completed", provided: reported, inputBound: 50n, counted: 9n },
    status: "completed",
    billing: "billed",
    usage: reported,
    usageSource: "provider",
    charge: 43n,
  },
  {
    name: "completed on a woken endpoint: the wake fee is added (15 + 28 + 9)",
    outcome: { kind: "completed", provided: reported, inputBound: 50n, counted: 9n },
    wakes: true,
    status: "completed",
    billing: "billed",
    usage: reported,
    usageSource: "provider",
    charge: 52n,
  },
  {
    name: "completed without provider usage: the gateway's count, each side rounded up (ceil 4.5 + 28)",
    outcome: { kind: "completed", provided: undefined, inputBound: 3n, counted: 4n },
    status: "completed",
    billing: "billed",
    usage: { inputTokens: 3n, outputTokens: 4n },
    usageSource: "gateway",
    charge: 33n,
  },
  {
    name: "completed, provider usage above the quote (150 + 1400): capped, flagged",
    outcome: {
      kind: "completed",
      provided: { inputTokens: 100n, outputTokens: 200n },
      inputBound: 100n,
      counted: 0n,
    },
    status: "completed",
    billing: "billed",
    usage: { inputTokens: 100n, outputTokens: 200n },
    usageSource: "provider",
    charge: maximum,
    aboveQuote: true,
  },
  {
    name: "completed, the gateway's count above the quote: capped, not flagged",
    outcome: { kind: "completed", provided: undefined, inputBound: 100n, counted: 200n },
    status: "completed",
    billing: "billed",
    usage: { inputTokens: 100n, outputTokens: 200n },
    usageSource: "gateway",
    charge: maximum,
  },
  {
    name: "completed with zero output tokens: void, no wake fee either",
    outcome: {
      kind: "completed",
      provided: { inputTokens: 10n, outputTokens: 0n },
      inputBound: 50n,
      counted: 0n,
    },
    wakes: true,
    status: "completed",
    billing: "void",
    usage: { inputTokens: 10n, outputTokens: 0n },
    usageSource: "provider",
    charge: 0n,
  },
  {
    name: "completed with zero output by the gateway's count: void",
    outcome: { kind: "completed", provided: undefined, inputBound: 50n, counted: 0n },
    status: "completed",
    billing: "void",
    usage: { inputTokens: 50n, outputTokens: 0n },
    usageSource: "gateway",
    charge: 0n,
  },
  {
    name: "completed on a free tariff: a charge of 0 is void",
    outcome: { kind: "completed", provided: reported, inputBound: 50n, counted: 9n },
    free: true,
    status: "completed",
    billing: "void",
    usage: reported,
    usageSource: "provider",
    charge: 0n,
  },
  {
    name: "the answer's body could not be read: void",
    outcome: { kind: "unreadable" },
    wakes: true,
    status: "failed",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "the provider failed while answering",
  },
  {
    name: "the answer is not JSON: void",
    outcome: { kind: "invalid_json" },
    status: "failed",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "the provider answered invalid JSON",
  },
  {
    name: "the provider failed mid-stream: the output delivered only (28), no wake fee",
    outcome: { kind: "provider_failed", delivered: 4n },
    wakes: true,
    status: "failed",
    billing: "partial",
    usage: { inputTokens: 0n, outputTokens: 4n },
    usageSource: "gateway",
    charge: 28n,
    error: "the provider failed mid-stream",
  },
  {
    name: "the provider failed mid-stream before any output: void",
    outcome: { kind: "provider_failed", delivered: 0n },
    status: "failed",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "the provider failed mid-stream",
  },
  {
    name: "the orphan rule took the request while served: the output delivered (28)",
    outcome: { kind: "orphaned", delivered: 4n },
    status: "failed",
    billing: "partial",
    usage: { inputTokens: 0n, outputTokens: 4n },
    usageSource: "gateway",
    charge: 28n,
    error: "closed by the orphan rule while served",
  },
  {
    name: "the client left mid-answer: input plus the output delivered (15 + 28), no wake fee",
    outcome: { kind: "cancelled", by: "client", dispatched: true, input: 10n, delivered: 4n },
    wakes: true,
    status: "cancelled",
    billing: "partial",
    usage: { inputTokens: 10n, outputTokens: 4n },
    usageSource: "gateway",
    charge: 43n,
    error: "client disconnected",
  },
  {
    name: "shutdown cut a dispatched call before any output: its input (ceil 4.5)",
    outcome: { kind: "cancelled", by: "shutdown", dispatched: true, input: 3n, delivered: 0n },
    status: "cancelled",
    billing: "partial",
    usage: { inputTokens: 3n, outputTokens: 0n },
    usageSource: "gateway",
    charge: 5n,
    error: "cut by the gateway's shutdown",
  },
  {
    name: "a cancellation charged above the quote: capped",
    outcome: { kind: "cancelled", by: "client", dispatched: true, input: 100n, delivered: 200n },
    status: "cancelled",
    billing: "partial",
    usage: { inputTokens: 100n, outputTokens: 200n },
    usageSource: "gateway",
    charge: maximum,
    error: "client disconnected",
  },
  {
    name: "the client left before the provider got the request: void, nothing charged",
    outcome: { kind: "cancelled", by: "client", dispatched: false, input: 50n, delivered: 0n },
    wakes: true,
    status: "cancelled",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "client disconnected before the provider got the request",
  },
  {
    name: "shutdown before the provider got the request: void",
    outcome: { kind: "cancelled", by: "shutdown", dispatched: false, input: 50n, delivered: 0n },
    status: "cancelled",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "cut by the gateway's shutdown before the provider got the request",
  },
  {
    name: "a step before the first byte failed with its own message: void",
    outcome: { kind: "failed", reason: "the provider answered HTTP 400" },
    wakes: true,
    status: "failed",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "the provider answered HTTP 400",
  },
  {
    name: "a step before the first byte failed without a message: void",
    outcome: { kind: "failed", reason: undefined },
    status: "failed",
    billing: "void",
    usage: none,
    usageSource: "gateway",
    charge: 0n,
    error: "the provider failed before the first byte",
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
    expect(closing).toEqual({
      status: row.status,
      usage: row.usage,
      billing: row.billing,
      usageSource: row.usageSource,
      error: row.error,
      charge: row.charge,
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
