import { describe, expect, it } from "vitest";
import { isFailing, reputationOf } from "./reputation.js";

const measured = (m: Partial<Parameters<typeof reputationOf>[0] & object> = {}) => ({
  latencyMs: undefined,
  throughput: undefined,
  served: 0,
  failed: 0,
  samples: 0,
  claimed: 0,
  diverged: 0,
  excluded: false,
  ...m,
});
const counts = (passed: number, rejected: number, flags: number) => ({
  verificationsPassed: passed,
  verificationsRejected: rejected,
  flags,
});

const noDivergence = {
  claimed: 0,
  diverged: 0,
  shareBps: undefined,
  payers: 0,
  flagged: false,
  excluded: false,
};

describe("offer reputation", () => {
  it("shows nothing measured and no score for a new offer", () => {
    expect(reputationOf(undefined, undefined, 900)).toEqual({
      score: undefined,
      successRateBps: undefined,
      timeToFirstTokenMs: undefined,
      outputTokensPerSecond: undefined,
      verificationPassRateBps: undefined,
      flags: 0,
      requests: 0,
      windowSeconds: 900,
      usageDivergence: noDivergence,
      modelMismatch: false,
    });
  });

  it("weighs success 4, time to first token 2, throughput 2, verification 2", () => {
    // S = 9000; L = 10000*1000/1250 = 8000; T = 10000*50/100 = 5000; V = 10000*3/4 = 7500.
    const r = reputationOf(
      measured({ served: 9, failed: 1, latencyMs: 250.4, throughput: 49.6, samples: 9 }),
      counts(3, 1, 0),
      900,
    );
    expect(r).toEqual({
      score: Math.floor((4 * 9000 + 2 * 8000 + 2 * 5000 + 2 * 7500) / 10),
      successRateBps: 9000,
      timeToFirstTokenMs: 250,
      outputTokensPerSecond: 50,
      verificationPassRateBps: 7500,
      flags: 0,
      requests: 10,
      windowSeconds: 900,
      usageDivergence: noDivergence,
      modelMismatch: false,
    });
    expect(r.score).toBe(7700);
  });

  it("leaves a term without data out of the mean, with its weight", () => {
    // Only failures: S = 0 is the whole score.
    expect(reputationOf(measured({ failed: 3 }), undefined, 900).score).toBe(0);
    // Served without timing, no runs: S alone.
    expect(reputationOf(measured({ served: 3, failed: 1 }), undefined, 900).score).toBe(7500);
    // Runs only (no traffic): no score, the pass rate shown.
    expect(reputationOf(undefined, counts(1, 1, 0), 900)).toMatchObject({
      score: undefined,
      verificationPassRateBps: 5000,
    });
  });

  it("takes ten times the flagged share of requests off the score", () => {
    // 1 flag in 100 requests (100 bps): the score's factor is 10000 - 1000.
    expect(reputationOf(measured({ served: 100 }), counts(0, 0, 1), 900).score).toBe(9000);
    // 10 % flagged: nothing left.
    expect(reputationOf(measured({ served: 10 }), counts(0, 0, 1), 900).score).toBe(0);
  });

  it("calls an offer failing below 80 % over at least 10 requests", () => {
    expect(isFailing(measured({ served: 7, failed: 3 }))).toBe(true);
    expect(isFailing(measured({ served: 8, failed: 2 }))).toBe(false);
    expect(isFailing(measured({ served: 0, failed: 9 }))).toBe(false);
    expect(isFailing(undefined)).toBe(false);
  });
});

describe("offer reputation: usage divergence", () => {
  it("shows the divergence and takes ten times its share off the score, from 20 claims", () => {
    // Served 20, no timing, no runs: S = 10000 alone.
    const of = (diverged: number, claimed = 20, excluded = false, divergedPayers = 3) =>
      reputationOf(
        measured({ served: 20, claimed, diverged, excluded, divergedPayers }),
        undefined,
        900,
      );
    expect(of(0)).toMatchObject({
      score: 10000,
      usageDivergence: { claimed: 20, diverged: 0, shareBps: 0, flagged: false, excluded: false },
    });
    // 1 of 20: 500 bps, 5000 off the factor.
    expect(of(1).score).toBe(5000);
    expect(of(2).score).toBe(0);
    expect(of(3)).toMatchObject({
      score: 0,
      usageDivergence: { shareBps: 1500, flagged: true, excluded: false },
    });
    // One payer's diverged answers cost nothing: a competitor cannot buy a score down.
    expect(of(20, 20, false, 1)).toMatchObject({
      score: 10000,
      usageDivergence: { shareBps: 10000, payers: 1, flagged: false },
    });
    // Fewer than 20 claims: no penalty yet (one unlucky answer costs nothing).
    expect(of(1, 19).score).toBe(10000);
    // Excluded: 0 whatever the window holds.
    expect(of(0, 20, true)).toMatchObject({
      score: 0,
      usageDivergence: { flagged: true, excluded: true },
    });
  });
});
