import { describe, expect, it } from "vitest";
import { priceCredits } from "../pricing.js";
import { closingOf, deltaTextChoices, StreamMetering, usageOf, utf8Bytes } from "./metering.js";

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
  ])("counts the choices of %j that carry text", (chunk, count) => {
    expect(deltaTextChoices(chunk)).toBe(count);
  });

  it("counts every choice of a chunk that carries text for several (n > 1, batched)", () => {
    const chunk = {
      choices: [0, 1, 2, 3].map((index) => ({ index, delta: { content: ` w${index}` } })),
    };
    expect(deltaTextChoices(chunk)).toBe(4n);
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

describe("usageOf: usage details", () => {
  const totals = { prompt_tokens: 20, completion_tokens: 8 };
  const details = (cached: unknown, reasoning: unknown) => ({
    usage: {
      ...totals,
      prompt_tokens_details: { cached_tokens: cached },
      completion_tokens_details: { reasoning_tokens: reasoning },
    },
  });

  it("reads cached and reasoning tokens within their totals", () => {
    expect(usageOf(details(12, 5))).toEqual({
      inputTokens: 20n,
      outputTokens: 8n,
      cachedInputTokens: 12n,
      reasoningTokens: 5n,
    });
    // At the totals, and at 0.
    expect(usageOf(details(20, 8))).toMatchObject({ cachedInputTokens: 20n, reasoningTokens: 8n });
    expect(usageOf(details(0, 0))).toMatchObject({ cachedInputTokens: 0n, reasoningTokens: 0n });
  });

  it("is 0 for both when the provider reports no details", () => {
    expect(usageOf({ usage: totals })).toEqual({
      inputTokens: 20n,
      outputTokens: 8n,
      cachedInputTokens: 0n,
      reasoningTokens: 0n,
    });
    expect(
      usageOf({ usage: { ...totals, prompt_tokens_details: null, completion_tokens_details: {} } }),
    ).toMatchObject({ cachedInputTokens: 0n, reasoningTokens: 0n });
  });

  it.each([
    ["above its total", 21, 9],
    ["negative", -1, -5],
    ["fractional", 2.5, 0.5],
    ["a string", "12", "5"],
    ["unsafe", 2 ** 53, Number.MAX_VALUE],
    ["not finite", Number.NaN, Number.POSITIVE_INFINITY],
    ["null", null, null],
    ["an object", { n: 1 }, [5]],
    ["a bigint", 12n, 5n],
  ])(
    "ignores a detail that is %s (recorded 0), and keeps the totals",
    (_what, cached, reasoning) => {
      expect(usageOf(details(cached, reasoning))).toEqual({
        inputTokens: 20n,
        outputTokens: 8n,
        cachedInputTokens: 0n,
        reasoningTokens: 0n,
      });
    },
  );

  it("judges each detail on its own", () => {
    expect(usageOf(details(21, 5))).toMatchObject({ cachedInputTokens: 0n, reasoningTokens: 5n });
    expect(usageOf(details(12, 9))).toMatchObject({ cachedInputTokens: 12n, reasoningTokens: 0n });
  });

  it("ignores details that are not objects", () => {
    for (const [p, c] of [
      [[12], [5]],
      ["12", "5"],
      [12, 5],
    ] as const) {
      expect(
        usageOf({ usage: { ...totals, prompt_tokens_details: p, completion_tokens_details: c } }),
      ).toMatchObject({ cachedInputTokens: 0n, reasoningTokens: 0n });
    }
  });

  it("still refuses bad totals (no usage), whatever the details", () => {
    expect(
      usageOf({ usage: { prompt_tokens: -1, completion_tokens: 8, prompt_tokens_details: {} } }),
    ).toBeUndefined();
  });

  it("does not change the price: a closing charges the same with and without details", () => {
    const close = (usage: NonNullable<ReturnType<typeof usageOf>>) =>
      closingOf({
        status: "completed",
        usage,
        billing: "billed",
        usageSource: "provider",
        error: undefined,
        tariff: { ...tariff, version: 1n },
        wakes: false,
        maximum: 10n ** 18n,
        offerId: `0x${"00".repeat(32)}`,
      });
    const withDetails = close(usageOf(details(12, 5))!);
    const without = close(usageOf({ usage: totals })!);
    expect(withDetails.charge).toBe(without.charge);
    expect(withDetails.charge).toBe(
      priceCredits(tariff, { inputTokens: 20n, outputTokens: 8n }, false),
    );
    expect(withDetails.usage).toMatchObject({ cachedInputTokens: 12n, reasoningTokens: 5n });
  });
});
