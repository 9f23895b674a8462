import { describe, expect, it } from "vitest";
import { priceCredits } from "../pricing.js";
import {
  completionText,
  deltaText,
  deltaTextChoices,
  StreamMetering,
  utf8Bytes,
} from "./metering.js";

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

describe("deltaTextChoices", () => {
  it.each([
    [{ choices: [{ delta: { content: "hi" } }] }, 1n],
    [{ choices: [{ delta: { content: "" } }, { delta: { content: "x" } }] }, 1n],
    [{ choices: [{ delta: {} }] }, 0n],
    [{ choices: [] }, 0n],
    [{ choices: [null, { delta: { content: 3 } }] }, 0n],
    [{ usage: {} }, 0n],
    [null, 0n],
    [undefined, 0n],
    ["text", 0n],
  ])("agrees with deltaText for %j", (chunk, count) => {
    expect(deltaTextChoices(chunk)).toBe(count);
    expect(deltaTextChoices(chunk) > 0n).toBe(deltaText(chunk) !== "");
  });

  it("counts every choice of a chunk that carries text for several (n > 1, batched)", () => {
    const chunk = {
      choices: [0, 1, 2, 3].map((index) => ({ index, delta: { content: ` w${index}` } })),
    };
    expect(deltaTextChoices(chunk)).toBe(4n);
  });
});

describe("completionText", () => {
  it("is the text of every choice of a JSON answer, not only the first", () => {
    const body = {
      choices: [0, 1, 2].map((index) => ({ index, message: { content: "abcd" } })),
    };
    expect(completionText(body)).toBe("abcdabcdabcd");
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
