import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { boundCounter, type OutputCount, type TokenCounter } from "../tokens.js";
import {
  perCharacter,
  runsCounter as runCounter,
  words as wordCounter,
} from "../../../test/helpers/exact-counter.js";
import { OutputTally, strayChunkLimit, type OutputReader } from "./output-tally.js";

/**
 * A counter whose tokens are the text's non-space runs and each space before them (" w1" is
 * one token, like a BPE word piece): exact, and easy to work out by hand. `checks` counts the
 * calls of `count` and `fit`, the work the tally does beyond appending.
 */
let checks = 0;
const base = wordCounter();
const words: TokenCounter = {
  ...base,
  output(): OutputCount {
    const inner = base.output();
    return {
      append: (text) => inner.append(text),
      count() {
        checks += 1;
        return inner.count();
      },
      fit(text, limit) {
        checks += 1;
        return inner.fit(text, limit);
      },
      heavy: () => false,
      settle: () => Promise.resolve(),
    };
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
    // Choice 0: " think a bit" (3) + "\n hello there" (2); choice 1: " also" (1), the tool
    // call's name (1) and arguments ('{"city":' 1, ' "Paris"}' 1), " no" (1).
    expect(tally.count()).toEqual({
      outputTokens: 10n,
      reasoningTokens: 4n,
      choices: 2n,
      toolCalls: 1n,
      stopped: 0n,
    });
    expect(tally.anyCut).toBe(false);
  });

  it("does not check while a choice's bytes cannot hold more tokens than its limit", () => {
    const tally = new OutputTally(words, 1_000n, 1n);
    checks = 0;
    for (let i = 0; i < 100; i += 1) tally.addChunk(chunk(0, { content: ` w${i}` }));
    expect(checks).toBe(0);
    expect(tally.count().outputTokens).toBe(100n);
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

  it("an honest Chinese stream is cut at exactly its limit, counted exactly, however long its runs", () => {
    const counter = perCharacter();
    const tally = new OutputTally(counter, 1_000n, 1n);
    // 3,000 characters without a space, 7 a chunk: no byte shortcut, no long-run rule.
    const text = "我们今天讨论一下这个问题的解决方案".repeat(200).slice(0, 3_000);
    let relayed = "";
    for (let at = 0; at < text.length && !tally.done; at += 7) {
      const out = tally.addChunk(chunk(0, { content: text.slice(at, at + 7) })) as {
        choices: { delta: { content: string }; finish_reason: string | null }[];
      };
      relayed += out.choices[0]!.delta.content;
    }
    expect(tally.done).toBe(true);
    expect(relayed).toBe(text.slice(0, 1_000));
    expect(counter.countOutput(relayed)).toBe(1_000n);
    expect(tally.count().outputTokens).toBe(1_000n);
  });

  it("is exact for a single long piece past the limit (no byte bound)", () => {
    const tally = new OutputTally(words, 1_000n, 1n);
    const huge = " w".repeat(600_000);
    const out = tally.addChunk(chunk(0, { content: huge })) as {
      choices: { delta: { content: string } }[];
    };
    expect(out.choices[0]!.delta.content).toBe(huge.slice(0, 2_000));
    expect(tally.count().outputTokens).toBe(1_000n);
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
      stopped: 0n,
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

  it("leaves chunks without choices alone", () => {
    const tally = new OutputTally(words, 1n, 1n);
    const usage = { choices: [], usage: { prompt_tokens: 1, completion_tokens: 1 } };
    expect(tally.addChunk(usage)).toBe(usage);
    expect(tally.addChunk(null)).toBe(null);
  });
});

describe("tolerance only for what the client received", () => {
  it("empty tool-call entries earn nothing: a call counts once its name and arguments came", () => {
    const tally = new OutputTally(words, 4_096n, 1n);
    tally.addChunk(chunk(0, { content: "Hi" }));
    for (let i = 0; i < 300; i += 1)
      tally.addChunk(chunk(0, { tool_calls: [{ index: i, id: `c${i}`, function: {} }] }));
    tally.addChunk(chunk(0, { tool_calls: [{ index: 300, function: { name: "f" } }] }));
    tally.addChunk(chunk(0, { tool_calls: [{ index: 301, function: { arguments: "{}" } }] }));
    expect(tally.count()).toEqual({
      outputTokens: 3n,
      reasoningTokens: 0n,
      choices: 1n,
      toolCalls: 0n,
      stopped: 0n,
    });
    tally.addChunk(chunk(0, { tool_calls: [{ index: 300, function: { arguments: "{}" } }] }));
    expect(tally.count().toolCalls).toBe(1n);
  });

  it("choices the request did not ask for are dropped from the relay, never counted", () => {
    const tally = new OutputTally(words, 4_096n, 1n);
    const padded = {
      id: "c",
      choices: [
        { index: 0, delta: { content: "Hi" } },
        ...Array.from({ length: 600 }, (_, i) => ({ index: i + 1, delta: { content: "x" } })),
      ],
    };
    expect(tally.addChunk(padded)).toEqual({
      id: "c",
      choices: [{ index: 0, delta: { content: "Hi" } }],
    });
    expect(tally.count()).toEqual({
      outputTokens: 1n,
      reasoningTokens: 0n,
      choices: 1n,
      toolCalls: 0n,
      stopped: 0n,
    });
  });

  it("invented indexes (negative, fractional, huge, strings, duplicates past n) are dropped", () => {
    const tally = new OutputTally(words, 100n, 2n);
    for (const index of [-1, 0.5, 2, 2 ** 53, "0", null, Number.NaN]) {
      expect(tally.addChunk(chunk(index as number, { content: " bogus" }))).toBeUndefined();
      if (index === 2) break;
    }
    expect(tally.count().choices).toBe(0n);
  });

  it(`a stream that keeps sending choices nobody asked for fails after ${strayChunkLimit} such chunks`, () => {
    const tally = new OutputTally(words, 100n, 1n);
    for (let i = 0; i < strayChunkLimit; i += 1)
      expect(tally.addChunk(chunk(1, { content: "x" }))).toBeUndefined();
    expect(() => tally.addChunk(chunk(1, { content: "x" }))).toThrow(
      expect.objectContaining({ code: "upstream_error" }),
    );
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
      stopped: 2n,
    });
  });

  it("drops choices nobody asked for (and a second choice of one index), and empty tool calls earn nothing", () => {
    const tally = new OutputTally(words, 4_096n, 1n);
    const body = {
      choices: [
        {
          index: 0,
          message: {
            content: "Hi",
            tool_calls: Array.from({ length: 300 }, (_, i) => ({
              id: `c${i}`,
              type: "function",
              function: { name: "", arguments: "" },
            })),
          },
        },
        { index: 0, message: { content: " again" } },
        ...Array.from({ length: 600 }, (_, i) => ({ index: i + 1, message: { content: "x" } })),
      ],
    };
    expect(tally.addAnswer(body)).toBe(true);
    expect(body.choices).toHaveLength(1);
    expect(tally.count()).toEqual({
      outputTokens: 1n,
      reasoningTokens: 0n,
      choices: 1n,
      toolCalls: 0n,
      stopped: 0n,
    });
  });
});

describe("a dialect's reader: its cut is the billing point", () => {
  /** Reads content only, and at most `chars` code units of it. */
  function reader(chars: number): OutputReader {
    let taken = 0;
    return {
      reads: (field) => field === "content",
      entry: () => true,
      take(_field, text, room) {
        const n = Math.min(text.length, room, chars - taken);
        taken += n;
        return n;
      },
    };
  }

  it("what the translator never reads is not counted; what it drops after its cut neither", () => {
    const tally = new OutputTally(words, 4_096n, 1n, reader(6));
    tally.addChunk(chunk(0, { reasoning_content: " hidden padding", content: " a" }));
    tally.addChunk(chunk(0, { refusal: " unread" }));
    const out = tally.addChunk(chunk(0, { content: " b c d" })) as {
      choices: { delta: { content: string }; finish_reason: string }[];
    };
    expect(out.choices[0]).toMatchObject({ delta: { content: " b c" }, finish_reason: "length" });
    expect(tally.done).toBe(true);
    expect(tally.addChunk(chunk(0, { content: " e" }))).toBeUndefined();
    expect(tally.count().outputTokens).toBe(3n);
  });

  it("a tool-call entry the translator refuses is its cut: that entry and what follows are left out", () => {
    let entries = 0;
    const tally = new OutputTally(words, 4_096n, 1n, {
      reads: () => true,
      entry: () => ++entries <= 2,
      take: (_field, _text, room) => room,
    });
    const calls = Array.from({ length: 4 }, (_, i) => ({
      index: i,
      id: `c${i}`,
      function: { name: "f", arguments: "{}" },
    }));
    const out = tally.addChunk(chunk(0, { content: "Hi", tool_calls: calls })) as {
      choices: { delta: { tool_calls: unknown[] }; finish_reason: string }[];
    };
    expect(out.choices[0]!.delta.tool_calls).toEqual(calls.slice(0, 2));
    expect(out.choices[0]!.finish_reason).toBe("length");
    expect(tally.done).toBe(true);
    expect(tally.count()).toMatchObject({ outputTokens: 5n, toolCalls: 2n });
  });

  it("a second choice of one index in a chunk is dropped, not counted", () => {
    const tally = new OutputTally(words, 100n, 1n);
    const twice = {
      choices: [
        { index: 0, delta: { content: "Hi" } },
        { index: 0, delta: { content: " padding padding" } },
      ],
    };
    expect(tally.addChunk(twice)).toEqual({ choices: [{ index: 0, delta: { content: "Hi" } }] });
    expect(tally.count().outputTokens).toBe(1n);
  });
});

/** Streams `text` in chunks of the given sizes (cycled) through a tally; what it relayed. */
async function streamed(tally: OutputTally, text: string, sizes: readonly number[]) {
  let relayed = "";
  let later = 0;
  for (let at = 0, i = 0; at < text.length && !tally.done; i += 1) {
    const size = sizes[i % sizes.length]!;
    let out = tally.addChunk(chunk(0, { content: text.slice(at, at + size) }));
    at += size;
    if (out instanceof Promise) {
      later += 1;
      out = await out;
    }
    const content = (out as { choices?: { delta: { content?: string } }[] } | undefined)
      ?.choices?.[0]?.delta.content;
    if (content !== undefined) relayed += content;
  }
  await tally.settle();
  return { relayed, later };
}

describe("OutputTally off the event loop (a long piece)", () => {
  it("a long run streamed in small chunks is cut where the one-shot count cuts it, its checks counted asynchronously", async () => {
    const { counter, seen, tokens, fitOf } = runCounter(64);
    const tally = new OutputTally(counter, 100n, 1n);
    const text = "a".repeat(2_000);
    const { relayed, later } = await streamed(tally, text, [7]);
    expect(relayed).toBe(text.slice(0, fitOf("", text, 100n)));
    expect(relayed).toHaveLength(400);
    expect(tally.count().outputTokens).toBe(tokens(relayed));
    expect(later).toBeGreaterThan(0);
    expect(seen.settles).toBe(later);
    // No synchronous fit or count of a text longer than the counter's threshold.
    expect(seen.longestSync).toBeLessThanOrEqual(64);
  });

  it("a chunk's later pieces and choices are taken after its long piece, in order", async () => {
    const { counter, seen, tokens } = runCounter(16);
    const tally = new OutputTally(counter, 10n, 2n);
    const first = {
      choices: [
        { index: 0, delta: { reasoning_content: "b".repeat(30), content: "c".repeat(30) } },
        { index: 1, delta: { content: "x".repeat(12) } },
      ],
    };
    const out = tally.addChunk(first);
    expect(out).toBeInstanceOf(Promise);
    // 30 b's are 8 tokens; "\n" and 4 c's the 2 left: choice 0 cut; choice 1 kept whole.
    expect(await out).toEqual({
      choices: [
        {
          index: 0,
          delta: { reasoning_content: "b".repeat(30), content: "cccc" },
          finish_reason: "length",
        },
        { index: 1, delta: { content: "x".repeat(12) } },
      ],
    });
    await tally.settle();
    expect(tally.count().outputTokens).toBe(tokens(`${"b".repeat(30)}\ncccc`) + 3n);
    expect(seen.longestSync).toBeLessThanOrEqual(16);
  });

  it("a JSON answer's long message is cut through the asynchronous count", async () => {
    const { counter, seen, fitOf } = runCounter(64);
    const tally = new OutputTally(counter, 50n, 1n);
    const text = " ".repeat(5_000);
    const body = { choices: [{ index: 0, message: { content: text }, finish_reason: "stop" }] };
    const changed = tally.addAnswer(body);
    expect(changed).toBeInstanceOf(Promise);
    expect(await changed).toBe(true);
    expect(body.choices[0]!.message.content).toBe(text.slice(0, fitOf("", text, 50n)));
    expect(body.choices[0]!.finish_reason).toBe("length");
    expect(seen.longestSync).toBeLessThanOrEqual(64);
  });

  it("the close's count of a long unchecked text is settled first", async () => {
    const { counter, seen, tokens } = runCounter(64);
    const tally = new OutputTally(counter, 10_000n, 1n);
    const text = "z".repeat(3_000);
    expect(tally.addChunk(chunk(0, { reasoning_content: text }))).toBeDefined();
    const settling = tally.settle();
    expect(settling).toBeInstanceOf(Promise);
    await settling;
    expect(tally.count()).toMatchObject({
      outputTokens: tokens(text),
      reasoningTokens: tokens(text),
    });
    expect(seen.longestSync).toBeLessThanOrEqual(64);
  });

  it("property: over random chunkings of texts with long runs, the cut and count are the one-shot ones", async () => {
    const run = fc.record({
      char: fc.constantFrom("a", " ", "我", "\n", "b"),
      length: fc.integer({ min: 1, max: 300 }),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.array(run, { minLength: 1, maxLength: 12 }),
        fc.array(fc.integer({ min: 1, max: 97 }), { minLength: 1, maxLength: 8 }),
        fc.integer({ min: 1, max: 400 }),
        async (runs, sizes, limit) => {
          const text = runs.map((r) => r.char.repeat(r.length)).join("");
          const { counter, seen, tokens, fitOf } = runCounter(48);
          const tally = new OutputTally(counter, BigInt(limit), 1n);
          const { relayed } = await streamed(tally, text, sizes);
          expect(relayed).toBe(text.slice(0, fitOf("", text, BigInt(limit))));
          expect(tally.count().outputTokens).toBe(tokens(relayed));
          expect(seen.longestSync).toBeLessThanOrEqual(48);
        },
      ),
      { numRuns: 150 },
    );
  });
});

describe("choices the provider stopped (their stop string's tolerance, usage.ts)", () => {
  it("counts the choices that carried output and ended with finish_reason stop", () => {
    const tally = new OutputTally(words, 100n, 3n);
    tally.addChunk(chunk(0, { content: " a b" }));
    tally.addChunk(chunk(1, { content: " c" }));
    tally.addChunk({ id: "c", choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
    tally.addChunk({ id: "c", choices: [{ index: 1, delta: {}, finish_reason: "length" }] });
    // Choice 2 stopped without output: nothing of it was counted, nor its stop string.
    tally.addChunk({ id: "c", choices: [{ index: 2, delta: {}, finish_reason: "stop" }] });
    expect(tally.count()).toEqual({
      outputTokens: 3n,
      reasoningTokens: 0n,
      choices: 2n,
      toolCalls: 0n,
      stopped: 1n,
    });
  });
});
