import { Piscina } from "piscina";
import type { ChatRequest } from "../../domain/chat/request/index.js";
import { GatewayError } from "../../domain/errors.js";
import { renderInputOf, type PromptPool } from "./counter.js";
import type { CountResult, CountTask } from "./count-worker.js";
import type { TokenizerEntry } from "./registry.js";

/**
 * Where long prompts are rendered and counted: a `piscina` pool of worker threads (one by
 * default: the gateway's own machine has few cores, and one thread already takes every long
 * prompt off the event loop), each holding the tokenizers it has been asked for. The worker is
 * count-worker.ts from the sources (run under tsx's loader) and count-worker.js from the build
 * (dist/, where the CLI's bundle keeps this module's own URL: scripts/bundle.mjs).
 */
export interface CountPool extends PromptPool {
  /** Loads a tokenizer in the pool's workers ahead of its first prompt. */
  preload(entry: TokenizerEntry): Promise<void>;
  /** Stops the workers (pending counts reject). */
  close(): Promise<void>;
}

export function createCountPool(options: { readonly threads?: number } = {}): CountPool {
  const threads = options.threads ?? 1;
  const fromSources = import.meta.url.endsWith(".ts");
  const filename = new URL(fromSources ? "./count-worker.ts" : "./count-worker.js", import.meta.url)
    .href;
  let pool: Piscina<CountTask, CountResult> | undefined;
  const run = (task: CountTask, transfer?: ArrayBuffer): Promise<CountResult> => {
    pool ??= new Piscina<CountTask, CountResult>({
      filename,
      minThreads: threads,
      maxThreads: threads,
      // Loaded tokenizers live as long as their thread: threads are never retired for idling.
      idleTimeout: Number.POSITIVE_INFINITY,
      execArgv: fromSources ? [...process.execArgv, "--import", "tsx"] : undefined,
    });
    return pool.run(task, transfer === undefined ? undefined : { transferList: [transfer] });
  };
  return {
    async count(entry: TokenizerEntry, req: ChatRequest): Promise<bigint> {
      let result: CountResult;
      if (
        (req.messages as unknown) === req.body.messages &&
        (req.tools as unknown) === (req.body.tools ?? undefined)
      ) {
        // The body's bytes, copied once and moved: cloning the parsed messages would take as
        // long on the event loop as counting them. A copy of its own (a Buffer's `slice` shares
        // memory: moving its buffer would empty the body the provider is sent).
        const raw = new Uint8Array(req.raw.byteLength);
        raw.set(req.raw);
        result = await run({ entry, raw }, raw.buffer);
      } else {
        result = await run({ entry, input: renderInputOf(req) });
      }
      if ("tokens" in result) return result.tokens;
      if ("output" in result) throw new Error("the count pool answered a prompt with output");
      throw new GatewayError(result.code, result.message);
    },
    async output(entry, task) {
      const result = await run({ entry, output: task });
      if ("output" in result) return result.output;
      throw new Error("the count pool did not answer an output task");
    },
    async preload(entry) {
      await run({ entry });
    },
    async close() {
      await pool?.destroy();
      pool = undefined;
    },
  };
}
