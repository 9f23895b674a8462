import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import type { JsonValue } from "../../domain/catalog.js";
import type { ChatRequest } from "../../domain/chat/request/index.js";
import { GatewayError } from "../../domain/errors.js";
import type { TokenCounter } from "../../domain/tokens.js";
import { ByteLevelBpe, byteLevelBpeUnsupported, type TokenizerJson } from "./byte-level-bpe.js";
import { loadDerived } from "./derived.js";
import type { TokenizerEngine } from "./engine.js";
import { gemmaTableSourceSha256, loadGemmaEngine } from "./gemma/load.js";
import { HfEngine } from "./hf-engine.js";
import { createOutputCount, type OutputAnswer, type OutputTask } from "./output-count.js";
import { TokenizerRegistryError, type TokenizerEntry } from "./registry.js";

/**
 * A model's own counter (issue 35): its `tokenizer.json` counted by an exact engine (the
 * byte-level BPE engine for the four byte-level families, byte-level-bpe.ts; Gemma 3's own
 * engine, gemma/; tokenizers.js for an operator's tokenizer of another kind, hf-engine.ts) and
 * its chat template rendered with `@huggingface/jinja`, the engine transformers.js uses for the
 * same templates, from an environment built once per template.
 * Prompts longer than {@link LoadedTokenizer.inlineInputBytes} are rendered and counted in the
 * worker pool (count-pool.ts), so no prompt holds the event loop.
 */

/** A loaded tokenizer and template: what {@link createTokenizerCounter} counts with. */
export interface LoadedTokenizer {
  readonly entry: TokenizerEntry;
  readonly engine: TokenizerEngine;
  /** The chat template over the request's variables (its environment built once). */
  readonly render: (variables: Record<string, unknown>) => string;
  /**
   * Request bodies up to this many bytes are counted inline; longer ones in the worker pool.
   * Measured (bench/figures/tokenizers.md, "Issue 35 engine"): 16 KiB of prompt renders and
   * counts in about 1 ms with the byte-level and Gemma engines; tokenizers.js takes
   * milliseconds per thousand tokens, so every prompt it counts goes to the worker.
   */
  readonly inlineInputBytes: number;
}

/** Request bytes counted on the event loop by a fast engine (see inlineInputBytes). */
export const defaultInlineInputBytes = 16 * 1024;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

async function readPinned(entry: TokenizerEntry, path: string, pinned: string): Promise<Buffer> {
  const bytes = await readFile(path);
  const actual = createHash("sha256").update(bytes).digest("hex");
  // The files were checked at start-up; the bytes parsed are checked again, so a file replaced
  // since then cannot change what is counted.
  if (actual !== pinned) {
    throw new TokenizerRegistryError(
      `tokenizer file ${path} for "${entry.name}" has sha256 ${actual}, the registry ${entry.registry} pins ${pinned}`,
    );
  }
  return bytes;
}

/** A special token of a tokenizer_config.json: a string, or an AddedToken object. */
function tokenText(value: unknown): string | undefined {
  if (typeof value === "string") return value;
  if (isObject(value) && typeof value.content === "string") return value.content;
  return undefined;
}

/** An engine and whether it is fast enough to count prompts inline. */
export interface EngineChoice {
  readonly engine: TokenizerEngine;
  readonly fast: boolean;
}

/**
 * The exact engine of a tokenizer.json: the byte-level BPE engine where the file is one it
 * counts exactly (byteLevelBpeUnsupported), else tokenizers.js. (Gemma 3's is chosen before its
 * file is read, by the file's SHA-256: loadEngine.)
 */
export function createEngine(json: unknown, config: Record<string, unknown>): EngineChoice {
  if (byteLevelBpeUnsupported(json as TokenizerJson) === undefined) {
    return { engine: new ByteLevelBpe(json as TokenizerJson), fast: true };
  }
  return { engine: new HfEngine(json as object, config), fast: false };
}

/** A template's render function: globals set once, the request's variables in a child scope. */
function compileTemplate(source: string, variables: Record<string, string>) {
  const template = new Template(source);
  const base = new Environment();
  for (const [key, value] of templateGlobals()) base.set(key, value);
  for (const [key, value] of Object.entries(variables)) base.set(key, value);
  return (context: Record<string, unknown>): string => {
    const scope = new Environment(base);
    for (const [key, value] of Object.entries(context)) scope.set(key, value);
    return new Interpreter(scope).run(template.parsed).value as string;
  };
}

let globals: [string, unknown][] | undefined;

/**
 * The globals `Template.render` sets in every render's environment (`true`, `none`, `range`,
 * `raise_exception`, `strftime_now`...; @huggingface/jinja does not export them), read once by
 * watching an empty template's render.
 */
function templateGlobals(): [string, unknown][] {
  if (globals !== undefined) return globals;
  const captured: [string, unknown][] = [];
  const original = Environment.prototype.set;
  Environment.prototype.set = function (this: Environment, name: string, value: unknown) {
    captured.push([name, value]);
    return original.call(this, name, value);
  } as typeof original;
  try {
    new Template("").render({});
  } finally {
    Environment.prototype.set = original;
  }
  globals = captured;
  return captured;
}

/**
 * Reads and parses an entry's files (checking their SHA-256 again) and builds its engine.
 * Done once per tokenizer, before its models are routable (token-counters.ts, preload).
 */
export async function loadTokenizer(
  entry: TokenizerEntry,
  /**
   * Engines by tokenizer file and SHA-256, shared by the entries that name the same file
   * (Llama 3 and 3.1): each is built once and held once.
   */
  shared: Map<string, Promise<EngineChoice>> = new Map(),
): Promise<LoadedTokenizer> {
  const templateBytes = await readPinned(entry, entry.chatTemplate, entry.templateSha256);
  let config: Record<string, unknown> = {};
  let source = templateBytes.toString("utf8");
  if (entry.chatTemplate.endsWith(".json")) {
    const parsed: unknown = JSON.parse(source);
    if (!isObject(parsed))
      throw new TokenizerRegistryError(`${entry.chatTemplate} is not a JSON object`);
    config = parsed;
    // A list of named templates (transformers' format) uses the one named "default".
    const template = Array.isArray(parsed.chat_template)
      ? (parsed.chat_template as unknown[]).find((t) => isObject(t) && t.name === "default")
      : parsed.chat_template;
    source =
      typeof template === "string" ? template : isObject(template) ? String(template.template) : "";
    if (source === "" || source === "undefined") {
      throw new TokenizerRegistryError(
        `${entry.chatTemplate} (tokenizer "${entry.name}", registry ${entry.registry}) has no chat_template`,
      );
    }
  }
  const variables: Record<string, string> = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
    const text = tokenText(config[key]);
    if (text !== undefined) variables[key] = text;
  }
  const render = compileTemplate(source, variables);
  const key = `${entry.sha256}:${entry.tokenizer}`;
  let choice = shared.get(key);
  if (choice === undefined) {
    choice = loadEngine(entry, config);
    shared.set(key, choice);
    choice.catch(() => shared.delete(key));
  }
  const { engine, fast } = await choice;
  return { entry, engine, render, inlineInputBytes: fast ? defaultInlineInputBytes : 0 };
}

/**
 * The entry's engine: from a table derived ahead of time when one is embedded for its
 * tokenizer.json (none of the JSON read or parsed: Gemma 3's table, gemma/load.ts; a byte-level
 * rank table, derived.ts), else from the tokenizer.json. The tokenizer.json's SHA-256, which
 * keys the table, was checked at start-up (checkTokenizerRegistry); each table is pinned by its
 * own.
 */
async function loadEngine(
  entry: TokenizerEntry,
  config: Record<string, unknown>,
): Promise<EngineChoice> {
  if (entry.sha256 === gemmaTableSourceSha256) return { engine: loadGemmaEngine(), fast: true };
  const derived = await loadDerived(entry.sha256);
  if (derived !== undefined) {
    return { engine: new ByteLevelBpe(derived.json, {}, derived.vocab), fast: true };
  }
  const bytes = await readPinned(entry, entry.tokenizer, entry.sha256);
  return createEngine(JSON.parse(bytes.toString("utf8")), config);
}

type Message = Record<string, JsonValue>;

/** What a prompt is rendered from: the request's members the template reads. */
export interface RenderInput {
  readonly messages: readonly JsonValue[];
  readonly tools?: readonly JsonValue[] | undefined;
  readonly chat_template_kwargs?: JsonValue | undefined;
  readonly reasoning_effort?: JsonValue | undefined;
}

/** The members of a request its prompt is rendered from. */
export function renderInputOf(req: ChatRequest): RenderInput {
  return {
    messages: req.messages,
    tools: req.tools,
    chat_template_kwargs: req.body.chat_template_kwargs,
    reasoning_effort: req.body.reasoning_effort,
  };
}

/** A content part the template does not see and the count adds: images at the entry's cost. */
function flattenContent(
  content: JsonValue,
  model: TokenizerEntry,
  images: { count: bigint },
): JsonValue {
  if (!Array.isArray(content)) return content;
  const texts: string[] = [];
  for (const part of content) {
    const type = isObject(part) ? part.type : undefined;
    if ((type === "text" || type === "input_text") && typeof (part as Message).text === "string") {
      texts.push((part as Message).text as string);
    } else if (
      (type === "image_url" || type === "image" || type === "input_image") &&
      model.imageTokens !== undefined
    ) {
      images.count += 1n;
    } else {
      const what =
        typeof type === "string" ? `'${type.slice(0, 40)}' content` : "this content part";
      throw new GatewayError(
        "invalid_request",
        type === "image_url" || type === "image" || type === "input_image"
          ? `the model (tokenizer "${model.name}") does not take images`
          : `the model (tokenizer "${model.name}") does not take ${what}; send text parts`,
      );
    }
  }
  // As vLLM gives text parts to a template that takes string content: joined by newlines.
  return texts.join("\n");
}

/**
 * The prompt the model's chat template makes of a request (messages, tools, the generation
 * prompt), and the images it holds. Text content parts are joined by newlines; a message
 * without content is given to the template as null, and again as "" when the template cannot
 * take null (templates differ: DeepSeek V3's tests `content is none` for tool calls, Qwen 3's
 * uses it as a string). `chat_template_kwargs` (vLLM's) and `reasoning_effort` reach the
 * template as the provider's would. Throws `GatewayError` (`invalid_request`) for content the
 * model cannot take, and when the template itself refuses the conversation (as the provider's
 * would: Gemma 3's requires alternating user and assistant turns).
 */
export function renderPrompt(
  loaded: LoadedTokenizer,
  req: ChatRequest | RenderInput,
): { prompt: string; images: bigint } {
  const input = "raw" in req ? renderInputOf(req) : req;
  const images = { count: 0n };
  const messages: Message[] = input.messages.map((message) => ({
    ...(message as Message),
    content: flattenContent((message as Message).content ?? null, loaded.entry, images),
  }));
  const kwargs = input.chat_template_kwargs;
  const context = {
    ...(isObject(kwargs) ? kwargs : {}),
    ...(typeof input.reasoning_effort === "string"
      ? { reasoning_effort: input.reasoning_effort }
      : {}),
    messages,
    tools: input.tools,
    add_generation_prompt: true,
  };
  // What the template is given again when it refuses the messages as they came: null content
  // as "" (templates differ: DeepSeek V3's tests `content is none`, Qwen 3's uses a string), and
  // tool calls' JSON `arguments` as objects (Qwen3-Coder's iterates them with `items`, as
  // vLLM hands them to it); the first rendering the template accepts is counted, else the last
  // refusal is reported.
  const attempts = [messages];
  const blanked = messages.some((m) => m.content === null)
    ? messages.map((m) => (m.content === null ? { ...m, content: "" } : m))
    : undefined;
  if (blanked !== undefined) attempts.push(blanked);
  const parsed = withParsedArguments(blanked ?? messages);
  if (parsed !== undefined) attempts.push(parsed);
  let prompt: string | undefined;
  let failure: unknown;
  for (const attempt of attempts) {
    try {
      prompt = loaded.render(attempt === messages ? context : { ...context, messages: attempt });
      break;
    } catch (err) {
      failure = err;
    }
  }
  if (prompt === undefined) throw refused(loaded, failure);
  return { prompt, images: images.count };
}

/**
 * The messages with every tool call's `arguments` that is a JSON object string parsed into the
 * object; undefined when no call has one.
 */
function withParsedArguments(messages: Message[]): Message[] | undefined {
  let changed = false;
  const out = messages.map((message) => {
    const calls = message.tool_calls;
    if (!Array.isArray(calls)) return message;
    const parsedCalls = calls.map((call) => {
      const fn = isObject(call) ? call.function : undefined;
      if (!isObject(fn) || typeof fn.arguments !== "string") return call;
      let args: unknown;
      try {
        args = JSON.parse(fn.arguments);
      } catch {
        return call;
      }
      if (!isObject(args)) return call;
      changed = true;
      return { ...(call as Message), function: { ...fn, arguments: args } } as JsonValue;
    });
    return { ...message, tool_calls: parsedCalls };
  });
  return changed ? out : undefined;
}

function refused(loaded: LoadedTokenizer, err: unknown): GatewayError {
  const detail = err instanceof Error ? err.message.slice(0, 300) : String(err);
  return new GatewayError(
    "invalid_request",
    `the model's chat template (tokenizer "${loaded.entry.name}") refuses these messages: ${detail}`,
    { cause: err },
  );
}

/** Tokens of a request's prompt: rendered, counted, images at the entry's cost. */
export function countPrompt(loaded: LoadedTokenizer, input: ChatRequest | RenderInput): bigint {
  const { prompt, images } = renderPrompt(loaded, input);
  // The template writes the special tokens (BOS included): none are added again.
  return BigInt(loaded.engine.count(prompt)) + images * (loaded.entry.imageTokens ?? 0n);
}

/** Where long prompts, and output's long pieces, are counted (count-pool.ts). */
export interface PromptPool {
  count(entry: TokenizerEntry, req: ChatRequest): Promise<bigint>;
  /** A step of an output's count (output-count.ts, OutputCount.settle). */
  output(entry: TokenizerEntry, task: OutputTask): Promise<OutputAnswer>;
}

/**
 * A counter over a loaded tokenizer (exact: it is the model's own tokenizer and template).
 * Prompts longer than the tokenizer's inline size go to `pool` when there is one.
 */
export function createTokenizerCounter(loaded: LoadedTokenizer, pool?: PromptPool): TokenCounter {
  const { engine } = loaded;
  const outputPool =
    pool === undefined ? undefined : (task: OutputTask) => pool.output(loaded.entry, task);
  return {
    exact: true,
    name: loaded.entry.name,
    hidesReasoning: loaded.entry.hidesReasoning === true,
    countInput(req) {
      if (pool !== undefined && req.raw.byteLength > loaded.inlineInputBytes) {
        return pool.count(loaded.entry, req);
      }
      try {
        return Promise.resolve(countPrompt(loaded, req));
      } catch (err) {
        return Promise.reject(err as Error);
      }
    },
    countOutput: (text) => BigInt(engine.count(text)),
    output: () => createOutputCount(engine, outputPool),
  };
}
