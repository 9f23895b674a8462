import fc from "fast-check";
import { describe, expect, it } from "vitest";
// The console's module, as the browser runs it (plain JavaScript, no build step).
// @ts-expect-error -- a JavaScript module without declarations
import { amountText, tokenUnits, unitsText } from "../src/console/units.js";
import { formatAmount, tokenDecimals, tokenSymbol } from "../src/domain/token-units.js";
// @ts-expect-error -- a JavaScript module without declarations
import { auditText } from "../src/console/audit-text.js";

type Units = { decimals?: number; symbol?: string };
const consoleUnits = tokenUnits as (model: object) => Units;
const consoleAmount = amountText as (amount: string, units: Units) => string;
const consoleUnitsText = unitsText as (amount: string, decimals: number) => string;

// The console writes amounts by the same rules as the CLI (src/domain/token-units.ts): the page
// and the terminal must never disagree on what an amount is.
describe("the console's token units", () => {
  it("writes exact token units with the symbol, base units when the decimals are unknown", () => {
    expect(consoleAmount("2000000000000000000", { decimals: 18, symbol: "DCHAT" })).toBe("2 DCHAT");
    expect(consoleAmount("99999999868000000000", { decimals: 18, symbol: "DCHAT" })).toBe(
      "99.999999868 DCHAT",
    );
    expect(consoleAmount("1500000", { decimals: 6 })).toBe("1.5 units");
    expect(consoleAmount("1500000", {})).toBe("1\u202f500\u202f000 base units");
  });

  it("agrees with the CLI's formatter on any amount and decimals", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 2n ** 256n - 1n }), fc.nat(36), (amount, decimals) => {
        const units = { decimals, symbol: "TOK" };
        expect(consoleAmount(amount.toString(), units)).toBe(formatAmount(amount, units));
        expect(consoleUnitsText(amount.toString(), decimals)).toBe(
          formatAmount(amount, units).slice(0, -4),
        );
      }),
    );
  });

  it("shows a model's decimals and symbol only when the CLI would", () => {
    const values: [unknown, unknown][] = [
      [18, "DCHAT"],
      [37, "<b>x</b>"],
      [-1, "USD\u0421"],
      [6.5, "\u001b[2J"],
      [null, null],
      ["18", "A".repeat(17)],
      [0, "$WIF"],
    ];
    for (const [decimals, symbol] of values) {
      const shown = consoleUnits({ credit_token_decimals: decimals, credit_token_symbol: symbol });
      expect(shown.decimals).toBe(
        typeof decimals === "number" && Number.isInteger(decimals)
          ? tokenDecimals(decimals)
          : undefined,
      );
      expect(shown.symbol).toBe(tokenSymbol(typeof symbol === "string" ? symbol : undefined));
    }
  });
});

describe("the console's audit status", () => {
  const text = auditText as (audit: object | null, corpus?: string | null) => string;
  it("names each state with the evidence against its threshold", () => {
    const judged = { e_value: "41.5", flag_at: "20", exclude_at: "1000" };
    expect(text({ state: "unaudited", e_value: "1", flag_at: null, exclude_at: null })).toBe(
      "not audited yet",
    );
    expect(text({ ...judged, state: "passing", e_value: "0.8", reference_kind: "anchor" })).toBe(
      "passing against the anchor (e-value 0.8, flags at 20)",
    );
    expect(text({ ...judged, state: "flagged", reference_kind: "majority" })).toBe(
      "model mismatch: flagged against the majority (e-value 41.5 ≥ 20)",
    );
    expect(text({ ...judged, state: "excluded", e_value: "5000" })).toBe(
      "model mismatch: out of routing until verified again (e-value 5000 ≥ 1000)",
    );
    expect(text(null)).toBe("unknown");
  });

  it("says that a pass comes from public prompts when the audits ask the shipped corpus", () => {
    const passing = { state: "passing", e_value: "0.8", flag_at: "20", reference_kind: "anchor" };
    expect(text(passing, "shipped")).toBe(
      "passing against the anchor (e-value 0.8, flags at 20); the audits ask public prompts, which a provider can tell from clients'",
    );
    expect(text(passing, "operator")).toBe("passing against the anchor (e-value 0.8, flags at 20)");
    // A flag holds whatever the prompts: the provider failed audits it could have recognised.
    expect(text({ ...passing, state: "flagged", e_value: "41.5" }, "shipped")).toBe(
      "model mismatch: flagged against the anchor (e-value 41.5 ≥ 20)",
    );
  });
});
