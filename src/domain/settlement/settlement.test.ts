import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import {
  aggregateCharges,
  bump,
  capFees,
  entriesUnder,
  reconcile,
  replacementFees,
  type PendingCharge,
} from "./index.js";

const P1 = `0x${"01".repeat(32)}` as Hex;
const P2 = `0x${"02".repeat(32)}` as Hex;
const O1 = `0x${"a1".repeat(32)}` as Hex;
const O2 = `0x${"a2".repeat(32)}` as Hex;
const charge = (
  requestId: string,
  permitId: Hex,
  offerId: Hex,
  credits: bigint,
): PendingCharge => ({
  requestId,
  permitId,
  offerId,
  credits,
  closableAt: undefined,
});

describe("aggregateCharges", () => {
  it("sums each (permit, offer) pair into one entry, in the order pairs first appear", () => {
    const entries = aggregateCharges([
      charge("r1", P2, O1, 5n),
      charge("r2", P1, O1, 7n),
      charge("r3", P2, O1, 11n),
      charge("r4", P2, O2, 13n),
    ]);
    expect(entries).toEqual([
      { permitId: P2, offerId: O1, amount: 16n, requests: 2, requestIds: ["r1", "r3"] },
      { permitId: P1, offerId: O1, amount: 7n, requests: 1, requestIds: ["r2"] },
      { permitId: P2, offerId: O2, amount: 13n, requests: 1, requestIds: ["r4"] },
    ]);
  });
});

const noCap = { maxFeePerGas: 10n ** 30n, maxPriorityFeePerGas: 10n ** 30n };

describe("fees of a replacement", () => {
  it("raise both fee fields by the percentage, rounded up, or follow the market when it is higher", () => {
    expect(bump(100n, 15)).toBe(115n);
    expect(bump(101n, 15)).toBe(117n); // 116.15 rounded up
    expect(
      replacementFees(
        { maxFeePerGas: 1000n, maxPriorityFeePerGas: 10n },
        { maxFeePerGas: 900n, maxPriorityFeePerGas: 50n },
        20,
        noCap,
      ),
    ).toEqual({ maxFeePerGas: 1200n, maxPriorityFeePerGas: 50n });
    // The fee cap never falls below the tip.
    expect(
      replacementFees(
        { maxFeePerGas: 10n, maxPriorityFeePerGas: 10n },
        { maxFeePerGas: 5n, maxPriorityFeePerGas: 40n },
        15,
        noCap,
      ),
    ).toEqual({ maxFeePerGas: 40n, maxPriorityFeePerGas: 40n });
  });

  it("never pass the cap, and are not made when the cap leaves less than the 10% a node takes", () => {
    const cap = { maxFeePerGas: 1300n, maxPriorityFeePerGas: 130n };
    const market = { maxFeePerGas: 1n, maxPriorityFeePerGas: 1n };
    // 1200/120 is under the cap: a full bump.
    expect(
      replacementFees({ maxFeePerGas: 1000n, maxPriorityFeePerGas: 100n }, market, 20, cap),
    ).toEqual({ maxFeePerGas: 1200n, maxPriorityFeePerGas: 120n });
    // 1320/132 would pass it: held to 1300/130, still 10% above 1180/118.
    expect(
      replacementFees({ maxFeePerGas: 1100n, maxPriorityFeePerGas: 110n }, market, 20, cap),
    ).toEqual({ maxFeePerGas: 1300n, maxPriorityFeePerGas: 130n });
    // 1440/144 held to 1300/130 is only 8.3% above 1200/120: no replacement.
    expect(
      replacementFees({ maxFeePerGas: 1200n, maxPriorityFeePerGas: 120n }, market, 20, cap),
    ).toBeUndefined();
    // At the cap: nothing left to raise.
    expect(replacementFees(cap, market, 20, cap)).toBeUndefined();
    // The tip at its cap holds the replacement back even though the fee could still rise.
    expect(
      replacementFees({ maxFeePerGas: 500n, maxPriorityFeePerGas: 130n }, market, 20, cap),
    ).toBeUndefined();
    // A market above the cap is held to it too.
    expect(
      replacementFees(
        { maxFeePerGas: 100n, maxPriorityFeePerGas: 10n },
        { maxFeePerGas: 5000n, maxPriorityFeePerGas: 500n },
        20,
        cap,
      ),
    ).toEqual(cap);
  });

  it("of a first attempt: the market's, held to the cap field by field, the fee never below the tip", () => {
    const cap = { maxFeePerGas: 500n, maxPriorityFeePerGas: 50n };
    expect(capFees({ maxFeePerGas: 400n, maxPriorityFeePerGas: 40n }, cap)).toEqual({
      maxFeePerGas: 400n,
      maxPriorityFeePerGas: 40n,
    });
    expect(capFees({ maxFeePerGas: 900n, maxPriorityFeePerGas: 90n }, cap)).toEqual(cap);
    expect(capFees({ maxFeePerGas: 30n, maxPriorityFeePerGas: 90n }, cap)).toEqual({
      maxFeePerGas: 50n,
      maxPriorityFeePerGas: 50n,
    });
  });
});

describe("entriesUnder", () => {
  it("plans at least one entry and more under a larger gas bound", () => {
    expect(entriesUnder(100_000n)).toBe(1);
    expect(entriesUnder(12_000_000n)).toBeGreaterThan(100);
  });
});

describe("reconcile", () => {
  it("reports drift per permit and per offer, and none when the three sums agree", () => {
    const clean = reconcile({
      account: "0x01",
      gateway: {
        permits: [{ permitId: P1, settled: 10n, unsettleable: 0n, ledgerSettled: 10n }],
        offers: [{ offerId: O1, settled: 10n }],
      },
      chainPermits: new Map([[P1, 10n]]),
      chainOffers: new Map([[O1, 10n]]),
    });
    expect(clean.drift).toBe(false);
    const drifted = reconcile({
      account: "0x01",
      gateway: {
        permits: [{ permitId: P1, settled: 11n, unsettleable: 0n, ledgerSettled: 10n }],
        offers: [{ offerId: O1, settled: 11n }],
      },
      chainPermits: new Map([
        [P1, 10n],
        [P2, 3n],
      ]),
      chainOffers: new Map([[O1, 13n]]),
    });
    expect(drifted.drift).toBe(true);
    expect(drifted.permits.map((p) => [p.permitId, p.drift])).toEqual([
      [P1, true],
      [P2, true],
    ]);
    expect(drifted.offers).toEqual([
      { offerId: O1, gatewayPaid: 11n, chainPaid: 13n, drift: true },
    ]);
  });
});
