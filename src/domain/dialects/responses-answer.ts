import type { GatewayError } from "../errors.js";
import { isObject, type JsonObject as Json } from "./json.js";
import type { GatewayCharge } from "./types.js";

/**
 * The Responses dialect's answers: a canonical chat.completion as a response object, the shapes
 * the stream translator (responses-stream.ts) builds its events of, and the error body.
 */

/** The id of the response for a gateway request id (`0x` + hex): `resp_` + the hex. */
export function responseId(requestId: string): string {
  return `resp_${requestId.replace(/^0x/i, "")}`;
}

export type ItemStatus = "in_progress" | "completed" | "incomplete";

export interface Usage {
  readonly input_tokens: number;
  readonly input_tokens_details: { readonly cached_tokens: number };
  readonly output_tokens: number;
  readonly output_tokens_details: { readonly reasoning_tokens: number };
  readonly total_tokens: number;
}

/**
 * The Responses usage of a completed answer: what was charged (DESIGN.md 10: the usage a
 * client's SDK reads is the charge; the provider's claim and the gateway's count are in
 * `x_gateway`).
 */
export function usageOf(charge: GatewayCharge): Usage {
  const input = Number(charge.input_tokens);
  const output = Number(charge.output_tokens);
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: Number(charge.cached_input_tokens ?? "0") },
    output_tokens: output,
    output_tokens_details: { reasoning_tokens: Number(charge.reasoning_tokens ?? "0") },
    total_tokens: input + output,
  };
}

/** A chat finish reason -> the response's status and, when incomplete, why. */
export function statusOf(finishReason: unknown): {
  status: "completed" | "incomplete";
  incomplete_details: { reason: "max_output_tokens" | "content_filter" } | null;
} {
  if (finishReason === "length") {
    return { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } };
  }
  if (finishReason === "content_filter") {
    return { status: "incomplete", incomplete_details: { reason: "content_filter" } };
  }
  return { status: "completed", incomplete_details: null };
}

/** The response object; request parameters are not echoed (see the module doc). */
export function responseObject(fields: {
  id: string;
  createdAt: number;
  model: string;
  status: "in_progress" | "completed" | "incomplete" | "failed";
  output: readonly unknown[];
  usage: Usage | null;
  incompleteDetails?: unknown;
  error?: unknown;
}): Json {
  return {
    id: fields.id,
    object: "response",
    created_at: fields.createdAt,
    status: fields.status,
    error: fields.error ?? null,
    incomplete_details: fields.incompleteDetails ?? null,
    instructions: null,
    metadata: null,
    model: fields.model,
    output: fields.output,
    parallel_tool_calls: true,
    store: false,
    temperature: null,
    tool_choice: "auto",
    tools: [],
    top_p: null,
    usage: fields.usage,
  };
}

export function createdOf(value: unknown): number {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0
    ? value
    : Math.floor(Date.now() / 1000);
}

export function messageItem(id: string, status: ItemStatus, parts: readonly Json[]): Json {
  return { type: "message", id, status, role: "assistant", content: parts };
}

export function textPart(text: string): Json {
  return { type: "output_text", text, annotations: [] };
}

export function refusalPart(refusal: string): Json {
  return { type: "refusal", refusal };
}

export function functionCallItem(
  id: string,
  callId: string,
  name: string,
  args: string,
  status: ItemStatus,
): Json {
  return { type: "function_call", id, call_id: callId, name, arguments: args, status };
}

/** The hex of a request id, for item ids. */
export function idTail(requestId: string): string {
  return requestId.replace(/^0x/i, "");
}

export function fromCompletion(completion: unknown, charge: GatewayCharge): unknown {
  const body = isObject(completion) ? completion : {};
  const choices = Array.isArray(body["choices"]) ? (body["choices"] as unknown[]) : [];
  const choice: Json = isObject(choices[0]) ? choices[0] : {};
  const message: Json = isObject(choice["message"]) ? choice["message"] : {};
  const { status, incomplete_details } = statusOf(choice["finish_reason"]);
  const tail = idTail(charge.request_id);
  const output: Json[] = [];
  const parts: Json[] = [];
  if (typeof message["content"] === "string" && message["content"] !== "") {
    parts.push(textPart(message["content"]));
  }
  if (typeof message["refusal"] === "string" && message["refusal"] !== "") {
    parts.push(refusalPart(message["refusal"]));
  }
  const calls = Array.isArray(message["tool_calls"]) ? (message["tool_calls"] as unknown[]) : [];
  // An answer with neither text nor calls is still one (empty) message, as the API gives it.
  if (parts.length > 0 || calls.length === 0) {
    if (parts.length === 0) parts.push(textPart(""));
    output.push(messageItem(`msg_${tail}_0`, status, parts));
  }
  for (const call of calls) {
    const value: Json = isObject(call) ? call : {};
    const fn: Json = isObject(value["function"]) ? value["function"] : {};
    const at = output.length;
    const callId = typeof value["id"] === "string" ? value["id"] : `call_${tail}_${at}`;
    output.push(
      functionCallItem(
        `fc_${tail}_${at}`,
        callId,
        typeof fn["name"] === "string" ? fn["name"] : "",
        typeof fn["arguments"] === "string" ? fn["arguments"] : "",
        "completed",
      ),
    );
  }
  return {
    ...responseObject({
      id: responseId(charge.request_id),
      createdAt: createdOf(body["created"]),
      model: typeof body["model"] === "string" ? body["model"] : "",
      status,
      output,
      usage: usageOf(charge),
      incompleteDetails: incomplete_details,
    }),
    x_gateway: { ...charge },
  };
}

/** As on the chat route: an internal error's message is for the logs only. */
export function publicMessage(error: GatewayError): string {
  return error.code === "internal_error" ? "internal error" : error.message;
}

/** OpenAI's error body, with the gateway's code and type (DESIGN.md section 5). */
export function errorBody(error: GatewayError): unknown {
  return {
    error: { message: publicMessage(error), type: error.type, code: error.code, param: null },
  };
}
