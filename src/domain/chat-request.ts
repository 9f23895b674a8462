import {
  ChatRequest as ChatRequestSchema,
  maxChoiceCount,
  type ChatRequestBody,
} from "../schema/chat.js";
import type { ChatMessage, ChatRequest, JsonObject } from "./chat-request-types.js";
import { compileBody } from "./body-check.js";
import type { JsonValue } from "./catalog.js";
import {
  checkJsonBounds,
  invalid,
  isObject,
  textOf,
  topLevelMembers,
  utf8,
  type JsonBounds,
  type Member,
} from "./chat-request-json.js";
import { keepSpans } from "./chat-request-upstream.js";
import { GatewayError } from "./errors.js";
import { normalizeHex } from "./hex.js";
import { parseProviderPreferences } from "./provider-preferences.js";

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
 *
 * This module parses; its other jobs have their own modules, whose names it re-exports: the
 * lossless reading of the JSON text and its bounds (chat-request-json.ts), the bytes that go
 * upstream (chat-request-upstream.ts), the quote's numbers and fingerprint (chat-request-quote.ts).
 */

export { chatRoles } from "../schema/chat.js";
export {
  checkJsonBounds,
  maxJsonArrayItems,
  maxJsonDepth,
  type JsonBounds,
} from "./chat-request-json.js";
export {
  canonicalJson,
  defaultOutputLimit,
  fixedTokenAllowance,
  inputTokenUpperBound,
  mediaPartTokenAllowance,
  mediaParts,
  outputBound,
  outputLimit,
  perMessageTokenAllowance,
  quoteFingerprint,
} from "./chat-request-quote.js";
export { upstreamBody } from "./chat-request-upstream.js";

export type { ChatMessage, ChatRequest, ChatRole, JsonObject } from "./chat-request-types.js";

/** The largest `n` accepted (the schema's bound, src/schema/chat.ts), as a bigint. */
export const maxChoices = BigInt(maxChoiceCount);

// ---------------------------------------------------------------- parsing

/** The body's structure and bounds, compiled once (src/schema/chat.ts). */
const checkBody: (value: unknown) => ChatRequestBody = compileBody(ChatRequestSchema);

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
  keepSpans(request, top);
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
