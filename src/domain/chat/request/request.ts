import { hash } from "node:crypto";
import type { Hex } from "viem";
import {
  ChatRequest as ChatRequestSchema,
  maxChoiceCount,
  reservedTemplateKwargs,
  type ChatRequestBody,
} from "../../../schema/chat.js";
import type { chatRoles } from "../../../schema/chat.js";
import { compileBody } from "../../body-check.js";
import type { JsonValue } from "../../catalog.js";
import {
  canonicalJson,
  checkJsonBounds,
  invalid,
  isObject,
  textOf,
  parseJsonText,
  topLevelMembers,
  type JsonBounds,
  type Member,
} from "./json.js";
import { GatewayError } from "../../errors.js";
import { normalizeHex } from "../../hex.js";
import { parseProviderPreferences, type ProviderPreferences } from "../../provider-preferences.js";

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
 * This module declares the request and parses it; its other jobs have their own modules in this
 * folder (index.ts is its face): the lossless reading of the JSON text and its bounds (json.ts),
 * the bytes that go upstream (upstream.ts), the quote's numbers (quote.ts).
 */

/** The chat request as the gateway reads it ({@link parseChatRequest}). */
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
  /**
   * The stop strings (`stop`; none when absent or null): at most `maxStopStrings`, each at most
   * `maxStopLength` characters (src/schema/chat.ts). The provider counts the one it generates,
   * and the client never sees it (`stopTokensOf`, src/domain/chat/usage.ts).
   */
  readonly stop: readonly string[];
  /** The body's top-level members, located while parsing it (upstream.ts splices at them). */
  readonly members: readonly Member[];
  /** The canonical JSON of the fields a quote binds and the input bound counts, made once. */
  readonly canonical: CanonicalParts;
  /**
   * What a quote is bound to (spec: "the exact model, messages, output limit, tools, tool
   * choice and response format", and `n`, which multiplies the output a quote prices): see
   * {@link quoteFingerprint}.
   */
  readonly fingerprint: string;
}

/** The canonical JSON ({@link canonicalJson}) of the request's bound fields. */
export interface CanonicalParts {
  readonly messages: string;
  readonly tools: string | undefined;
  readonly toolChoice: string | undefined;
  readonly responseFormat: string | undefined;
}

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
  const parsed = parseJsonText(raw);
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
  checkTemplateKwargs(body.chat_template_kwargs);
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

  const tools = (body.tools ?? undefined) as JsonValue[] | undefined;
  const toolChoice = (body.tool_choice ?? undefined) as JsonValue | undefined;
  const responseFormat = (body.response_format ?? undefined) as JsonValue | undefined;
  const canonical: CanonicalParts = {
    messages: canonicalJson(body.messages),
    tools: tools === undefined ? undefined : canonicalJson(tools),
    toolChoice: toolChoice === undefined ? undefined : canonicalJson(toolChoice),
    responseFormat: responseFormat === undefined ? undefined : canonicalJson(responseFormat),
  };
  return {
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
    tools,
    toolChoice,
    responseFormat,
    stop: body.stop == null ? [] : typeof body.stop === "string" ? [body.stop] : body.stop,
    members: top,
    canonical,
    fingerprint: quoteFingerprint(body.model, choices, maxCompletionTokens ?? maxTokens, canonical),
  };
}

/**
 * What a quote is bound to: the SHA-256 hex of the canonical JSON of `{model, messages, n,
 * output_limit, tools, tool_choice, response_format}`, with `n` the choice count (1 when absent
 * or null), `output_limit = max_completion_tokens ?? max_tokens ?? null` (exact, also beyond
 * 2^53) and absent or null `tools`, `tool_choice`, `response_format` as null. Key order and
 * whitespace in the request do not change it; any change of value in the seven does. Numbers
 * inside messages and tools compare as JavaScript numbers (`1.0` equals `1`).
 */
function quoteFingerprint(
  model: string,
  choices: bigint,
  limit: bigint | undefined,
  parts: CanonicalParts,
): string {
  // canonicalJson of the seven-field object, its keys written in sorted order.
  const canonical =
    `{"messages":${parts.messages},"model":${JSON.stringify(model)},"n":${choices}` +
    `,"output_limit":${limit?.toString() ?? "null"}` +
    `,"response_format":${parts.responseFormat ?? "null"}` +
    `,"tool_choice":${parts.toolChoice ?? "null"},"tools":${parts.tools ?? "null"}}`;
  return hash("sha256", canonical, "hex");
}

/**
 * `chat_template_kwargs` may not set the variables the server gives the chat template itself
 * (`reservedTemplateKwargs`, and the tokenizer's special tokens: `bos_token`, `eos_token`...):
 * the provider's template would render another prompt than the one the gateway counts (the
 * gateway's counter gives its own values precedence, a server may not).
 */
function checkTemplateKwargs(kwargs: Readonly<Record<string, unknown>> | null | undefined): void {
  if (kwargs == null) return;
  for (const key of Object.keys(kwargs)) {
    if (reservedTemplateKwargs.includes(key) || key.endsWith("_token")) {
      invalid(
        `'chat_template_kwargs.${key.slice(0, 100)}' is a variable the server gives the chat template itself: leave it out`,
      );
    }
  }
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
