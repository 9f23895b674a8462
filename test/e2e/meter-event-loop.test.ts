import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTokenCounters,
  type TokenizerCounters,
} from "../../src/adapters/tokenizers/token-counters.js";
import type { OutputCount, TokenCounter } from "../../src/domain/tokens.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit } from "../helpers/market.js";
import { authed, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 35, item 3: the meter never holds the event loop. Hostile request bodies of 1 MiB
 * (whitespace, one CJK run, random code points) and an agent's 32k-token prompt go through
 * chat while another client's small requests are timed: every synchronous step of the meter is
 * short (before issue 35, each of these prompts held the loop for seconds), and the event
 * loop's longest step and the other client's p99 are reported.
 *
 * The gateway runs in this process (its thread is the one measured): the hostile bodies are
 * built before the measurement, so the test's own work while measuring is sending bytes.
 * A step is the gap between two turns of a probe that asks for a new turn every millisecond
 * (a gap is the longest task that ran in between, plus the timer's slack); the steps of the
 * gateway's start and of the bodies' construction are outside the window.
 */

const mib = 1024 * 1024;

/**
 * The gateway's counters with every synchronous step of the meter timed: `countInput` up to the
 * promise it returns (what it does on the event loop: inline counting, or handing the prompt to
 * the worker), `countOutput`, and each output count's `append`, `count`, `fit`, `heavy` and
 * `settle` (up to its promise).
 */
function timedCounters(counters: TokenizerCounters, steps: number[]): TokenizerCounters {
  const timed =
    <A extends unknown[], R>(f: (...args: A) => R) =>
    (...args: A): R => {
      const started = performance.now();
      try {
        return f(...args);
      } finally {
        steps.push(performance.now() - started);
      }
    };
  const wrap = (counter: TokenCounter): TokenCounter => ({
    ...counter,
    countInput: timed((req) => counter.countInput(req)),
    countOutput: timed((text) => counter.countOutput(text)),
    output(): OutputCount {
      const output = counter.output();
      return {
        append: timed((text) => output.append(text)),
        count: timed(() => output.count()),
        fit: timed((text, limit) => output.fit(text, limit)),
        heavy: timed((text) => output.heavy(text)),
        settle: timed((text, limit) => output.settle(text, limit)),
      };
    },
  });
  const wrapped = new Map<TokenCounter, TokenCounter>();
  return Object.assign(Object.create(counters) as TokenizerCounters, {
    forModel(model: { repository: string; revision: string }) {
      const counter = counters.forModel(model);
      if (counter === undefined) return undefined;
      if (!wrapped.has(counter)) wrapped.set(counter, wrap(counter));
      return wrapped.get(counter);
    },
  });
}

/** The longest gap between turns of the event loop while `work` runs, in ms. */
async function longestStep<T>(work: () => Promise<T>): Promise<{ result: T; longest: number }> {
  let longest = 0;
  let last = performance.now();
  let running = true;
  const tick = () => {
    const now = performance.now();
    longest = Math.max(longest, now - last);
    last = now;
    if (running) setTimeout(tick, 1);
  };
  setTimeout(tick, 1);
  try {
    const result = await work();
    return { result, longest };
  } finally {
    running = false;
  }
}

function percentile(values: readonly number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

/** Random code points of the Basic Multilingual Plane and beyond (no surrogates), ~`bytes`. */
function randomText(bytes: number): string {
  const raw = randomBytes(bytes);
  let out = "";
  let size = 0;
  for (let i = 0; size < bytes; i += 3) {
    const cp = ((raw[i % raw.length]! << 12) | (raw[(i + 1) % raw.length]! << 4)) % 0x2ffff;
    const code = cp >= 0xd800 && cp <= 0xdfff ? 0x4e00 + (cp & 0xfff) : cp;
    const char = String.fromCodePoint(code < 0x20 ? 0x20 + code : code);
    out += char;
    size += Buffer.byteLength(char, "utf8");
  }
  return out;
}

/** An agent's prompt of about 32,000 tokens: prose and code over many turns. */
function agentPrompt(): { role: string; content: string }[] {
  const prose =
    "The gateway meters every response with the model's own tokenizer, and a provider's usage report is only a claim. ";
  const code = "function add(a, b) {\n  return a + b; // sums two numbers\n}\n";
  const messages: { role: string; content: string }[] = [
    { role: "system", content: prose.repeat(200) },
  ];
  for (let turn = 0; turn < 40; turn += 1) {
    messages.push({ role: "user", content: `${prose.repeat(12)}\n${code.repeat(6)}` });
    messages.push({ role: "assistant", content: prose.repeat(10) });
  }
  messages.push({ role: "user", content: "What did we decide?" });
  return messages;
}

describe("the meter keeps its steps on the event loop short (issue 35)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let counters: TokenizerCounters;
  /** Every synchronous step of the meter, in ms. */
  const steps: number[] = [];

  beforeAll(async () => {
    counters = await createTokenCounters();
    ({ stack, fake } = await startChatStack(
      {},
      { chunks: 5, tokens: timedCounters(counters, steps) },
    ));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
    await counters?.close();
  });

  const post = (body: Uint8Array) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body,
    });
  const encode = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));

  it("hostile 1 MiB bodies and a 32k-token prompt: served, the meter's steps short", async () => {
    const small = encode({
      model: "demo-chat",
      messages: [{ role: "user", content: "hello" }],
      max_tokens: 16,
    });
    const hostile = [
      " ".repeat(mib - 200),
      "中".repeat(Math.floor((mib - 200) / 3)),
      randomText(mib - 400),
    ].map((content) =>
      encode({ model: "demo-chat", messages: [{ role: "user", content }], max_tokens: 16 }),
    );
    const agent = encode({ model: "demo-chat", messages: agentPrompt(), max_tokens: 16 });
    for (const body of [...hostile, agent]) expect(body.length).toBeLessThanOrEqual(4 * mib);

    const timeSmall = async (count: number): Promise<number[]> => {
      const times: number[] = [];
      for (let i = 0; i < count; i += 1) {
        const started = performance.now();
        const res = await post(small);
        await res.arrayBuffer();
        expect(res.status).toBe(200);
        times.push(performance.now() - started);
      }
      return times;
    };

    // Warm: the first requests compile the paths.
    await timeSmall(10);
    const unloaded = await timeSmall(60);

    steps.length = 0;
    const { result, longest } = await longestStep(async () => {
      const others = timeSmall(60);
      const statuses: number[] = [];
      for (let round = 0; round < 2; round += 1) {
        for (const body of [...hostile, agent]) {
          const res = await post(body);
          await res.arrayBuffer();
          statuses.push(res.status);
        }
      }
      return { loaded: await others, statuses };
    });
    // Every hostile body is served (it is text the model takes) and charged.
    expect(result.statuses).toEqual(Array(8).fill(200));
    // The meter's own steps (the inputs over 16 KiB were counted in the worker; before issue 35
    // each took seconds on the event loop). Measured on this two-core machine under load: at
    // most 1 ms for output and inline inputs, 1 to 5.5 ms for handing a 1 MiB prompt to the
    // worker (piscina's post), up to 15 ms when a GC or the other core's load falls in one; the
    // bound is wall time on a shared machine, hence its margin. The
    // event loop's longest step is reported: parsing a 1 MiB body (JSON.parse and its checks,
    // before the meter) takes 2 to 7 ms by itself (bench/figures/issue-35-meter.md).
    expect(steps.length).toBeGreaterThanOrEqual(8);
    expect(Math.max(...steps)).toBeLessThanOrEqual(25);
    console.log(
      `meter steps: ${steps.length}, longest ${Math.max(...steps).toFixed(2)} ms; event loop's longest step ${longest.toFixed(2)} ms`,
    );
    // The other client's p99, loaded and unloaded, is reported, not asserted: in this process
    // the in-process fixtures (the fake provider parsing each 1 MiB body, PGlite's queries) and
    // the gateway's own body parse share the thread being measured (issue 35's note: 42 ms
    // loaded against 21 ms unloaded with the real PostgreSQL, 116 against 33 on PGlite).
    console.log(
      `other client p99: unloaded ${percentile(unloaded, 99).toFixed(1)} ms, loaded ${percentile(result.loaded, 99).toFixed(1)} ms`,
    );
  }, 180_000);
});
