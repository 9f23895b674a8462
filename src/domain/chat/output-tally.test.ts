import { describe, expect, it } from "vitest";
import { boundCounter, type TokenCounter } from "../tokens.js";
import {
  countText,
  exactSegmentMaxBytes,
  longRunChars,
  OutputTally,
  streamSegmentBytes,
} from "./output-tally.js";

/**
 * A counter whose tokens are the text's non-space runs and each space before them (" w1" is
 * one token, like a BPE word piece): exact, and easy to work out by hand.
 */
let counted = 0;
const words: TokenCounter = {
  exact: true,
  name: "words",
  countInput: () => 0n,
  countOutput(text) {
    counted += 1;
    return BigInt(text.match(/\s*\S+|\s+$/g)?.length ?? 0);
  },
  truncate(text, limit) {
    const tokens = text.match(/\s*\S+|\s+$/g) ?? [];
    return tokens.slice(0, Number(limit)).join("");
  },
};

const chunk = (index: number, delta: Record<string, unknown>) => ({
  id: "c",
  choices: [{ index, delta, finish_reason: null }],
});
const wordsFrom = (from: number, to: number) =>
  Array.from({ length: to - from }, (_, i) => ` w${from + i}`).join("");

describe("OutputTally on a stream", () => {
  it("counts every kind of visible output of every choice at the close", () => {
    const tally = new OutputTally(words, 100n, 2n);
    const parts = [
      chunk(0, { reasoning_content: " think a bit" }),
      chunk(0, { content: " hello there" }),
      chunk(1, { reasoning: " also" }),
      chunk(1, {
        tool_calls: [
          { index: 0, id: "t", function: { name: "get_weather", arguments: '{"city":' } },
        ],
      }),
      chunk(1, { tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] }),
      chunk(1, { refusal: " no" }),
    ];
    for (const part of parts) expect(tally.addChunk(part)).toBe(part);
    // Choice 0: " think a bit" (3) + " hello there" (2); choice 1: " also" (1), the tool call's
    // name (1) and arguments ('{"city":' 1, ' "Paris"}' 1), " no" (1).
    expect(tally.count()).toEqual({
      outputTokens: 10n,
      reasoningTokens: 4n,
      choices: 2n,
      toolCalls: 1n,
    });
    expect(tally.anyCut).toBe(false);
  });

  it("does not tokenize while a choice's bytes cannot hold more tokens than its limit", () => {
    const tally = new OutputTally(words, 1_000n, 1n);
    counted = 0;
    for (let i = 0; i < 100; i += 1) tally.addChunk(chunk(0, { content: ` w${i}` }));
    expect(counted).toBe(0);
    expect(tally.count().outputTokens).toBe(100n);
    expect(counted).toBe(1);
  });

  it("cuts the choice at its limit: the rest of the chunk dropped, finish_reason length, later chunks gone", () => {
    const tally = new OutputTally(words, 10n, 1n);
    const relayed: unknown[] = [];
    for (let i = 0; i < 100; i += 3) {
      const out = tally.addChunk(chunk(0, { content: wordsFrom(i, i + 3) }));
      if (out !== undefined) relayed.push(out);
      if (tally.done) break;
    }
    expect(relayed).toHaveLength(4);
    expect(relayed.at(-1)).toEqual({
      id: "c",
      choices: [{ index: 0, delta: { content: " w9" }, finish_reason: "length" }],
    });
    expect(tally.count().outputTokens).toBe(10n);
    expect(tally.addChunk(chunk(0, { content: " more" }))).toBeUndefined();
  });

  it("cuts each choice of n on its own, and is done when all n are cut", () => {
    const tally = new OutputTally(words, 2n, 2n);
    expect(tally.addChunk(chunk(0, { content: " a b c" }))).toEqual({
      id: "c",
      choices: [{ index: 0, delta: { content: " a b" }, finish_reason: "length" }],
    });
    expect(tally.done).toBe(false);
    expect(tally.addChunk(chunk(0, { content: " d" }))).toBeUndefined();
    const both = {
      choices: [
        { index: 0, delta: { content: " e" } },
        { index: 1, delta: { content: " x y z" } },
      ],
    };
    expect(tally.addChunk(both)).toEqual({
      choices: [{ index: 1, delta: { content: " x y" }, finish_reason: "length" }],
    });
    expect(tally.done).toBe(true);
    expect(tally.count().outputTokens).toBe(4n);
  });

  it("cuts tool-call arguments too", () => {
    const tally = new OutputTally(words, 3n, 1n);
    const out = tally.addChunk(
      chunk(0, { tool_calls: [{ index: 0, function: { name: "f", arguments: " a b c d" } }] }),
    );
    expect(out).toEqual({
      id: "c",
      choices: [
        {
          index: 0,
          delta: { tool_calls: [{ index: 0, function: { name: "f", arguments: " a b" } }] },
          finish_reason: "length",
        },
      ],
    });
    expect(tally.count()).toEqual({
      outputTokens: 3n,
      reasoningTokens: 0n,
      choices: 1n,
      toolCalls: 1n,
    });
  });

  it("with the byte bound, cuts at the limit times 8 bytes, and counts bytes", () => {
    const tally = new OutputTally(boundCounter, 4n, 1n);
    expect(tally.addChunk(chunk(0, { content: "x".repeat(32) }))).toEqual(
      chunk(0, { content: "x".repeat(32) }),
    );
    const out = tally.addChunk(chunk(0, { content: "é".repeat(4) })) as {
      choices: { delta: { content: string }; finish_reason: string }[];
    };
    expect(out.choices[0]!.delta.content).toBe("");
    expect(out.choices[0]!.finish_reason).toBe("length");
    expect(tally.count().outputTokens).toBe(32n);
  });

  it("counts a long stream in segments of 64 KiB as it passes, each text once", () => {
    const tally = new OutputTally(words, 10_000_000n, 1n);
    counted = 0;
    const piece = " w".repeat(1024);
    for (let i = 0; i < 100; i += 1) tally.addChunk(chunk(0, { content: piece }));
    // 200 KiB of text: three segments counted on the way, the rest at the close.
    expect(counted).toBe(Math.floor((100 * piece.length) / streamSegmentBytes));
    expect(tally.count().outputTokens).toBe(100n * 1024n);
    expect(counted).toBe(Math.floor((100 * piece.length) / streamSegmentBytes) + 1);
  });

  it("counts a text longer than 1 MiB by its bytes, without the tokenizer, and cuts it by bytes", () => {
    const huge = " w".repeat(exactSegmentMaxBytes / 2 + 1);
    const counting = new OutputTally(words, 10_000_000n, 1n);
    counting.addChunk(chunk(0, { content: huge }));
    counted = 0;
    expect(counting.count().outputTokens).toBe(BigInt(huge.length));
    expect(counted).toBe(0);
    const cutting = new OutputTally(words, 1_000n, 1n);
    const out = cutting.addChunk(chunk(0, { content: huge })) as {
      choices: { delta: { content: string } }[];
    };
    expect(out.choices[0]!.delta.content).toBe(huge.slice(0, 1_000));
    expect(cutting.count().outputTokens).toBe(500n);
  });

  it("leaves chunks without choices alone", () => {
    const tally = new OutputTally(words, 1n, 1n);
    const usage = { choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } };
    expect(tally.addChunk(usage)).toBe(usage);
    expect(tally.addChunk(null)).toBe(null);
  });
});

describe("OutputTally on a JSON answer", () => {
  it("counts every choice's message and cuts the one past its limit in place", () => {
    const tally = new OutputTally(words, 3n, 2n);
    const body = {
      choices: [
        { index: 0, message: { role: "assistant", content: " a b" }, finish_reason: "stop" },
        {
          index: 1,
          message: { role: "assistant", reasoning_content: " r1 r2", content: " c d e f" },
          finish_reason: "stop",
        },
      ],
    };
    expect(tally.addAnswer(body)).toBe(true);
    expect(body.choices[0]).toEqual({
      index: 0,
      message: { role: "assistant", content: " a b" },
      finish_reason: "stop",
    });
    expect(body.choices[1]).toEqual({
      index: 1,
      message: { role: "assistant", reasoning_content: " r1 r2", content: " c" },
      finish_reason: "length",
    });
    expect(tally.count()).toEqual({
      outputTokens: 5n,
      reasoningTokens: 2n,
      choices: 2n,
      toolCalls: 0n,
    });
  });
});

describe("countText", () => {
  it("counts runs without a space of 256 characters or more by their bytes, the rest by the counter", () => {
    const run = "é".repeat(longRunChars);
    counted = 0;
    expect(countText(words, ` a b ${run} c`)).toBe(3n + BigInt(2 * longRunChars));
    expect(countText(words, " a b c")).toBe(3n);
    expect(countText(words, ` ${"x".repeat(longRunChars - 1)}`)).toBe(1n);
  });
});
