import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  chargeFor,
  maximumCredits,
  priceCredits,
  tokensPerPriceUnit,
  type PriceSchedule,
  type TokenUsage,
} from "./pricing.js";

const amount = fc.bigInt({ min: 0n, max: 2n ** 128n });
const tokens = fc.bigInt({ min: 0n, max: 2n ** 64n });
const tariffs = fc.record({
  inputPricePerMTok: amount,
  outputPricePerMTok: amount,
  wakeFee: amount,
});
const usages = fc.record({ inputTokens: tokens, outputTokens: tokens });

/** The exact rational price, scaled by 1e6 so it is an integer. */
function exactTimesMillion(t: PriceSchedule, u: TokenUsage, wakes: boolean): bigint {
  return (
    u.inputTokens * t.inputPricePerMTok +
    u.outputTokens * t.outputPricePerMTok +
    (wakes ? t.wakeFee * tokensPerPriceUnit : 0n)
  );
}

describe("priceCredits", () => {
  it("prices the demo tariff exactly", () => {
    const demo = {
      inputPricePerMTok: 2_000_000_000_000_000n,
      outputPricePerMTok: 6_000_000_000_000_000n,
      wakeFee: 10_000_000_000_000n,
    };
    expect(priceCredits(demo, { inputTokens: 12n, outputTokens: 7n }, false)).toBe(
      12n * 2_000_000_000n + 7n * 6_000_000_000n,
    );
    expect(priceCredits(demo, { inputTokens: 12n, outputTokens: 7n }, true)).toBe(
      12n * 2_000_000_000n + 7n * 6_000_000_000n + 10_000_000_000_000n,
    );
  });

  it("rounds each side up on its own", () => {
    const t = { inputPricePerMTok: 1n, outputPricePerMTok: 1n, wakeFee: 5n };
    expect(priceCredits(t, { inputTokens: 1n, outputTokens: 1n }, false)).toBe(2n);
    expect(priceCredits(t, { inputTokens: 1_000_000n, outputTokens: 0n }, false)).toBe(1n);
    expect(priceCredits(t, { inputTokens: 1_000_001n, outputTokens: 0n }, true)).toBe(7n);
  });

  it("is zero for zero usage without a wake", () => {
    fc.assert(
      fc.property(tariffs, (t) => {
        expect(priceCredits(t, { inputTokens: 0n, outputTokens: 0n }, false)).toBe(0n);
        expect(priceCredits(t, { inputTokens: 0n, outputTokens: 0n }, true)).toBe(t.wakeFee);
      }),
    );
  });

  it("is never below the exact rational price and less than 2 above it", () => {
    fc.assert(
      fc.property(tariffs, usages, fc.boolean(), (t, u, wakes) => {
        const scaled = priceCredits(t, u, wakes) * tokensPerPriceUnit;
        const exact = exactTimesMillion(t, u, wakes);
        expect(scaled >= exact).toBe(true);
        expect(scaled < exact + 2n * tokensPerPriceUnit).toBe(true);
      }),
    );
  });

  it("is monotone in every argument", () => {
    fc.assert(
      fc.property(
        tariffs,
        usages,
        fc.boolean(),
        fc.record({ a: tokens, b: tokens, c: amount, d: amount, e: amount }),
        (t, u, wakes, d) => {
          const base = priceCredits(t, u, wakes);
          const more = (t2: PriceSchedule, u2: TokenUsage, w2: boolean) =>
            expect(priceCredits(t2, u2, w2) >= base).toBe(true);
          more(t, { ...u, inputTokens: u.inputTokens + d.a }, wakes);
          more(t, { ...u, outputTokens: u.outputTokens + d.b }, wakes);
          more({ ...t, inputPricePerMTok: t.inputPricePerMTok + d.c }, u, wakes);
          more({ ...t, outputPricePerMTok: t.outputPricePerMTok + d.d }, u, wakes);
          more({ ...t, wakeFee: t.wakeFee + d.e }, u, wakes);
          more(t, u, true);
        },
      ),
    );
  });

  it("rejects negative amounts", () => {
    const t = { inputPricePerMTok: 1n, outputPricePerMTok: 1n, wakeFee: 0n };
    expect(() => priceCredits(t, { inputTokens: -1n, outputTokens: 0n }, false)).toThrow(
      RangeError,
    );
    expect(() =>
      priceCredits({ ...t, wakeFee: -1n }, { inputTokens: 0n, outputTokens: 0n }, true),
    ).toThrow(RangeError);
  });
});

describe("maximumCredits and chargeFor", () => {
  it("never charges more than the maximum, and prices usage within the bounds exactly", () => {
    fc.assert(
      fc.property(tariffs, usages, usages, fc.boolean(), (t, bound, used, wakes) => {
        const maximum = maximumCredits(
          t,
          { inputTokenBound: bound.inputTokens, outputBound: bound.outputTokens },
          wakes,
        );
        const charge = chargeFor(t, used, wakes, maximum);
        expect(charge.credits <= maximum).toBe(true);
        const within =
          used.inputTokens <= bound.inputTokens && used.outputTokens <= bound.outputTokens;
        if (within) {
          expect(charge).toEqual({ credits: priceCredits(t, used, wakes), capped: false });
        }
        expect(charge.capped).toBe(priceCredits(t, used, wakes) > maximum);
      }),
    );
  });

  it("caps and flags usage priced above the maximum", () => {
    const t = { inputPricePerMTok: 1_000_000n, outputPricePerMTok: 1_000_000n, wakeFee: 0n };
    expect(chargeFor(t, { inputTokens: 5n, outputTokens: 5n }, false, 7n)).toEqual({
      credits: 7n,
      capped: true,
    });
  });
});
