import { describe, expect, it } from "vitest";
import { parseCredits, parseDeposit, parseDuration } from "./amounts.js";

describe("parseDeposit", () => {
  it.each([
    ["1000000", 18, false, 1_000_000n],
    // A token whose decimals are unknown still takes base units.
    ["1000000", undefined, false, 1_000_000n],
    ["12.5tokens", 18, false, 12_500_000_000_000_000_000n],
    ["12.5 tokens", 6, false, 12_500_000n],
    ["12.5", 6, true, 12_500_000n],
    ["7", 6, true, 7_000_000n],
    ["1token", 0, false, 1n],
    ["0.000001tokens", 6, false, 1n],
    // Beyond 2^53 and beyond any float's exactness: every digit kept.
    [
      "123456789012345678901.123456789012345678tokens",
      18,
      false,
      123_456_789_012_345_678_901_123_456_789_012_345_678n,
    ],
  ])(
    "%s with %s decimals (tokens flag %s) is %s base units",
    (text, decimals, tokens, expected) => {
      expect(parseDeposit(text, decimals, tokens)).toBe(expected);
    },
  );

  it.each([
    ["0.0000001tokens", 6, false, /at most 6 fractional digits/],
    ["1.5", 18, false, /base units is a whole number/],
    ["0", 18, false, /more than 0/],
    ["0.0tokens", 18, false, /more than 0/],
    ["-5", 18, false, /base units \(1000000\) or tokens/],
    ["1e18", 18, false, /base units \(1000000\) or tokens/],
    ["0x10", 18, false, /base units \(1000000\) or tokens/],
    ["1.tokens", 18, false, /base units \(1000000\) or tokens/],
    ["1tokens", undefined, false, /decimals are unknown .* give base units/],
  ])("refuses %s (%s decimals)", (text, decimals, tokens, message) => {
    expect(() => parseDeposit(text, decimals, tokens)).toThrow(message);
  });
});

describe("parseDuration", () => {
  it.each([
    ["3600", 3600n],
    ["90m", 5400n],
    ["12h", 43_200n],
    ["30d", 2_592_000n],
    ["2w", 1_209_600n],
  ])("%s is %s seconds", (text, expected) => {
    expect(parseDuration(text)).toBe(expected);
  });

  it.each(["0", "0d", "1.5d", "30 days", "-1h", ""])("refuses %j", (text) => {
    expect(() => parseDuration(text)).toThrow(/--expires-in must be/);
  });
});

describe("parseCredits (a cap or threshold as typed)", () => {
  it.each([
    ["2500000", 18, false, "2500000"],
    ["0", 18, false, "0"],
    ["0tokens", 18, false, "0"],
    ["2.5tokens", 18, false, "2500000000000000000"],
    ["2.5", 6, true, "2500000"],
    ["0.000001 tokens", 6, false, "1"],
    // Base units need no decimals: a token that does not state them still takes them.
    ["1000", undefined, false, "1000"],
  ])("%s with %s decimals (--tokens %s) signs %s base units", (text, decimals, tokens, want) => {
    expect(parseCredits(text, "--total-cap", decimals, tokens)).toBe(want);
  });

  it.each([
    ["0.0000001tokens", 6, false, /--period-cap 0.0000001tokens: the token has 6 decimals/],
    ["2.5", 18, false, /--period-cap in base units is a whole number; .*"2.5tokens"/],
    ["1tokens", undefined, false, /decimals are unknown .* give base units/],
    ["-1", 18, false, /--period-cap must be base units \(1000000\) or tokens/],
    [`${1n << 256n}`, 18, false, /above 2\^256 - 1/],
  ])("refuses %s (%s decimals)", (text, decimals, tokens, message) => {
    expect(() => parseCredits(text, "--period-cap", decimals, tokens)).toThrow(message);
  });
});
