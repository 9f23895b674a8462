import { GatewayError } from "../../errors.js";

/**
 * The chat request's JSON text, read losslessly (request.ts): its members located
 * by byte offsets, so that what goes upstream is the client's own bytes, and its bounds (nesting,
 * array items) checked on the bytes before anything parses them.
 */

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

/** Refuses the request: 400 `invalid_request` with `message`. */
export function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

/** Strict UTF-8 (a malformed sequence throws); a byte order mark is kept, for parsing to refuse. */
export const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * A request body's JSON text, parsed: the one rule for every JSON body, REST and RPC alike
 * (docs/decisions/api-and-console.md "One JSON body rule"). Strict UTF-8, and no byte order mark
 * (RFC 8259 8.1: a sender must not add one, a parser may refuse it; no OpenAI or Anthropic client
 * sends one): 400 `invalid_json` otherwise.
 */
export function parseJsonText(raw: Uint8Array): unknown {
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
  try {
    return JSON.parse(text);
  } catch (err) {
    const detail = err instanceof Error ? `: ${err.message.slice(0, 200)}` : "";
    throw new GatewayError("invalid_json", `the request body is not valid JSON${detail}`);
  }
}

export function isObject(value: unknown): value is { [key: string]: unknown } {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * A property of an object in the raw JSON, located by byte offsets. The scan works on bytes:
 * every structural character of JSON is ASCII, and no byte of a multi-byte UTF-8 sequence is.
 */
export interface Member {
  readonly key: string;
  /** The index of the key's opening quote. */
  readonly keyStart: number;
  readonly valueStart: number;
  readonly valueEnd: number;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
export const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

function isSpace(byte: number | undefined): boolean {
  return byte === 0x20 || byte === 0x0a || byte === 0x0d || byte === 0x09;
}

export function skipSpace(bytes: Uint8Array, i: number): number {
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
export function textOf(bytes: Uint8Array, start: number, end: number): string {
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
export function objectMembers(bytes: Uint8Array, open: number): { members: Member[]; end: number } {
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
export function topLevelMembers(raw: Uint8Array): Member[] {
  const { members } = objectMembers(raw, skipSpace(raw, 0));
  const seen = new Set<string>();
  for (const { key } of members) {
    if (seen.has(key)) invalid(`'${key.slice(0, 100)}' occurs more than once`);
    seen.add(key);
  }
  return members;
}

export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
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
