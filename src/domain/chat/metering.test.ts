import { describe, expect, it } from "vitest";
import { priceCredits } from "../pricing.js";
import { deltaText, hasDeltaText, StreamMetering, utf8Bytes } from "./metering.js";

const tariff = { inputPricePerMTok: 1_500_000n, outputPricePerMTok: 7_000_000n, wakeFee: 9n };

describe("stream metering", () => {
  it("prices the tokens so far when read, capped at the maximum, never with the wake fee", () => {
    const m = new StreamMetering(tariff, 1_000n, 12n, 30n);
    expect(m.inputTokens).toBe(12n);
    expect(m.outputTokens).toBe(30n);
    expect(m.credits).toBe(priceCredits(tariff, { inputTokens: 12n, outputTokens: 30n }, false));
    expect(new StreamMetering(tariff, 100n, 12n, 30n).credits).toBe(100n);
  });

  it("serialises as a plain metering, credits included", () => {
    const m = new StreamMetering(tariff, 1_000n, 12n, 30n);
    const json = JSON.stringify({ m }, (_key, value: unknown) =>
      typeof value === "bigint" ? value.toString() : value,
    );
    expect(JSON.parse(json)).toEqual({
      m: { inputTokens: "12", outputTokens: "30", credits: m.credits.toString() },
    });
  });
});

describe("hasDeltaText", () => {
  it.each([
    [{ choices: [{ delta: { content: "hi" } }] }],
    [{ choices: [{ delta: { content: "" } }, { delta: { content: "x" } }] }],
    [{ choices: [{ delta: {} }] }],
    [{ choices: [] }],
    [{ choices: [null, { delta: { content: 3 } }] }],
    [{ usage: {} }],
    [null],
    [undefined],
    ["text"],
  ])("agrees with deltaText for %j", (chunk) => {
    expect(hasDeltaText(chunk)).toBe(deltaText(chunk) !== "");
  });
});

describe("utf8Bytes", () => {
  it("is the UTF-8 of the text as a plain Uint8Array", () => {
    for (const text of ["", "data", "grüße 👋", "x".repeat(10_000)]) {
      const bytes = utf8Bytes(text);
      expect(Object.getPrototypeOf(bytes)).toBe(Uint8Array.prototype);
      expect([...bytes]).toEqual([...new TextEncoder().encode(text)]);
    }
  });
});
