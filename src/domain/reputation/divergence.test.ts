import { describe, expect, it } from "vitest";
import type { OfferMeasurement } from "./measurement-types.js";
import {
  isConfirmationDue,
  isDivergenceFlagged,
  isExclusionDue,
  usageDivergenceOf,
} from "./divergence.js";

const measured = (
  claimed: number,
  diverged: number,
  excluded = false,
  divergedPayers = 3,
): OfferMeasurement => ({
  latencyMs: undefined,
  throughput: undefined,
  served: claimed,
  failed: 0,
  samples: 0,
  claimed,
  diverged,
  divergedPayers,
  excluded,
});

describe("usage divergence thresholds", () => {
  it("flags above 10 % of at least 20 claimed answers; one unlucky answer never", () => {
    expect(usageDivergenceOf(undefined)).toEqual({
      claimed: 0,
      diverged: 0,
      shareBps: undefined,
      payers: 0,
      flagged: false,
      excluded: false,
    });
    // One answer of one: 100 %, but too few to say anything.
    expect(usageDivergenceOf(measured(1, 1))).toEqual({
      claimed: 1,
      diverged: 1,
      shareBps: 10000,
      payers: 3,
      flagged: false,
      excluded: false,
    });
    expect(isDivergenceFlagged(measured(19, 19))).toBe(false);
    expect(isDivergenceFlagged(measured(20, 2))).toBe(false);
    expect(usageDivergenceOf(measured(20, 3))).toEqual({
      claimed: 20,
      diverged: 3,
      shareBps: 1500,
      payers: 3,
      flagged: true,
      excluded: false,
    });
    // Exactly 10 % is not more than 10 %; 1 more diverged of 100 is.
    expect(isDivergenceFlagged(measured(100, 10))).toBe(false);
    expect(isDivergenceFlagged(measured(100, 11))).toBe(true);
    // An exclusion standing flags the offer whatever its window says.
    expect(usageDivergenceOf(measured(0, 0, true))).toMatchObject({
      flagged: true,
      excluded: true,
    });
  });

  it("calls for an exclusion above 50 % of at least 20, unless one stands", () => {
    expect(isExclusionDue(undefined)).toBe(false);
    expect(isExclusionDue(measured(19, 19))).toBe(false);
    expect(isExclusionDue(measured(20, 10))).toBe(false);
    expect(isExclusionDue(measured(20, 11))).toBe(true);
    expect(isExclusionDue(measured(20, 11, true))).toBe(false);
  });

  it("needs more than one payer to flag and three to exclude; fewer call for the probe", () => {
    // 25 diverged answers of one payer: neither flagged nor excluded, whatever the share.
    expect(isDivergenceFlagged(measured(25, 25, false, 1))).toBe(false);
    expect(isExclusionDue(measured(25, 25, false, 1))).toBe(false);
    expect(isConfirmationDue(measured(25, 25, false, 1))).toBe(true);
    expect(usageDivergenceOf(measured(25, 25, false, 1))).toMatchObject({
      shareBps: 10000,
      payers: 1,
      flagged: false,
    });
    // Two payers flag; three exclude.
    expect(isDivergenceFlagged(measured(25, 25, false, 2))).toBe(true);
    expect(isExclusionDue(measured(25, 25, false, 2))).toBe(false);
    expect(isConfirmationDue(measured(25, 25, false, 2))).toBe(true);
    expect(isExclusionDue(measured(25, 25, false, 3))).toBe(true);
    expect(isConfirmationDue(measured(25, 25, false, 3))).toBe(false);
    // Below the share, or standing: nothing to confirm.
    expect(isConfirmationDue(measured(20, 10, false, 1))).toBe(false);
    expect(isConfirmationDue(measured(25, 25, true, 1))).toBe(false);
    // An exclusion standing flags the offer whatever its payers.
    expect(isDivergenceFlagged(measured(0, 0, true, 0))).toBe(true);
  });
});
