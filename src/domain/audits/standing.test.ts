import { describe, expect, it } from "vitest";
import type { Hex } from "viem";
import { createAuditStandings, decimalString, isModelMismatch } from "./standing.js";
import type { OfferAuditStanding } from "./types.js";

describe("decimalString: a statistic as six significant digits, never in exponent form", () => {
  it.each([
    [1, "1"],
    [0, "0"],
    [0.5, "0.5"],
    [1234.5678, "1234.57"],
    [0.0123456789, "0.0123457"],
    [1.5e-7, "0.00000015"],
    [2.5e21, "2500000000000000000000"],
    [123456789, "123457000"],
    [-0.25, "-0.25"],
    [Number.NaN, "0"],
  ])("%s -> %s", (value, text) => {
    expect(decimalString(value)).toBe(text);
  });

  it("shows an infinite e-value as the largest finite double, in plain digits", () => {
    const text = decimalString(Number.POSITIVE_INFINITY);
    expect(text).toMatch(/^179769[0-9]{303}$/);
  });
});

describe("the standings every process holds", () => {
  const offer = `0x${"11".repeat(32)}` as Hex;
  const standing = (state: OfferAuditStanding["state"]): OfferAuditStanding => ({
    offerId: offer,
    modelId: `0x${"22".repeat(32)}` as Hex,
    state,
    eValue: 500,
    flagAt: 40,
    excludeAt: 400,
    reference: { kind: "majority" },
    tests: [],
    updatedAtMs: 1,
  });

  it("is unaudited without a standing, and keeps what it had when a read fails", async () => {
    let answer: Map<Hex, OfferAuditStanding> | Error = new Map([[offer, standing("excluded")]]);
    const standings = createAuditStandings({
      store: {
        read: async () => {
          if (answer instanceof Error) throw answer;
          return answer;
        },
      },
      intervalMs: 60_000,
    });
    expect(standings.stateOf(offer)).toBe("unaudited");
    await standings.refresh();
    expect(standings.stateOf(offer)).toBe("excluded");
    answer = new Error("database down");
    await expect(standings.refresh()).rejects.toThrow("database down");
    // A failed round lifts no exclusion.
    expect(standings.stateOf(offer)).toBe("excluded");
    expect(standings.all()).toHaveLength(1);
    answer = new Map();
    await standings.refresh();
    expect(standings.stateOf(offer)).toBe("unaudited");
  });

  it("calls flagged and excluded offers model_mismatch", () => {
    expect(
      ["unaudited", "passing", "flagged", "excluded"].map((s) => isModelMismatch(s as never)),
    ).toEqual([false, false, true, true]);
  });
});
