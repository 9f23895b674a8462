import type { JsonValue } from "../../domain/catalog.js";
import { GatewayError, type ErrorCode } from "../../domain/errors.js";
import { countPrompt, loadTokenizer, type LoadedTokenizer, type RenderInput } from "./counter.js";
import { answerOutput, type OutputAnswer, type OutputTask } from "./output-count.js";
import type { TokenizerEntry } from "./registry.js";

/**
 * The worker of the count pool (count-pool.ts): renders and counts long prompts off the event
 * loop, and the steps of an output's count that hold a long piece (output-count.ts). Each tokenizer is loaded once per worker, the first time a task names it (the pool's
 * preload sends a task without a prompt for that).
 */

/** A task: a prompt to count (a request's body, or the members it renders from), or none. */
export interface CountTask {
  readonly entry: TokenizerEntry;
  /** The request body as received (its members are what renderInputOf reads). */
  readonly raw?: Uint8Array | undefined;
  readonly input?: RenderInput | undefined;
  /** A step of an output's count (OutputCount.settle). */
  readonly output?: OutputTask | undefined;
}

/** The count, or the refusal the counter rejects with (a GatewayError crosses as its parts). */
export type CountResult =
  | { readonly tokens: bigint }
  | { readonly output: OutputAnswer }
  | { readonly code: ErrorCode; readonly message: string };

const loaded = new Map<string, Promise<LoadedTokenizer>>();
const engines: Parameters<typeof loadTokenizer>[1] = new Map();

function load(entry: TokenizerEntry): Promise<LoadedTokenizer> {
  const key = `${entry.name}\0${entry.sha256}\0${entry.templateSha256}\0${entry.registry}`;
  let tokenizer = loaded.get(key);
  if (tokenizer === undefined) {
    tokenizer = loadTokenizer(entry, engines);
    loaded.set(key, tokenizer);
    tokenizer.catch(() => loaded.delete(key));
  }
  return tokenizer;
}

function inputOf(raw: Uint8Array): RenderInput {
  const body = JSON.parse(new TextDecoder().decode(raw)) as Record<string, JsonValue>;
  return {
    messages: body.messages as JsonValue[],
    tools: (body.tools ?? undefined) as JsonValue[] | undefined,
    chat_template_kwargs: body.chat_template_kwargs,
    reasoning_effort: body.reasoning_effort,
  };
}

export default async function count(task: CountTask): Promise<CountResult> {
  const tokenizer = await load(task.entry);
  if (task.output !== undefined) return { output: answerOutput(tokenizer.engine, task.output) };
  const input = task.input ?? (task.raw === undefined ? undefined : inputOf(task.raw));
  if (input === undefined) return { tokens: 0n };
  try {
    return { tokens: countPrompt(tokenizer, input) };
  } catch (err) {
    if (err instanceof GatewayError) return { code: err.code, message: err.message };
    throw err;
  }
}
