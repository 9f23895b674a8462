import { describe, expect, it } from "vitest";
import { GatewayError } from "./errors.js";
import {
  earningsWindow,
  foldEarnings,
  maxEarningsBatches,
  type EarningsBatch,
} from "./offer-earnings.js";

const now = 1_800_000_000;
const day = 86_400;

describe("earningsWindow", () => {
  it.each([
    [{}, { from: now + 1 - 30 * day, to: now + 1 }],
    [{ to: 1000 }, { from: 0, to: 1000 }],
    [
      { from: 10, to: 20 },
      { from: 10, to: 20 },
    ],
    [
      { from: 10n, to: 10n + 366n * 86_400n },
      { from: 10, to: 10 + 366 * day },
    ],
  ])("%o -> %o", (req, window) => {
    expect(earningsWindow(req, now)).toEqual(window);
  });

  it.each([
    { from: 20, to: 20 },
    { from: 21, to: 20 },
    { from: 0, to: 366 * day + 1 },
    { from: -1 },
    { to: 1.5 },
    { from: 2 ** 53 },
  ])("refuses %o", (req) => {
    expect(() => earningsWindow(req, now)).toThrow(
      expect.objectContaining({ code: "invalid_request" }) as GatewayError,
    );
  });
});

describe("foldEarnings", () => {
  const meta = {
    offerId: `0x${"aa".repeat(32)}`,
    modelId: `0x${"cc".repeat(32)}`,
    payout: `0x${"bb".repeat(20)}`,
    from: 0,
    to: 9,
  } as const;
  const g = (
    state: "unsettled" | "settling" | "settled" | "unsettleable",
    reason: string | null,
    n: number,
    credits: bigint,
  ) => ({
    state,
    reason,
    requests: n,
    inputTokens: BigInt(n * 10),
    outputTokens: BigInt(n * 20),
    credits,
  });

  it("adds each state's groups, lists unsettleable reasons by credits, and bounds the batches", () => {
    const big = 2n ** 70n;
    const batch = (i: number): EarningsBatch => ({
      batchId: `0x${i.toString(16).padStart(64, "0")}`,
      status: "settled",
      txHash: null,
      createdAt: i,
      settledAt: i,
      requests: 1,
      credits: 1n,
    });
    const folded = foldEarnings(
      {
        groups: [
          g("settled", null, 2, big),
          g("unsettleable", "permit_closed", 1, 5n),
          g("unsettleable", "exceeds_deposit", 3, 7n),
          g("unsettleable", null, 1, 5n),
        ],
        batches: Array.from({ length: maxEarningsBatches + 1 }, (_, i) => batch(i)),
        days: [{ startsAt: 86400, requests: 7, credits: big + 17n, settledCredits: big }],
      },
      meta,
    );
    // The days pass through as the store read them (one snapshot with the totals).
    expect(folded.days).toEqual([
      { startsAt: 86400, requests: 7, credits: big + 17n, settledCredits: big },
    ]);
    expect(folded.totals.settled).toEqual({
      requests: 2,
      inputTokens: 20n,
      outputTokens: 40n,
      credits: big,
    });
    expect(folded.totals.unsettled).toEqual({
      requests: 0,
      inputTokens: 0n,
      outputTokens: 0n,
      credits: 0n,
    });
    expect(folded.totals.unsettleable).toEqual({
      requests: 5,
      inputTokens: 50n,
      outputTokens: 100n,
      credits: 17n,
    });
    expect(folded.unsettleableReasons).toEqual([
      { reason: "exceeds_deposit", requests: 3, credits: 7n },
      { reason: "permit_closed", requests: 1, credits: 5n },
      { reason: "unknown", requests: 1, credits: 5n },
    ]);
    expect(folded.batches).toHaveLength(maxEarningsBatches);
    expect(folded.batchesTruncated).toBe(true);
  });
});
