import type { ErrorKind, GatewayError } from "../errors.js";
import { isObject, type JsonObject } from "./json.js";
import type { GatewayCharge } from "./types.js";

/**
 * The Messages dialect's answers: a canonical chat.completion as a `message`, what the stream
 * translator (messages-stream.ts) shares with it (ids, stop reason, usage), and the error body.
 */

/** `msg_` and the request id's hex (request ids are 0x-prefixed hex). */
export function messageId(requestId: string): string {
  return `msg_${requestId.replace(/^0x/i, "")}`;
}

/** A tool_use id for a tool call the provider gave none. */
export function toolUseId(requestId: string, index: number): string {
  return `toolu_${requestId.replace(/^0x/i, "").slice(0, 24)}_${index}`;
}

type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use" | "refusal";

export function stopOf(
  finishReason: unknown,
  calledTools: boolean,
  stopString: unknown,
): { stop_reason: StopReason; stop_sequence: string | null } {
  if (finishReason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  if (finishReason === "content_filter") return { stop_reason: "refusal", stop_sequence: null };
  if (calledTools || finishReason === "tool_calls" || finishReason === "function_call") {
    return { stop_reason: "tool_use", stop_sequence: null };
  }
  if (finishReason === "stop" && typeof stopString === "string" && stopString.length > 0) {
    return { stop_reason: "stop_sequence", stop_sequence: stopString };
  }
  return { stop_reason: "end_turn", stop_sequence: null };
}

/** Decimal-string token counts of the charge, as numbers. */
function chargeCount(value: string): number {
  const n = Number(value);
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}

interface Usage {
  readonly input_tokens: number;
  readonly output_tokens: number;
  readonly cache_read_input_tokens: number;
  readonly cache_creation_input_tokens: number;
  /** Present when the provider reported reasoning tokens (`completion_tokens_details`). */
  readonly output_tokens_details?: { readonly thinking_tokens: number };
}

/**
 * The Anthropic usage of a completed answer: what was charged (DESIGN.md 10: the usage a
 * client's SDK reads is the charge; the provider's claim and the gateway's count are in
 * `x_gateway`). Its input excludes the cached part, as Anthropic reports it.
 */
export function usageOf(charge: GatewayCharge): Usage {
  const input = chargeCount(charge.input_tokens);
  const cached = chargeCount(charge.cached_input_tokens ?? "0");
  const reasoning = chargeCount(charge.reasoning_tokens ?? "0");
  return {
    input_tokens: input - cached,
    output_tokens: chargeCount(charge.output_tokens),
    cache_read_input_tokens: cached,
    cache_creation_input_tokens: 0,
    ...(reasoning === 0 ? {} : { output_tokens_details: { thinking_tokens: reasoning } }),
  };
}

/** A tool call's arguments as the tool_use input object (`{}` when they are not a JSON object). */
function inputOf(args: unknown): JsonObject {
  if (typeof args !== "string" || args.trim() === "") return {};
  try {
    const parsed: unknown = JSON.parse(args);
    return isObject(parsed) ? parsed : {};
  } catch {
    return {};
  }
}

export function firstChoice(value: unknown): JsonObject | undefined {
  if (!isObject(value) || !Array.isArray(value["choices"])) return undefined;
  const choices = value["choices"] as unknown[];
  const choice = choices.find((c) => isObject(c) && c["index"] === 0) ?? choices[0];
  return isObject(choice) ? choice : undefined;
}

export function fromCompletion(completion: unknown, charge: GatewayCharge): unknown {
  const choice = firstChoice(completion);
  const message = isObject(choice?.["message"]) ? (choice["message"] as JsonObject) : {};
  const content: JsonObject[] = [];
  const text = message["content"];
  if (typeof text === "string" && text.length > 0) content.push({ type: "text", text });
  const calls = Array.isArray(message["tool_calls"]) ? (message["tool_calls"] as unknown[]) : [];
  calls.forEach((call, i) => {
    if (!isObject(call)) return;
    const fn = isObject(call["function"]) ? call["function"] : {};
    content.push({
      type: "tool_use",
      id:
        typeof call["id"] === "string" && call["id"].length > 0
          ? call["id"]
          : toolUseId(charge.request_id, i),
      name: typeof fn["name"] === "string" ? fn["name"] : "",
      input: inputOf(fn["arguments"]),
    });
  });
  const model = isObject(completion) ? completion["model"] : undefined;
  return {
    id: messageId(charge.request_id),
    type: "message",
    role: "assistant",
    model: typeof model === "string" ? model : "",
    content,
    ...stopOf(choice?.["finish_reason"], calls.length > 0, choice?.["stop_reason"]),
    usage: usageOf(charge),
    x_gateway: charge,
  };
}

/**
 * Anthropic's error type for a gateway error, by its HTTP status (Anthropic's own statuses and
 * types: 402 billing_error, 409 conflict_error, 413 request_too_large, 503 overloaded_error).
 */
function anthropicErrorType(kind: ErrorKind): string {
  switch (kind) {
    case "unauthenticated":
      return "authentication_error";
    case "payment":
      return "billing_error";
    case "forbidden":
      return "permission_error";
    case "not_found":
      return "not_found_error";
    case "conflict":
      return "conflict_error";
    case "too_large":
      return "request_too_large";
    case "rate_limited":
      return "rate_limit_error";
    case "unavailable":
      return "overloaded_error";
    case "internal":
    case "not_implemented":
    case "bad_gateway":
      return "api_error";
    default:
      return "invalid_request_error";
  }
}

/**
 * Anthropic's error body, carrying the gateway's code twice: as `error.code` (where the gateway's
 * own error body has it) and as `error.details.error_code` (where Anthropic puts its codes, which
 * its SDK surfaces as `errorCode`).
 */
export function errorBody(error: GatewayError): unknown {
  return {
    type: "error",
    error: {
      type: anthropicErrorType(error.kind),
      message: error.message,
      code: error.code,
      details: { error_code: error.code },
    },
  };
}
