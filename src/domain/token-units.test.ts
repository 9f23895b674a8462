import { describe, expect, it } from "vitest";
import {
  formatAmount,
  formatAmountExact,
  formatPricePerMTok,
  tokenDecimals,
  tokenSymbol,
  unitsText,
} from "./token-units.js";

describe("unitsText", () => {
  it.each([
    [0n, 18, "0"],
    [1n, 18, "0.000000000000000001"],
    [1_500_000_000_000_000_000n, 18, "1.5"],
    [2_000_000_000_000_000n, 18, "0.002"],
    [99_999_999_868_000_000_000n, 18, "99.999999868"],
    [12_500_000n, 6, "12.5"],
    [7n, 0, "7"],
    [-1_250_000n, 6, "-1.25"],
    // Far beyond 2^53 and any float's exactness: every digit kept.
    [
      123_456_789_012_345_678_901_123_456_789_012_345_678n,
      18,
      "123456789012345678901.123456789012345678",
    ],
  ])("%s with %i decimals is %s", (amount, decimals, expected) => {
    expect(unitsText(amount, decimals)).toBe(expected);
  });
});

describe("formatAmount", () => {
  it("writes token units with the symbol", () => {
    expect(formatAmount(2_000_000_000_000_000n, { decimals: 18, symbol: "DCHAT" })).toBe(
      "0.002 DCHAT",
    );
  });

  it("says units when the token has no symbol to show", () => {
    expect(formatAmount(1_500_000n, { decimals: 6 })).toBe("1.5 units");
    expect(formatAmount(1_500_000n, { decimals: 6, symbol: "\u001b[31mUSDC" })).toBe("1.5 units");
  });

  it("keeps base units when the decimals are unknown, never guessing 18", () => {
    expect(formatAmount(1_500_000n, { symbol: "USDC" })).toBe("1500000 base units");
    expect(formatAmount(1_500_000n, { decimals: 255, symbol: "USDC" })).toBe("1500000 base units");
  });

  it("gives the exact base units beside the token units", () => {
    expect(formatAmountExact(1_500_000_000_000_000_000n, { decimals: 18, symbol: "DCHAT" })).toBe(
      "1.5 DCHAT (1500000000000000000 base units)",
    );
    expect(formatAmountExact(15n, {})).toBe("15 base units");
  });

  it("writes prices per million tokens", () => {
    expect(formatPricePerMTok(2_000_000_000_000_000_000n, { decimals: 18, symbol: "DCODE" })).toBe(
      "2 DCODE per million tokens",
    );
  });
});

describe("what a token contract answers", () => {
  it.each([
    [18n, 18],
    [0, 0],
    [36n, 36],
    [37n, undefined],
    [-1n, undefined],
    [2n ** 255n, undefined],
    [undefined, undefined],
  ])("decimals %s -> %s", (value, expected) => {
    expect(tokenDecimals(value)).toBe(expected);
  });

  it.each([
    ["DCHAT", "DCHAT"],
    ["USDC.e", "USDC.e"],
    ["$WIF", "$WIF"],
    ["A".repeat(16), "A".repeat(16)],
    ["A".repeat(17), undefined],
    ["", undefined],
    ["<img src=x onerror=alert(1)>", undefined],
    ["\u001b]0;pwned\u0007", undefined],
    ["USD\u0421", undefined], // a Cyrillic С
    ["TWO WORDS", undefined],
    ["LINE\nBREAK", undefined],
    [undefined, undefined],
  ])("symbol %j -> %j", (value, expected) => {
    expect(tokenSymbol(value)).toBe(expected);
  });
});
