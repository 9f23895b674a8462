import { readFileSync } from "node:fs";
import { createTokenCounters } from "../src/adapters/tokenizers/token-counters.js";
import { parseChatRequest, type ChatRequest } from "../src/domain/chat-request.js";
import type { TokenCounter } from "../src/domain/tokens.js";

/**
 * `npm run bench:tokens`: what the gateway's own token counts cost (issue 27). One process, no
 * server: the embedded registry checked as at start-up, then for each embedded tokenizer its
 * load time, and the CPU time of counting a request's input (prompts of about 1,000 and 8,000
 * tokens through the chat template) and output (a 20-chunk stream's text, counted once at the
 * close and chunk by chunk; a JSON answer). Process RSS at rest (registry checked, nothing
 * loaded) and with every embedded tokenizer loaded, after a full GC. See bench/README.md
 * ("Token counting").
 *
 *   BENCH_TOKENS_ITERATIONS   timed repetitions of each count (default 50; 8k prompts: a fifth)
 */

const iterations = Number(process.env.BENCH_TOKENS_ITERATIONS ?? 50);
/** A model each embedded tokenizer counts. */
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
const material = corpus.texts.map((t) => t.text).join("\n\n");

function gc(): void {
  const collect = (globalThis as { gc?: () => void }).gc;
  if (collect === undefined) throw new Error("run with node --expose-gc (npm run bench:tokens)");
  collect();
  collect();
}

const mb = (bytes: number) => (bytes / 1024 / 1024).toFixed(0);

function chat(user: string): ChatRequest {
  const body = {
    model: "m",
    messages: [
      { role: "system", content: "You are a helpful assistant. Answer precisely." },
      { role: "user", content: user },
    ],
  };
  return parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), { maxBytes: 1 << 24 });
}

/** A request whose prompt counts about `target` tokens (the corpus repeated and cut). */
function promptOf(counter: TokenCounter, target: number): ChatRequest {
  let text = material;
  while (counter.countOutput(text) < target) text += `\n\n${material}`;
  return chat(counter.truncate(text, BigInt(target - 40)));
}

/** CPU milliseconds (user + system) per call of `fn`, over `n` calls after a warm-up. */
function cpuPerCall(n: number, fn: () => unknown): number {
  for (let i = 0; i < Math.min(5, n); i += 1) fn();
  const start = process.cpuUsage();
  for (let i = 0; i < n; i += 1) fn();
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1000 / n;
}

const streamChunks = Array.from({ length: 20 }, (_, i) => (i === 0 ? "tok0" : ` tok${i}`));
const proseChunks = corpus.texts[0]!.text.match(/.{1,20}/gs)!.slice(0, 20);
const jsonAnswer = JSON.stringify({
  answer: corpus.texts[0]!.text,
  code: corpus.texts.find((t) => t.text.includes("export async"))!.text,
  items: [1, 2, 3].map((i) => ({ id: i, label: `item ${i}`, ok: i % 2 === 0 })),
});

async function main(): Promise<void> {
  const checkStart = performance.now();
  const loads = new Map<string, number>();
  const counters = await createTokenCounters({ onLoad: (name, ms) => loads.set(name, ms) });
  const checkMs = performance.now() - checkStart;
  gc();
  const atRest = process.memoryUsage();

  const rows: string[] = [];
  for (const [name, repository] of Object.entries(models)) {
    const counter = await counters.forModel({ repository, revision: "main" });
    const k1 = promptOf(counter, 1000);
    const k8 = promptOf(counter, 8000);
    const streamText = streamChunks.join("");
    const proseText = proseChunks.join("");
    const figures = {
      input1k: cpuPerCall(iterations, () => counter.countInput(k1)),
      input8k: cpuPerCall(Math.max(1, Math.round(iterations / 5)), () => counter.countInput(k8)),
      streamAtClose: cpuPerCall(iterations * 10, () => counter.countOutput(streamText)),
      streamPerChunk: cpuPerCall(iterations * 10, () => {
        for (const chunk of streamChunks) counter.countOutput(chunk);
      }),
      proseAtClose: cpuPerCall(iterations * 10, () => counter.countOutput(proseText)),
      json: cpuPerCall(iterations * 10, () => counter.countOutput(jsonAnswer)),
    };
    rows.push(
      `| ${name} | ${(loads.get(name) ?? 0).toFixed(0)} | ${counter.countInput(k1)}: ${figures.input1k.toFixed(2)} | ${counter.countInput(k8)}: ${figures.input8k.toFixed(2)} | ${figures.streamAtClose.toFixed(3)} / ${figures.streamPerChunk.toFixed(3)} | ${figures.proseAtClose.toFixed(3)} | ${counter.countOutput(jsonAnswer)}: ${figures.json.toFixed(3)} |`,
    );
  }
  gc();
  const loaded = process.memoryUsage();

  process.stdout.write(
    [
      `registry check (every file hashed): ${checkMs.toFixed(0)} ms`,
      `at rest (registry checked, nothing loaded): RSS ${mb(atRest.rss)} MB, JS heap ${mb(atRest.heapUsed)} MB`,
      `every embedded tokenizer loaded: RSS ${mb(loaded.rss)} MB, JS heap ${mb(loaded.heapUsed)} MB`,
      "",
      "CPU ms per count (tokens: ms)",
      "",
      "| tokenizer | load ms | input ~1k | input ~8k | 20-chunk stream, at close / per chunk | 20 prose chunks, at close | JSON answer |",
      "| --- | --- | --- | --- | --- | --- | --- |",
      ...rows,
      "",
    ].join("\n"),
  );
}

await main();
