import { hash } from "node:crypto";
import type { Hex } from "viem";
import {
  ChatRequest as ChatRequestSchema,
  lengthControls,
  maxChoiceCount,
  type ChatRequestBody,
  type chatRoles,
} from "../schema/chat.js";
import { compileBody } from "./body-check.js";
import type { JsonValue } from "./catalog.js";
import { GatewayError } from "./errors.js";
import { normalizeHex } from "./hex.js";
import { parseProviderPreferences, type ProviderPreferences } from "./provider-preferences.js";

/**
 * The spec's Chat request (body of `POST /v1/chat/completions` and `POST /v1/quotes`): its
 * validation, the numbers a quote is made of (output limit, input-token bound, fingerprint),
 * and the exact bytes that go upstream.
 *
 * Its structure and bounds are declared once, by the `ChatRequest` schema (src/schema/chat.ts),
 * which also gives the OpenAPI document. What a schema cannot say is checked here, beside it: the
 * byte-level bounds (size, nesting, array items, BOM, UTF-8), a top-level member given twice,
 * integers read exactly from the literal the client wrote, and `best_of` against `n`.
 *
 * The raw bytes are kept: unknown properties (and numbers JavaScript cannot represent, such as
 * a 64-bit `seed`) reach the provider as the client wrote them, less the gateway's own members
 * (`offer`, `provider`) and with the priced output limit (see {@link upstreamBody}). The parsed
 * value is used only to validate and to compute what the gateway itself needs. A server's own
 * output length control (`n_predict`, `min_tokens`, `ignore_eos`...: `lengthControls` in
 * src/schema/chat.ts) is refused, so nothing but the priced limit bounds what a provider makes.
 *
 * Decisions beyond the spec, OpenAI-compatible where the spec is silent:
 * - an optional field set to `null` is treated as absent (OpenAI's API marks them nullable);
 * - a property that occurs twice at the top level is rejected, so the gateway and the provider
 *   cannot read different values for `stream`, `max_tokens` or any other field;
 * - JSON nested more than {@link maxJsonDepth} levels deep is rejected;
 * - a body starting with a UTF-8 byte order mark is rejected (RFC 8259 section 8.1: senders
 *   must not add one).
 */

export { chatRoles } from "../schema/chat.js";
export type ChatRole = (typeof chatRoles)[number];

export type JsonObject = { readonly [key: string]: JsonValue };

/** One message; extra properties (name, tool_calls, tool_call_id...) are kept as sent. */
export interface ChatMessage {
  readonly role: ChatRole;
  readonly content: JsonValue;
  readonly [key: string]: JsonValue;
}

export interface ChatRequest {
  /** The body exactly as received. */
  readonly raw: Uint8Array;
  /** The parsed body, unknown properties included. */
  readonly body: JsonObject;
  readonly model: string;
  readonly messages: readonly ChatMessage[];
  /** The offer the request pins (`offer`), in lower case. */
  readonly offer?: Hex | undefined;
  /** Provider preferences (`provider`, OpenRouter's object; provider-preferences.ts). */
  readonly provider?: ProviderPreferences | undefined;
  readonly stream: boolean;
  /** The client asked for usage on its stream (`stream_options.include_usage === true`). */
  readonly includeUsage: boolean;
  readonly maxTokens?: bigint | undefined;
  readonly maxCompletionTokens?: bigint | undefined;
  /**
   * How many answers (`n`, OpenAI's "how many chat completion choices to generate") the
   * provider is asked for: 1 to {@link maxChoices}, 1 when absent or null. Each choice may use
   * the whole output limit, so it multiplies the output bound a quote prices.
   */
  readonly choices: bigint;
  readonly tools?: readonly JsonValue[] | undefined;
  readonly toolChoice?: JsonValue | undefined;
  readonly responseFormat?: JsonValue | undefined;
}

/**
 * Deepest nesting of arrays and objects accepted by default (MAX_JSON_DEPTH; the top-level
 * object is depth 1).
 */
export const maxJsonDepth = 64;

/** Most items one array of a request body may have by default (MAX_JSON_ARRAY_ITEMS). */
export const maxJsonArrayItems = 10_000;

/** Bounds on the shape of a JSON body, checked on its bytes before it is parsed. */
export interface JsonBounds {
  /** Deepest nesting of arrays and objects (the top-level value is depth 1). */
  readonly maxDepth?: number | undefined;
  /** Most items in any one array. */
  readonly maxArrayItems?: number | undefined;
}

/** The largest `n` accepted (the schema's bound, src/schema/chat.ts), as a bigint. */
export const maxChoices = BigInt(maxChoiceCount);

/** The output limit when neither the request nor the offer's capabilities give one. */
export const defaultOutputLimit = 4096n;

// ---------------------------------------------------------------- parsing

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

/** The body's structure and bounds, compiled once (src/schema/chat.ts). */
const checkBody: (value: unknown) => ChatRequestBody = compileBody(ChatRequestSchema);

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const utf8Encoder = new TextEncoder();

/**
 * Validates a Chat request body. Throws {@link GatewayError}: `request_too_large` over
 * `opts.maxBytes`; `invalid_request` when it nests deeper than `opts.maxDepth` or an array has
 * more than `opts.maxArrayItems` items (checked on the bytes, before parsing); `invalid_json`
 * when the body is not UTF-8 JSON; `invalid_hex` for an `offer` that is not Hex32;
 * `invalid_request` for anything else, with a message naming the field.
 */
export function parseChatRequest(
  raw: Uint8Array,
  opts: { maxBytes: number } & JsonBounds,
): ChatRequest {
  if (raw.byteLength > opts.maxBytes) {
    throw new GatewayError(
      "request_too_large",
      `the request body is larger than ${opts.maxBytes} bytes`,
    );
  }
  checkJsonBounds(raw, opts);
  if (raw[0] === 0xef && raw[1] === 0xbb && raw[2] === 0xbf) {
    throw new GatewayError(
      "invalid_json",
      "the request body must not start with a byte order mark",
    );
  }
  let text: string;
  try {
    text = utf8.decode(raw);
  } catch {
    throw new GatewayError("invalid_json", "the request body is not valid UTF-8");
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    const detail = err instanceof Error ? `: ${err.message.slice(0, 200)}` : "";
    throw new GatewayError("invalid_json", `the request body is not valid JSON${detail}`);
  }
  // A member given twice is refused first: the schema would only see the value JSON.parse kept.
  const top = isObject(parsed) ? topLevelMembers(raw) : [];
  const body = checkBody(parsed);

  // The schema has checked every member's type and bounds on the parsed value; integers are
  // read again from the literals the client wrote, which keep the digits a double loses.
  const maxTokens = integerLiteral(raw, top, "max_tokens", body.max_tokens);
  const maxCompletionTokens = integerLiteral(
    raw,
    top,
    "max_completion_tokens",
    body.max_completion_tokens,
  );
  const choices = integerLiteral(raw, top, "n", body.n) ?? 1n;
  // The seed goes upstream as written (a 64-bit seed keeps its digits): only checked.
  integerLiteral(raw, top, "seed", body.seed);
  // `best_of` is not a chat completions parameter (it was the legacy completions API's, and
  // vLLM accepts it on chat): the provider generates `best_of` sequences and returns and
  // reports `n` of them, so work no tariff prices would be done. It is refused rather than
  // forwarded, unless it asks for exactly the choices that are returned and paid for.
  if (
    body.best_of !== undefined &&
    body.best_of !== null &&
    exactInteger(literal(raw, top, "best_of")) !== choices
  ) {
    invalid("'best_of' is not a chat completions parameter; leave it out (or equal to 'n')");
  }

  const request: ChatRequest = {
    raw,
    body: parsed as JsonObject,
    model: body.model,
    messages: body.messages as unknown as ChatMessage[],
    offer: body.offer == null ? undefined : normalizeHex(body.offer),
    provider: parseProviderPreferences(body.provider),
    stream: body.stream === true,
    includeUsage: body.stream_options?.include_usage === true,
    maxTokens,
    maxCompletionTokens,
    choices,
    tools: (body.tools ?? undefined) as JsonValue[] | undefined,
    toolChoice: (body.tool_choice ?? undefined) as JsonValue | undefined,
    responseFormat: (body.response_format ?? undefined) as JsonValue | undefined,
  };
  spans.set(request, top);
  return request;
}

/** The text of a top-level member's value as the client wrote it. */
function literal(raw: Uint8Array, top: readonly Member[], key: string): string {
  const member = top.find((m) => m.key === key);
  if (member === undefined) throw new Error(`no span for '${key}'`);
  return textOf(raw, member.valueStart, member.valueEnd);
}

/**
 * The exact value of an integer member the schema has accepted as a parsed number, read from its
 * literal (also beyond 2^53). A literal with a fractional part that the parse rounded to an
 * integer (`1.0000000000000001`) is refused: it is not the integer the schema saw.
 */
function integerLiteral(
  raw: Uint8Array,
  top: readonly Member[],
  key: string,
  value: number | null | undefined,
): bigint | undefined {
  if (value === undefined || value === null) return undefined;
  const exact = exactInteger(literal(raw, top, key));
  if (exact === undefined) invalid(`'${key}' must be an integer, without a fractional part`);
  return exact;
}

function isObject(value: unknown): value is { [key: string]: unknown } {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * The exact integer a JSON number literal denotes (`12`, `1.0`, `1e3`, `-4`), or undefined when
 * it has a fractional part or is too large to be a finite double. Never builds a huge number:
 * a zero significand is 0 whatever its exponent (`0e999999999`).
 */
export function exactInteger(literal: string): bigint | undefined {
  const match = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(literal);
  if (!match) return undefined;
  const [, sign = "", whole = "", fraction = "", exponentText = "0"] = match;
  let digits = (whole + fraction).replace(/^0+/, "");
  if (digits === "") return 0n;
  let exponent = Number(exponentText) - fraction.length;
  while (exponent < 0 && digits.endsWith("0")) {
    digits = digits.slice(0, -1);
    exponent += 1;
  }
  // Doubles end below 1.8e308: beyond that the literal is not a number this gateway reads.
  if (exponent < 0 || digits.length + exponent > 309) return undefined;
  const value = BigInt(digits) * 10n ** BigInt(exponent);
  return sign === "-" ? -value : value;
}

// ---------------------------------------------------------------- the JSON text, lossless

/**
 * A property of an object in the raw JSON, located by byte offsets. The scan works on bytes:
 * every structural character of JSON is ASCII, and no byte of a multi-byte UTF-8 sequence is.
 */
interface Member {
  readonly key: string;
  /** The index of the key's opening quote. */
  readonly keyStart: number;
  readonly valueStart: number;
  readonly valueEnd: number;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

// Spans of the top-level members of requests made by parseChatRequest, for upstreamBody.
const spans = new WeakMap<ChatRequest, readonly Member[]>();

function isSpace(byte: number | undefined): boolean {
  return byte === 0x20 || byte === 0x0a || byte === 0x0d || byte === 0x09;
}

function skipSpace(bytes: Uint8Array, i: number): number {
  while (isSpace(bytes[i])) i += 1;
  return i;
}

function malformed(): never {
  // Only reached on text JSON.parse rejected, which parseChatRequest never scans.
  throw new Error("malformed JSON text");
}

/** The index just past the string whose opening quote is at `start`. */
function skipString(bytes: Uint8Array, start: number): number {
  let from = start + 1;
  for (;;) {
    const quote = bytes.indexOf(QUOTE, from);
    if (quote < 0) malformed();
    let backslashes = 0;
    while (bytes[quote - 1 - backslashes] === BACKSLASH) backslashes += 1;
    if (backslashes % 2 === 0) return quote + 1;
    from = quote + 1;
  }
}

/** The index just past the value starting at `start` (its depth was bounded by checkJsonBounds). */
function skipValue(bytes: Uint8Array, start: number): number {
  const first = bytes[start];
  if (first === QUOTE) return skipString(bytes, start);
  if (first === OPEN_OBJECT || first === OPEN_ARRAY) {
    let depth = 0;
    let i = start;
    while (i < bytes.length) {
      const byte = bytes[i];
      if (byte === QUOTE) {
        i = skipString(bytes, i);
        continue;
      }
      if (byte === OPEN_OBJECT || byte === OPEN_ARRAY) {
        depth += 1;
      } else if (byte === CLOSE_OBJECT || byte === CLOSE_ARRAY) {
        depth -= 1;
        if (depth === 0) return i + 1;
      }
      i += 1;
    }
    malformed();
  }
  let i = start;
  while (i < bytes.length) {
    const byte = bytes[i];
    if (byte === COMMA || byte === CLOSE_OBJECT || byte === CLOSE_ARRAY || isSpace(byte)) break;
    i += 1;
  }
  return i;
}

/** The text of `bytes[start, end)`; ASCII (every key this gateway reads) skips the decoder. */
function textOf(bytes: Uint8Array, start: number, end: number): string {
  let text = "";
  for (let i = start; i < end; i += 1) {
    const byte = bytes[i] as number;
    if (byte >= 0x80) return utf8.decode(bytes.subarray(start, end));
    text += String.fromCharCode(byte);
  }
  return text;
}

function decodeKey(bytes: Uint8Array, start: number, end: number): string {
  return bytes.subarray(start + 1, end - 1).includes(BACKSLASH)
    ? (JSON.parse(textOf(bytes, start, end)) as string)
    : textOf(bytes, start + 1, end - 1);
}

/** The members of the object whose `{` is at `open`, with the index just past its `}`. */
function objectMembers(bytes: Uint8Array, open: number): { members: Member[]; end: number } {
  if (bytes[open] !== OPEN_OBJECT) malformed();
  const members: Member[] = [];
  let i = skipSpace(bytes, open + 1);
  if (bytes[i] === CLOSE_OBJECT) return { members, end: i + 1 };
  for (;;) {
    const keyStart = skipSpace(bytes, i);
    if (bytes[keyStart] !== QUOTE) malformed();
    const keyEnd = skipString(bytes, keyStart);
    const key = decodeKey(bytes, keyStart, keyEnd);
    i = skipSpace(bytes, keyEnd);
    if (bytes[i] !== COLON) malformed();
    const valueStart = skipSpace(bytes, i + 1);
    const valueEnd = skipValue(bytes, valueStart);
    members.push({ key, keyStart, valueStart, valueEnd });
    i = skipSpace(bytes, valueEnd);
    if (bytes[i] === CLOSE_OBJECT) return { members, end: i + 1 };
    if (bytes[i] !== COMMA) malformed();
    i += 1;
  }
}

/** Members of the top-level object; rejects duplicate keys. */
function topLevelMembers(raw: Uint8Array): Member[] {
  const { members } = objectMembers(raw, skipSpace(raw, 0));
  const seen = new Set<string>();
  for (const { key } of members) {
    if (seen.has(key)) invalid(`'${key.slice(0, 100)}' occurs more than once`);
    seen.add(key);
  }
  return members;
}

function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, part) => n + part.byteLength, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.byteLength;
  }
  return out;
}

/**
 * Refuses, with 400 `invalid_request`, a JSON text that nests arrays and objects deeper than
 * `maxDepth` or has an array of more than `maxArrayItems` items, before anything parses it (so
 * neither JSON.parse nor a recursive walk ever sees such a document). One pass over the bytes,
 * no recursion, memory bounded by `maxDepth`; strings are skipped with indexOf. Text that is not
 * JSON is let through for the parser to report.
 */
export function checkJsonBounds(raw: Uint8Array, bounds: JsonBounds = {}): void {
  const maxDepth = bounds.maxDepth ?? maxJsonDepth;
  const maxItems = bounds.maxArrayItems ?? maxJsonArrayItems;
  // Per open level: the commas seen so far in an array, -1 for an object.
  const commas = new Int32Array(maxDepth + 1);
  let depth = 0;
  const n = raw.length;
  for (let i = 0; i < n; i += 1) {
    const byte = raw[i];
    if (byte === QUOTE) {
      let from = i + 1;
      for (;;) {
        const quote = raw.indexOf(QUOTE, from);
        if (quote < 0) return; // unterminated: JSON.parse says so
        let backslashes = 0;
        while (raw[quote - 1 - backslashes] === BACKSLASH) backslashes += 1;
        from = quote + 1;
        if (backslashes % 2 === 0) break;
      }
      i = from - 1;
    } else if (byte === OPEN_ARRAY || byte === OPEN_OBJECT) {
      depth += 1;
      if (depth > maxDepth)
        invalid(`the request body is nested more than ${maxDepth} levels deep (MAX_JSON_DEPTH)`);
      commas[depth] = byte === OPEN_ARRAY ? 0 : -1;
    } else if (byte === CLOSE_ARRAY || byte === CLOSE_OBJECT) {
      if (depth > 0) depth -= 1;
    } else if (byte === COMMA && depth > 0 && commas[depth]! >= 0) {
      const seen = (commas[depth] = commas[depth]! + 1);
      if (seen >= maxItems)
        invalid(
          `an array in the request body has more than ${maxItems} items (MAX_JSON_ARRAY_ITEMS)`,
        );
    }
  }
}

// ---------------------------------------------------------------- what goes upstream

const includeUsageMember = utf8Encoder.encode('"include_usage":true');
const includeUsageMemberComma = utf8Encoder.encode('"include_usage":true,');
const streamOptionsMember = utf8Encoder.encode('"stream_options":{"include_usage":true}');
const streamOptionsValue = utf8Encoder.encode('{"include_usage":true}');
const trueLiteral = utf8Encoder.encode("true");
const comma = utf8Encoder.encode(",");
const nothing = new Uint8Array();

/**
 * Members of the chat body that never reach the provider. The gateway's own (`offer`,
 * `provider`): they choose the offer, so the provider has no use for them, and they would show it
 * a client's pins and the competitors it ranks, restricts or excludes. The servers' length
 * controls ({@link lengthControls}): parsing let them through only as `null` or `false`, which a
 * server might still read its own way.
 */
const cutMembers: ReadonlySet<string> = new Set([
  "offer",
  "provider",
  ...Object.keys(lengthControls),
]);

/** The members that carry the output limit (per choice) to an OpenAI-compatible server. */
const limitMembers: ReadonlySet<string> = new Set(["max_tokens", "max_completion_tokens"]);

/** `raw[start, end)` becomes `text`. */
interface Edit {
  readonly start: number;
  readonly end: number;
  readonly text: Uint8Array;
}

/**
 * The bytes to send to the provider: the client's bytes, edited by splicing (never
 * re-serialised), so unknown properties, key order, whitespace and numbers beyond 2^53 reach the
 * provider exactly as sent. Three edits, each made only when needed:
 *
 * - The members that never reach the provider (`offer`, `provider`, and the servers' length
 *   controls, which parsing accepted only as `null` or `false`) are cut out with their
 *   separating comma (and the white space between them and the next member); a body without
 *   them keeps every byte. Escaped spellings (`"offe\u0072"`) are the same key to the
 *   provider's parser, and are cut too.
 * - The provider generates at most `limit` tokens per choice, the output limit the quote priced
 *   ({@link outputLimit} for the offer that serves the request):
 *   - a `max_tokens` or `max_completion_tokens` the body has keeps its bytes when it is at most
 *     `limit`; one that is `null` or above `limit` becomes `limit`;
 *   - a body with neither gains `"max_tokens":<limit>` right after the opening `{`: the field
 *     every OpenAI-compatible server reads (vLLM, llama.cpp, SGLang, TGI, Ollama); the newer
 *     `max_completion_tokens` is not read by all of them, and a second field could only make
 *     servers disagree on which one wins.
 * - The gateway meters every stream from the provider's usage, so a streaming request always asks
 *   for it: when `stream_options.include_usage` is not already true, the body gains it.
 *   - no `stream_options`: `"stream_options":{"include_usage":true}` goes right after the
 *     opening `{`;
 *   - `stream_options: null`: the `null` becomes `{"include_usage":true}`;
 *   - a `stream_options` object: its `include_usage` value becomes `true`, or
 *     `"include_usage":true` is added as its first member; its other members stay.
 *
 * A body that has nothing to cut, carries a limit at most `limit`, and does not stream or already
 * asks for usage goes upstream byte for byte (the very array).
 */
export function upstreamBody(req: ChatRequest, limit: bigint): Uint8Array {
  const raw = req.raw;
  const top = spans.get(req) ?? topLevelMembers(raw);
  const edits: Edit[] = [];
  // Members added right after the opening `{`, in this order.
  const added: Uint8Array[] = [];
  let lastKept = -1;
  for (let i = 0; i < top.length; i += 1) if (!cutMembers.has(top[i]!.key)) lastKept = i;
  let limited = false;
  for (let i = 0; i < top.length; i += 1) {
    const member = top[i]!;
    if (cutMembers.has(member.key)) edits.push(cut(top, i, lastKept));
    else if (limitMembers.has(member.key)) {
      limited = true;
      const value = member.key === "max_tokens" ? req.maxTokens : req.maxCompletionTokens;
      if (value === undefined || value > limit) {
        edits.push({
          start: member.valueStart,
          end: member.valueEnd,
          text: utf8Encoder.encode(limit.toString()),
        });
      }
    }
  }
  if (!limited) added.push(utf8Encoder.encode(`"max_tokens":${limit}`));
  if (req.stream && !req.includeUsage) edits.push(...usageEdits(raw, top, added));
  if (added.length > 0) {
    const at = skipSpace(raw, 0) + 1;
    const parts = added.flatMap((member, i) => (i === 0 ? [member] : [comma, member]));
    if (lastKept >= 0) parts.push(comma);
    edits.push({ start: at, end: at, text: concatBytes(parts) });
  }
  if (edits.length === 0) return raw;
  // Sorted by position (an insertion before a cut that starts at the same byte); none overlap.
  edits.sort((a, b) => a.start - b.start || a.end - b.end);
  const parts: Uint8Array[] = [];
  let from = 0;
  for (const edit of edits) {
    parts.push(raw.subarray(from, edit.start), edit.text);
    from = edit.end;
  }
  parts.push(raw.subarray(from));
  return concatBytes(parts);
}

/**
 * The cut that removes the top-level member `top[i]` and one comma next to it. Before the last
 * kept member (`top[lastKept]`), the cut runs from its key to the next member's key (taking the
 * comma after it); after it, from the end of the previous member's value (taking the comma
 * before it) to the end of its own. Cuts of neighbouring members are adjacent, never overlapping.
 */
function cut(top: readonly Member[], i: number, lastKept: number): Edit {
  const member = top[i]!;
  if (i < lastKept) return { start: member.keyStart, end: top[i + 1]!.keyStart, text: nothing };
  const start = i === 0 ? member.keyStart : top[i - 1]!.valueEnd;
  return { start, end: member.valueEnd, text: nothing };
}

/**
 * The edits that make the body ask for usage on its stream (see {@link upstreamBody}); a
 * `stream_options` member to add goes to `added`.
 */
function usageEdits(raw: Uint8Array, top: readonly Member[], added: Uint8Array[]): Edit[] {
  const existing = top.find((m) => m.key === "stream_options");
  if (existing === undefined) {
    added.push(streamOptionsMember);
    return [];
  }
  const { valueStart, valueEnd } = existing;
  if (raw[valueStart] !== OPEN_OBJECT) {
    // null (anything else failed validation)
    return [{ start: valueStart, end: valueEnd, text: streamOptionsValue }];
  }
  const inner = objectMembers(raw, valueStart).members;
  const usage = inner.filter((m) => m.key === "include_usage");
  if (usage.length === 0) {
    const at = valueStart + 1;
    const text = inner.length > 0 ? includeUsageMemberComma : includeUsageMember;
    return [{ start: at, end: at, text }];
  }
  // Every occurrence, so a provider that keeps the first of duplicate keys also sees true.
  return usage.map((m) => ({ start: m.valueStart, end: m.valueEnd, text: trueLiteral }));
}

// ---------------------------------------------------------------- quote numbers

/**
 * The most output tokens the request may produce: `max_completion_tokens`, else `max_tokens`,
 * else the offer's `capabilities.max_output_tokens` (a positive integer), else
 * {@link defaultOutputLimit}.
 */
export function outputLimit(req: ChatRequest, offerCapabilities: Record<string, unknown>): bigint {
  const requested = req.maxCompletionTokens ?? req.maxTokens;
  if (requested !== undefined) return requested;
  const capability = offerCapabilities["max_output_tokens"];
  if (typeof capability === "number" && Number.isSafeInteger(capability) && capability > 0) {
    return BigInt(capability);
  }
  return defaultOutputLimit;
}

/**
 * The most output tokens the request may be billed for: {@link outputLimit} for each of its
 * `n` choices (a provider that honours `n` generates up to the limit for every choice, and
 * reports all of them as completion tokens). The quote's `max_output_tokens` and
 * `maximum_credits`, and the reservation, use it.
 */
export function outputBound(req: ChatRequest, offerCapabilities: Record<string, unknown>): bigint {
  return outputLimit(req, offerCapabilities) * req.choices;
}

/** Tokens allowed per message for the chat template's role markers and separators. */
export const perMessageTokenAllowance = 8n;
/**
 * Tokens allowed once per request for the template's constant text: begin-of-sequence and
 * generation-prompt markers, a default system prompt (Qwen2.5's is about 20 tokens), a date
 * header (Llama 3.1's is about 25), tool-use instructions (about 60 to 100 tokens).
 */
export const fixedTokenAllowance = 256n;
/**
 * Tokens allowed per non-text content part (image, audio, file...), whose tokens do not follow
 * from the bytes that reference them: `16384` is the most a Qwen2-VL image can take with its
 * default `max_pixels`, and above OpenAI's largest high-detail image.
 */
export const mediaPartTokenAllowance = 16_384n;

const textPartTypes = new Set(["text", "input_text", "output_text", "refusal"]);

function utf8Length(text: string): bigint {
  return BigInt(Buffer.byteLength(text, "utf8"));
}

/** Non-text content parts (images, audio, files) of the messages. */
export function mediaParts(messages: readonly ChatMessage[]): bigint {
  let count = 0n;
  for (const message of messages) {
    if (!Array.isArray(message.content)) continue;
    for (const part of message.content) {
      if (isObject(part) && typeof part["type"] === "string" && !textPartTypes.has(part["type"])) {
        count += 1n;
      }
    }
  }
  return count;
}

/**
 * The gateway's upper bound of the prompt's tokens, made without the model's tokenizer:
 *
 *     B(messages) + 2 * (B(tools) + B(tool_choice) + B(response_format))
 *       + 8 * (number of messages) + 16384 * (non-text content parts) + 256
 *
 * where `B(x)` is the UTF-8 byte length of `x`'s compact JSON serialisation (0 when absent).
 *
 * Why it holds: the tokenizers chat models use (byte-level BPE as in GPT, Llama 3 and Qwen;
 * SentencePiece with byte fallback as in Llama 2 and Mistral) never produce a token that covers
 * less than one byte of the text, so a text of `n` UTF-8 bytes has at most `n` tokens. A chat
 * template copies each message's text into the prompt; the JSON serialisation contains that
 * text with at least as many bytes (quotes, escapes and the keys such as `"role":"user"` only
 * add bytes), so `B(messages)` bounds the tokens of all message text. What the template adds
 * around each message (role markers, separators, end-of-turn tokens) is at most
 * {@link perMessageTokenAllowance} tokens beyond the bytes the message's JSON keys already
 * count, and its constant text (begin markers, default system prompt, date header, tool
 * instructions, generation prompt) is {@link fixedTokenAllowance}. Tool schemas, the tool
 * choice and the response format count twice, because templates often re-serialise them
 * indented (Llama 3.1 uses `tojson(indent=4)`), which adds whitespace per line the compact form
 * does not have. Images, audio and files are tokenised from their content, not from the bytes
 * that reference them, so each non-text content part adds {@link mediaPartTokenAllowance}.
 *
 * The byte argument is exact; the allowances are generous estimates of template text. Where a
 * provider still reports more, the charge is capped at the quote's maximum and the offer flagged.
 */
export function inputTokenUpperBound(req: ChatRequest): bigint {
  // Canonical JSON has exactly the length of the compact serialisation.
  const parts = canonicalParts(req);
  const schemas = [parts.tools, parts.toolChoice, parts.responseFormat].reduce<bigint>(
    (sum, text) => sum + (text === undefined ? 0n : utf8Length(text)),
    0n,
  );
  return (
    utf8Length(parts.messages) +
    2n * schemas +
    perMessageTokenAllowance * BigInt(req.messages.length) +
    mediaPartTokenAllowance * mediaParts(req.messages) +
    fixedTokenAllowance
  );
}

/**
 * RFC 8785 (JCS) style canonical JSON: object keys sorted by UTF-16 code units at every depth,
 * arrays in order, no whitespace, strings and numbers as `JSON.stringify` writes them. A bigint
 * is written as its decimal integer. Its length equals that of `JSON.stringify(value)` for any
 * JSON value, since sorting keys moves bytes without adding any.
 */
export function canonicalJson(value: unknown): string {
  switch (typeof value) {
    case "string":
      return jsonString(value);
    case "boolean":
      return value ? "true" : "false";
    case "bigint":
      return value.toString();
    case "number":
      if (!Number.isFinite(value)) throw new TypeError("canonical JSON has no non-finite numbers");
      return JSON.stringify(value);
    case "object": {
      if (value === null) return "null";
      if (Array.isArray(value)) {
        let out = "[";
        for (let i = 0; i < value.length; i += 1) {
          if (i > 0) out += ",";
          out += canonicalJson(value[i]);
        }
        return `${out}]`;
      }
      const object = value as { [key: string]: unknown };
      const keys = Object.keys(object).sort();
      let out = "{";
      for (let i = 0; i < keys.length; i += 1) {
        const key = keys[i] as string;
        if (i > 0) out += ",";
        out += `${jsonString(key)}:${canonicalJson(object[key])}`;
      }
      return `${out}}`;
    }
    default:
      throw new TypeError(`canonical JSON cannot represent a ${typeof value}`);
  }
}

// Characters JSON.stringify escapes: quote, backslash, controls, and surrogates (when lone).
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const needsEscape = /["\\\u0000-\u001f\ud800-\udfff]/;

/** `JSON.stringify(text)`, without the call when nothing needs escaping (the common case). */
function jsonString(text: string): string {
  return needsEscape.test(text) ? JSON.stringify(text) : `"${text}"`;
}

/** The canonical JSON of the request's bound fields, made once per request. */
interface CanonicalParts {
  readonly messages: string;
  readonly tools: string | undefined;
  readonly toolChoice: string | undefined;
  readonly responseFormat: string | undefined;
}

const canonicalCache = new WeakMap<ChatRequest, CanonicalParts>();

function canonicalParts(req: ChatRequest): CanonicalParts {
  let parts = canonicalCache.get(req);
  if (parts === undefined) {
    parts = {
      messages: canonicalJson(req.messages),
      tools: req.tools === undefined ? undefined : canonicalJson(req.tools),
      toolChoice: req.toolChoice === undefined ? undefined : canonicalJson(req.toolChoice),
      responseFormat:
        req.responseFormat === undefined ? undefined : canonicalJson(req.responseFormat),
    };
    canonicalCache.set(req, parts);
  }
  return parts;
}

// Each request's fingerprint, computed once (every candidate offer's internal quote carries it).
const fingerprints = new WeakMap<ChatRequest, string>();

/**
 * What a quote is bound to (spec: "the exact model, messages, output limit, tools, tool choice
 * and response format", and `n`, which multiplies the output a quote prices): the SHA-256 hex
 * of the canonical JSON of `{model, messages, n, output_limit, tools, tool_choice,
 * response_format}`, with `n` the choice count (1 when absent or null),
 * `output_limit = max_completion_tokens ?? max_tokens ?? null` (exact, also beyond 2^53) and
 * absent or null `tools`, `tool_choice`, `response_format` as null. Key order and whitespace in
 * the request do not change it; any change of value in the seven does. Numbers inside messages
 * and tools compare as JavaScript numbers (`1.0` equals `1`).
 */
export function quoteFingerprint(req: ChatRequest): string {
  let fingerprint = fingerprints.get(req);
  if (fingerprint !== undefined) return fingerprint;
  const parts = canonicalParts(req);
  // canonicalJson of the seven-field object, its keys written in sorted order.
  const canonical =
    `{"messages":${parts.messages},"model":${JSON.stringify(req.model)},"n":${req.choices}` +
    `,"output_limit":${(req.maxCompletionTokens ?? req.maxTokens)?.toString() ?? "null"}` +
    `,"response_format":${parts.responseFormat ?? "null"}` +
    `,"tool_choice":${parts.toolChoice ?? "null"},"tools":${parts.tools ?? "null"}}`;
  fingerprint = hash("sha256", canonical, "hex");
  fingerprints.set(req, fingerprint);
  return fingerprint;
}
