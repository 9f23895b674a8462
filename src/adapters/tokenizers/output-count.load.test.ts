import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OutputTally } from "../../domain/chat/output-tally.js";
import type { OutputCount, TokenCounter } from "../../domain/tokens.js";
import { createTokenCounters, type TokenizerCounters } from "./token-counters.js";

/**
 * Output counted at line rate (issue 35, item 3): with the demo market's real counter (Qwen 3's
 * tokenizer) and its worker pool, a provider's long pre-token piece sent a little at a time is
 * cut exactly, and no synchronous step of the tally (its own calls, and every call it makes of
 * the count, timed one by one) holds the event loop over 5 ms. Before the worker took the long
 * pieces, 50 KiB of spaces in 16-byte chunks against a limit of 100 took 2.9 s of the event
 * loop's time, in steps up to 74 ms.
 */

let counters: TokenizerCounters;
let counter: TokenCounter;

beforeAll(async () => {
  counters = await createTokenCounters({ threads: 1 });
  const model = { repository: "demo/chat-small", revision: "v1" };
  await counters.preload([model]);
  counter = counters.forModel(model)!;
});

afterAll(async () => {
  await counters.close();
});

/** The counter with every synchronous call of its counts timed (into `steps`). */
function timedCounter(steps: number[]): TokenCounter {
  const timed = <T>(call: () => T): T => {
    const start = performance.now();
    try {
      return call();
    } finally {
      steps.push(performance.now() - start);
    }
  };
  return {
    ...counter,
    output(): OutputCount {
      const inner = counter.output();
      return {
        append: (text) => timed(() => inner.append(text)),
        count: () => timed(() => inner.count()),
        fit: (text, limit) => timed(() => inner.fit(text, limit)),
        heavy: (text) => timed(() => inner.heavy(text)),
        settle: (text, limit) => timed(() => inner.settle(text, limit)),
      };
    },
  };
}

/**
 * The cut of a stream by its definition, counted on the event loop: whole chunks while the text
 * so far counts at most `limit`, then the longest prefix of the first chunk that does not. (Counts of one long piece
 * are not monotone: 12,767 spaces count 100 with Qwen 3, 12,768 count 101, 12,800 count 100
 * again; a stream is cut at the first chunk that passes, as the relay cannot take back.)
 */
function streamCut(text: string, size: number, limit: bigint): string {
  let kept = "";
  for (let at = 0; at < text.length; at += size) {
    const piece = text.slice(at, at + size);
    if (counter.countOutput(kept + piece) <= limit) {
      kept += piece;
      continue;
    }
    // The longest prefix of the chunk that fits, as the count's own synchronous fit finds it.
    const count = counter.output();
    count.append(kept);
    return kept + piece.slice(0, count.fit(piece, limit));
  }
  return kept;
}

/** Streams `text` through a tally in chunks of `size`: the text relayed and the longest step. */
async function stream(text: string, size: number, limit: bigint) {
  const steps: number[] = [];
  const tally = new OutputTally(timedCounter(steps), limit, 1n);
  let relayed = "";
  let later = 0;
  for (let at = 0; at < text.length && !tally.done; at += size) {
    const chunk = { choices: [{ index: 0, delta: { content: text.slice(at, at + size) } }] };
    const start = performance.now();
    let out = tally.addChunk(chunk);
    steps.push(performance.now() - start);
    if (out instanceof Promise) {
      later += 1;
      out = await out;
    }
    relayed += (out as { choices: { delta: { content: string } }[] }).choices[0]!.delta.content;
  }
  const settling = tally.settle();
  if (settling !== undefined) await settling;
  const start = performance.now();
  const { outputTokens } = tally.count();
  steps.push(performance.now() - start);
  return { relayed, outputTokens, later, steps };
}

/**
 * The longest step of runs of one stream: each step (the runs make the same calls in the same
 * order) as long as its shortest run. A step is the tally's own work, but the machine is shared:
 * a step preempted, or paused by a collection, in one run is not the tally's; a long step is
 * long in every run. (The first run also pays for compiling.)
 */
function longestStep(runs: readonly { readonly steps: readonly number[] }[]): number {
  const [first, ...rest] = runs;
  for (const run of rest) expect(run.steps).toHaveLength(first!.steps.length);
  return Math.max(...first!.steps.map((_, i) => Math.min(...runs.map((run) => run.steps[i]!))));
}

describe("an output's long pieces are counted off the event loop, exactly", () => {
  it("50 KiB of spaces in 16-byte chunks against a limit of 100: the exact cut, no step over 5 ms", async () => {
    const text = " ".repeat(50 * 1024);
    const expected = streamCut(text, 16, 100n);
    const runs = [];
    for (let i = 0; i < 3; i += 1) runs.push(await stream(text, 16, 100n));
    for (const run of runs) {
      expect(run.relayed).toBe(expected);
      expect(run.outputTokens).toBe(counter.countOutput(expected));
      expect(run.outputTokens).toBeLessThanOrEqual(100n);
      expect(run.later).toBeGreaterThan(0);
    }
    expect(longestStep(runs)).toBeLessThanOrEqual(5);
  });

  it("256 KiB of one letter in one chunk, and a long Chinese run in 1 KiB chunks: exact, no step over 5 ms", async () => {
    const letter = "a".repeat(256 * 1024);
    const chinese = "我们今天讨论一下这个问题的解决方案".repeat(4_000);
    const cases = [
      { text: letter, size: letter.length, limit: 100n },
      { text: chinese, size: 1024, limit: 1_000n },
    ];
    for (const { text, size, limit } of cases) {
      const expected = streamCut(text, size, limit);
      const runs = [];
      for (let i = 0; i < 3; i += 1) runs.push(await stream(text, size, limit));
      for (const run of runs) {
        expect(run.relayed).toBe(expected);
        expect(run.outputTokens).toBe(counter.countOutput(expected));
      }
      expect(longestStep(runs)).toBeLessThanOrEqual(5);
    }
  });
});
