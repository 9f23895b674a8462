import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { loadTokenizer } from "../src/adapters/tokenizers/counter.js";
import { HfEngine } from "../src/adapters/tokenizers/hf-engine.js";
import { createTokenCounters } from "../src/adapters/tokenizers/token-counters.js";
import { parseChatRequest, type ChatRequest } from "../src/domain/chat/request/index.js";
import type { TokenizerEngine } from "../src/adapters/tokenizers/engine.js";

/**
 * `npm run bench:tokens`: what the gateway's own token counts cost (issues 27 and 35). One
 * process, no server. For each embedded tokenizer: its load (the engine the gateway uses, from
 * its derived rank table where there is one, and tokenizers.js from the tokenizer.json, the
 * engine before issue 35) and the heap it holds; CPU µs per 1,000 tokens of the corpus, new
 * engine (caches cold, then warm) against the old; an agent's conversation of about 8,000
 * tokens counted through the chat template, first and repeated (its history cached); a stream
 * counted incrementally (20 chunks); adversarial single pieces (1 MiB of one CJK run, of one
 * letter, of spaces, random bytes; 50 KiB of spaces). See bench/figures/tokenizers.md.
 *
 *   BENCH_TOKENS_ITERATIONS   timed repetitions of each count (default 50)
 *   BENCH_TOKENS_OLD=0        skip the old engine (tokenizers.js loads take seconds)
 */

const iterations = Number(process.env.BENCH_TOKENS_ITERATIONS ?? 50);
const withOld = process.env.BENCH_TOKENS_OLD !== "0";
const models: Record<string, string> = {
  llama3: "meta-llama/Meta-Llama-3-8B-Instruct",
  "llama3.1": "meta-llama/Llama-3.1-8B-Instruct",
  qwen3: "Qwen/Qwen3-8B",
  gemma3: "google/gemma-3-27b-it",
  "deepseek-v3": "deepseek-ai/DeepSeek-V3",
  "gpt-oss": "openai/gpt-oss-20b",
};

const corpus = JSON.parse(
  readFileSync(new URL("../test/fixtures/tokenizer-corpus.json", import.meta.url), "utf8"),
) as { texts: { text: string }[] };
const texts = corpus.texts.map((t) => t.text);
const material = texts.join("\n\n");

function gc(): void {
  const collect = (globalThis as { gc?: () => void }).gc;
  if (collect === undefined) throw new Error("run with node --expose-gc (npm run bench:tokens)");
  collect();
  collect();
}

const mb = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);

/** CPU milliseconds (user + system) per call of `fn`, over `n` calls after a warm-up. */
function cpuPerCall(n: number, fn: (i: number) => unknown, warm = true): number {
  if (warm) for (let i = 0; i < Math.min(3, n); i += 1) fn(-1 - i);
  const start = process.cpuUsage();
  for (let i = 0; i < n; i += 1) fn(i);
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1000 / n;
}

/** An agent's conversation: a long system prompt, six turns of history, a new last turn. */
function agentRequest(turn: number): ChatRequest {
  const system = `You are a coding agent. Follow the repository's conventions.\n\n${material}`;
  const messages = [{ role: "system", content: system }];
  for (let i = 0; i < 6; i += 1) {
    messages.push({
      role: i % 2 === 0 ? "user" : "assistant",
      content: `${i}. ${texts.join("\n")}`,
    });
  }
  messages.push({ role: "user", content: `Turn ${turn}: and now run the tests again.` });
  return parseChatRequest(new TextEncoder().encode(JSON.stringify({ model: "m", messages })), {
    maxBytes: 1 << 24,
  });
}

function randomText(bytes: number): string {
  let seed = 12345;
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i += 1) {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    out[i] = seed >>> 24;
  }
  return new TextDecoder().decode(out);
}

const adversarial: Record<string, string> = {
  "1 MiB one CJK run": "中".repeat(349_525),
  "1 MiB one letter": "a".repeat(1 << 20),
  "1 MiB spaces": " ".repeat(1 << 20),
  "50 KiB spaces": " ".repeat(50 * 1024),
  "1 MiB random bytes": randomText(1 << 20),
};

function timeOnce(fn: () => unknown): number {
  const start = process.cpuUsage();
  fn();
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1000;
}

async function main(): Promise<void> {
  const counters = await createTokenCounters({ threads: 0 });
  const lines: string[] = [];
  const perTokenizer: string[] = [];
  const adversarialRows: string[] = [];
  gc();
  const atRest = process.memoryUsage();
  for (const [name, repository] of Object.entries(models)) {
    const entry = counters.registry.tokenizers.get(name)!;
    gc();
    const before = process.memoryUsage();
    const started = performance.now();
    const loaded = await loadTokenizer(entry);
    const loadMs = performance.now() - started;
    gc();
    const after = process.memoryUsage();
    const heap = after.heapUsed - before.heapUsed;
    const buffers = after.arrayBuffers - before.arrayBuffers + (after.external - before.external);
    const engine = loaded.engine;
    await counters.preload([{ repository, revision: "main" }]);
    const counter = counters.forModel({ repository, revision: "main" })!;

    let old: TokenizerEngine | undefined;
    let oldLoadMs = NaN;
    if (withOld) {
      const oldStarted = performance.now();
      const json: unknown = JSON.parse(readFileSync(entry.tokenizer, "utf8"));
      const config: unknown = entry.chatTemplate.endsWith(".json")
        ? JSON.parse(readFileSync(entry.chatTemplate, "utf8"))
        : {};
      old = new HfEngine(json as object, config as Record<string, unknown>);
      oldLoadMs = performance.now() - oldStarted;
    }

    const tokens = engine.count(material);
    const per1k = (ms: number) => ((ms * 1000 * 1000) / tokens).toFixed(0);
    // Cold: a fresh text every call (a number prepended), so no whole-text cache helps; pieces
    // repeat across calls as they do across requests.
    const newWarm = cpuPerCall(iterations, (i) => engine.count(`${i} ${material}`));
    const oldCold =
      old === undefined ? NaN : cpuPerCall(iterations, (i) => old.count(`${i} ${material}`));
    const agentFirst = timeOnce(() => void counter.countInput(agentRequest(0)));
    const agentTokens = await counter.countInput(agentRequest(1));
    const agentRepeated = cpuPerCall(
      iterations,
      (i) => void counter.countInput(agentRequest(i + 2)),
      false,
    );
    const chunks = (texts[0]!.match(/[\s\S]{1,20}/g) ?? []).slice(0, 20);
    const stream = cpuPerCall(iterations * 10, () => {
      const output = counter.output();
      for (const chunk of chunks) output.append(chunk);
      return output.count();
    });
    perTokenizer.push(
      `| ${name} | ${loadMs.toFixed(0)} | ${withOld ? oldLoadMs.toFixed(0) : "-"} | ${mb(heap)} + ${mb(buffers)} | ${per1k(newWarm)} | ${withOld ? per1k(oldCold) : "-"} | ${agentTokens}: ${agentFirst.toFixed(2)} / ${agentRepeated.toFixed(2)} | ${(stream * 1000).toFixed(0)} |`,
    );
    if (name === "llama3.1" || name === "gemma3") continue;
    for (const [what, text] of Object.entries(adversarial)) {
      if (name === "gemma3") continue;
      let count = 0;
      const ms = timeOnce(() => (count = engine.count(text)));
      adversarialRows.push(`| ${name} | ${what} | ${count} | ${ms.toFixed(0)} |`);
    }
  }
  gc();
  const loaded = process.memoryUsage();
  lines.push(
    `load average at the start (2 cores): ${loadavg()
      .map((l) => l.toFixed(1))
      .join(", ")}`,
    `process at rest (registry checked): RSS ${mb(atRest.rss)} MB, JS heap ${mb(atRest.heapUsed)} MB; every tokenizer loaded (new engines; old ones too: ${withOld}): RSS ${mb(loaded.rss)} MB, JS heap ${mb(loaded.heapUsed)} MB`,
    "",
    "| tokenizer | load ms (new) | load ms (old) | held: JS heap + buffers MB (new) | µs per 1k tokens, corpus (new, pieces cached) | µs per 1k tokens (old) | agent prompt (~8k): tokens: first ms / repeated ms | 20-chunk stream µs |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ...perTokenizer,
    "",
    "Adversarial single pieces (new engine, CPU ms, one count, no cache):",
    "",
    "| tokenizer | text | tokens | ms |",
    "| --- | --- | --- | --- |",
    ...adversarialRows,
    "",
  );
  process.stdout.write(lines.join("\n"));
  await counters.close();
}

await main();
