import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import type { JsonValue } from "../../domain/catalog.js";
import type { ChatRequest } from "../../domain/chat-request.js";
import { GatewayError } from "../../domain/errors.js";
import type { TokenCounter } from "../../domain/tokens.js";
import { TokenizerRegistryError, type TokenizerEntry } from "./registry.js";

/**
 * A model's own counter: its `tokenizer.json` (Hugging Face's tokenizers.js, the pure
 * JavaScript port of the `tokenizers` library; docs/decisions/metering-and-tokens.md says why this one) and its chat
 * template (rendered with `@huggingface/jinja`, the engine transformers.js uses for the same
 * templates).
 */

/** A loaded tokenizer and template: what {@link createTokenizerCounter} counts with. */
export interface LoadedTokenizer {
  readonly entry: TokenizerEntry;
  readonly tokenizer: Tokenizer;
  readonly template: Template;
  /** The template's variables besides the request's (`bos_token`, `eos_token`...). */
  readonly variables: Readonly<Record<string, string>>;
}

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

/**
 * Reads and parses an entry's files (checking their SHA-256 again). Slow (a tokenizer.json is
 * 8 to 33 MB: 0.4 to 1.5 s, bench/figures/tokenizers.md), hence done once per tokenizer, when
 * its first model is served.
 */
export async function loadTokenizer(
  entry: TokenizerEntry,
  /**
   * Parsed tokenizer files by path and SHA-256, shared by the entries that name the same file
   * (Llama 3 and 3.1): each is parsed once and held once.
   */
  shared: Map<string, Promise<Tokenizer>> = new Map(),
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
  const template = new Template(source);
  const key = `${entry.sha256}:${entry.tokenizer}`;
  let tokenizer = shared.get(key);
  if (tokenizer === undefined) {
    tokenizer = readPinned(entry, entry.tokenizer, entry.sha256).then(
      (bytes) => new Tokenizer(JSON.parse(bytes.toString("utf8")) as object, config),
    );
    shared.set(key, tokenizer);
    tokenizer.catch(() => shared.delete(key));
  }
  return { entry, tokenizer: await tokenizer, template, variables };
}

type Message = Record<string, JsonValue>;

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
  req: ChatRequest,
): { prompt: string; images: bigint } {
  const images = { count: 0n };
  const messages: Message[] = req.messages.map((message) => ({
    ...(message as Message),
    content: flattenContent(message.content ?? null, loaded.entry, images),
  }));
  const kwargs = req.body.chat_template_kwargs;
  const context = {
    ...(isObject(kwargs) ? kwargs : {}),
    ...(typeof req.body.reasoning_effort === "string"
      ? { reasoning_effort: req.body.reasoning_effort }
      : {}),
    ...loaded.variables,
    messages,
    tools: req.tools,
    add_generation_prompt: true,
  };
  let prompt: string;
  try {
    prompt = loaded.template.render(context);
  } catch (first) {
    if (!messages.some((m) => m.content === null)) throw refused(loaded, first);
    try {
      prompt = loaded.template.render({
        ...context,
        messages: messages.map((m) => (m.content === null ? { ...m, content: "" } : m)),
      });
    } catch (err) {
      throw refused(loaded, err);
    }
  }
  return { prompt, images: images.count };
}

function refused(loaded: LoadedTokenizer, err: unknown): GatewayError {
  const detail = err instanceof Error ? err.message.slice(0, 300) : String(err);
  return new GatewayError(
    "invalid_request",
    `the model's chat template (tokenizer "${loaded.entry.name}") refuses these messages: ${detail}`,
    { cause: err },
  );
}

const replacement = "\uFFFD";

/** A counter over a loaded tokenizer (exact: it is the model's own tokenizer and template). */
export function createTokenizerCounter(loaded: LoadedTokenizer): TokenCounter {
  const { tokenizer } = loaded;
  const encode = (text: string): number[] =>
    tokenizer.encode(text, { add_special_tokens: false }).ids;
  const count = (text: string): bigint => BigInt(encode(text).length);
  return {
    exact: true,
    name: loaded.entry.name,
    countInput(req) {
      const { prompt, images } = renderPrompt(loaded, req);
      // The template writes the special tokens (BOS included): none are added again.
      return count(prompt) + images * (loaded.entry.imageTokens ?? 0n);
    },
    countOutput: count,
    truncate(text, limit) {
      const ids = encode(text);
      if (BigInt(ids.length) <= limit) return text;
      if (limit <= 0n) return "";
      let prefix = tokenizer.decode(ids.slice(0, Number(limit)), {
        skip_special_tokens: false,
        clean_up_tokenization_spaces: false,
      });
      // A character cut between two byte-level tokens decodes as U+FFFD: it is left out.
      while (prefix.endsWith(replacement) && !text.startsWith(prefix)) prefix = prefix.slice(0, -1);
      if (!text.startsWith(prefix)) prefix = longestPrefix(text, limit, count);
      // Tokens of a prefix are not always those of the whole text's start: held to the limit,
      // then grown while the next character still fits.
      const chars: string[] = [...prefix];
      let length = prefix.length;
      while (length > 0 && count(text.slice(0, length)) > limit) {
        length -= (chars.pop() ?? "").length;
      }
      for (const next of text.slice(length)) {
        if (count(text.slice(0, length + next.length)) > limit) break;
        length += next.length;
      }
      return text.slice(0, length);
    },
  };
}

/** The longest prefix (whole characters) counted at most `limit`, by bisection. */
function longestPrefix(text: string, limit: bigint, count: (text: string) => bigint): string {
  const ends = [0];
  for (const char of text) ends.push(ends[ends.length - 1]! + char.length);
  let low = 0;
  let high = ends.length - 1;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (count(text.slice(0, ends[middle])) <= limit) low = middle;
    else high = middle - 1;
  }
  return text.slice(0, ends[low]);
}
