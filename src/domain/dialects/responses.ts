import type { Static } from "@sinclair/typebox";
import { ResponsesInputItem, ResponsesRequest } from "../../schema/responses.js";
import { compileBody } from "../../schema/validate.js";
import { GatewayError } from "../errors.js";
import type { Dialect, DialectEvent, GatewayCharge, StreamTranslator } from "./types.js";

/**
 * The OpenAI Responses API (`POST /v1/responses`) as a dialect of the canonical chat completion
 * (DESIGN.md section 9): request in, answer and events out. Pure: no I/O, and no clock except
 * when the provider's answer carries no `created` time.
 *
 * The gateway is stateless, so everything the Responses API keeps on the server is refused with
 * a message naming the field: `previous_response_id`, `conversation`, `prompt` (stored
 * templates), `background: true`, input `item_reference`s and `file_id`s. `store: true` is
 * refused too: a client that asks for its response to be kept means to use it later (by id, or
 * as `previous_response_id`), and accepting it would only defer the failure to that later call.
 * `store` absent (the official SDK sends none unless asked) or `false` is accepted: nothing is
 * stored either way.
 *
 * What the canonical request cannot express is refused rather than dropped, so a client never
 * gets a silently different answer: built-in tools (web search, file search, computer use, code
 * interpreter, MCP...), `truncation: "auto"`, `top_logprobs`, file and audio inputs, and any
 * field this module does not know. Accepted and not forwarded, because they only tune or label
 * the provider's service and change nothing in the answer the gateway relays: `metadata`,
 * `include` (it adds data to item kinds this gateway never returns), `prompt_cache_key`,
 * `prompt_cache_retention`, `safety_identifier`, `service_tier`, `stream_options`,
 * `reasoning.summary`. Input `reasoning` items are dropped: they are one provider's opaque
 * state, and chat has no place for them.
 *
 * A `developer` message becomes a `system` one (and `instructions` a first system message):
 * most providers' chat templates know no developer role. The gateway's own request fields,
 * `offer` and `provider`, are carried into the canonical request unchanged, where the gateway
 * reads them as on the chat route (and cuts them out of what goes upstream).
 *
 * The answer echoes no request parameter (the translator sees only the provider's answer):
 * `instructions`, `tools`, `temperature`, `top_p` and `metadata` are neutral (`null` or `[]`).
 */
export const responsesDialect: Dialect = {
  name: "responses",
  toCanonical,
  fromCompletion,
  createStream,
  errorBody,
};

// ---------------------------------------------------------------- request

type Json = Record<string, unknown>;
type Request = Static<typeof ResponsesRequest>;
type InputItem = Static<typeof ResponsesInputItem>;
type InputMessage = Extract<InputItem, { role: unknown }>;

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * The request's shape, refusals included, is the schema's (src/schema/responses.ts). The refused
 * members (what the API keeps on the server, built-in tools, unknown members) are refused by the
 * schema too, not by a check before it: each carries its message (`x-error-message`), so the
 * document states every refusal and why, and the one validator cannot disagree with it; a refused
 * tag is a branch of its discriminated union, so it is refused before any member its kind would
 * need is found missing. What follows trusts the typed value; `null` is absent throughout.
 */
const checkRequest = compileBody(ResponsesRequest);

/** Validates a Responses request and returns the canonical chat completion request. */
function toCanonical(body: unknown): { chat: Json; stream: boolean } {
  const request = checkRequest(body);
  const messages: Json[] = [];
  if (request.instructions != null) {
    messages.push({ role: "system", content: request.instructions });
  }
  messages.push(...inputMessages(request.input));

  const chat: Json = { model: request.model, messages };
  if (request.tools != null) chat["tools"] = request.tools.map(chatTool);
  if (request.tool_choice != null) chat["tool_choice"] = chatToolChoice(request.tool_choice);
  if (request.parallel_tool_calls != null) {
    chat["parallel_tool_calls"] = request.parallel_tool_calls;
  }
  if (request.max_output_tokens != null) {
    chat["max_completion_tokens"] = request.max_output_tokens;
  }
  if (request.temperature != null) chat["temperature"] = request.temperature;
  if (request.top_p != null) chat["top_p"] = request.top_p;
  if (request.text != null) Object.assign(chat, textConfig(request.text));
  if (request.reasoning?.effort != null) chat["reasoning_effort"] = request.reasoning.effort;
  if (request.user != null) chat["user"] = request.user;
  // The gateway's own, as they came (null included): the chat parser reads them.
  if (request.offer !== undefined) chat["offer"] = request.offer;
  if (request.provider !== undefined) chat["provider"] = request.provider;
  const stream = request.stream === true;
  chat["stream"] = stream;
  // The closing `response.completed` carries usage: the provider must report it on the stream.
  if (stream) chat["stream_options"] = { include_usage: true };
  return { chat, stream };
}

/** `input` -> chat messages. Function calls join the assistant message they follow. */
function inputMessages(input: Request["input"]): Json[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  const messages: Json[] = [];
  // The assistant message the next function_call item joins; any other item ends it.
  let assistant: Json | undefined;
  for (const item of input) {
    switch (item.type) {
      case "function_call": {
        if (assistant === undefined) {
          assistant = { role: "assistant", content: null };
          messages.push(assistant);
        }
        const calls = (assistant["tool_calls"] ??= []) as Json[];
        calls.push({
          id: item.call_id,
          type: "function",
          function: { name: item.name, arguments: item.arguments },
        });
        break;
      }
      case "function_call_output":
        messages.push({
          role: "tool",
          tool_call_id: item.call_id,
          content:
            typeof item.output === "string"
              ? item.output
              : chatContent(item.output.map((part) => ({ type: "text", text: part.text }))),
        });
        assistant = undefined;
        break;
      case "reasoning":
        // Another provider's opaque reasoning state: chat has no place for it (see the module doc).
        break;
      default: {
        // A message: `type` "message", or left out.
        const message = inputMessage(item);
        messages.push(message);
        assistant = message["role"] === "assistant" ? message : undefined;
      }
    }
  }
  // Semantic, not structural: reasoning items alone make no conversation.
  if (messages.length === 0) invalid("'input' holds no message");
  return messages;
}

function inputMessage(item: InputMessage): Json {
  const role = item.role === "developer" ? "system" : item.role;
  if (typeof item.content === "string") return { role, content: item.content };
  const parts: Json[] = [];
  const refusals: string[] = [];
  for (const part of item.content) {
    if (part.type === "refusal") refusals.push(part.refusal);
    else if (part.type === "input_image") parts.push(imagePart(part));
    else parts.push({ type: "text", text: part.text });
  }
  const message: Json = { role, content: chatContent(parts) };
  if (refusals.length > 0) message["refusal"] = refusals.join("");
  return message;
}

/** One text part is sent as a plain string (what every provider's chat template reads). */
function chatContent(parts: Json[]): unknown {
  const [only] = parts;
  if (parts.length === 1 && only?.["type"] === "text") return only["text"];
  if (parts.length === 0) return "";
  return parts;
}

const imageDetails = new Set(["low", "high", "auto"]);

function imagePart(part: { image_url: string; detail?: string | null }): Json {
  const { image_url: url, detail } = part;
  // "original" has no chat counterpart: the provider's default.
  return {
    type: "image_url",
    image_url: detail != null && imageDetails.has(detail) ? { url, detail } : { url },
  };
}

function chatTool(tool: NonNullable<Request["tools"]>[number]): Json {
  const fn: Json = { name: tool.name };
  if (tool.description != null) fn["description"] = tool.description;
  if (tool.parameters != null) fn["parameters"] = tool.parameters;
  if (tool.strict != null) fn["strict"] = tool.strict;
  return { type: "function", function: fn };
}

function chatToolChoice(choice: NonNullable<Request["tool_choice"]>): unknown {
  if (typeof choice === "string") return choice;
  return { type: "function", function: { name: choice.name } };
}

function textConfig(text: NonNullable<Request["text"]>): Json {
  const out: Json = {};
  if (text.verbosity != null) out["verbosity"] = text.verbosity;
  const format = text.format;
  if (format == null || format.type === "text") return out;
  if (format.type !== "json_schema") return { ...out, response_format: { type: "json_object" } };
  const jsonSchema: Json = { name: format.name, schema: format.schema };
  if (format.description != null) jsonSchema["description"] = format.description;
  if (format.strict != null) jsonSchema["strict"] = format.strict;
  return { ...out, response_format: { type: "json_schema", json_schema: jsonSchema } };
}

// ---------------------------------------------------------------- answer

/** The id of the response for a gateway request id (`0x` + hex): `resp_` + the hex. */
export function responseId(requestId: string): string {
  return `resp_${requestId.replace(/^0x/i, "")}`;
}

type ItemStatus = "in_progress" | "completed" | "incomplete";

interface Usage {
  readonly input_tokens: number;
  readonly input_tokens_details: { readonly cached_tokens: number };
  readonly output_tokens: number;
  readonly output_tokens_details: { readonly reasoning_tokens: number };
  readonly total_tokens: number;
}

function count(value: unknown): number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? value : 0;
}

/** The Responses usage of a chat usage object; the gateway's metered counts when it has none. */
function usageOf(usage: unknown, charge: GatewayCharge | undefined): Usage | null {
  if (isObject(usage)) {
    const input = count(usage["prompt_tokens"]);
    const output = count(usage["completion_tokens"]);
    const promptDetails = usage["prompt_tokens_details"];
    const completionDetails = usage["completion_tokens_details"];
    // A detail above its total is the provider's error: 0, as the record keeps it (metering).
    const cached = isObject(promptDetails) ? count(promptDetails["cached_tokens"]) : 0;
    const reasoning = isObject(completionDetails)
      ? count(completionDetails["reasoning_tokens"])
      : 0;
    return {
      input_tokens: input,
      input_tokens_details: { cached_tokens: cached <= input ? cached : 0 },
      output_tokens: output,
      output_tokens_details: { reasoning_tokens: reasoning <= output ? reasoning : 0 },
      total_tokens:
        usage["total_tokens"] !== undefined ? count(usage["total_tokens"]) : input + output,
    };
  }
  if (charge === undefined) return null;
  const input = Number(charge.input_tokens);
  const output = Number(charge.output_tokens);
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: 0 },
    output_tokens: output,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: input + output,
  };
}

/** A chat finish reason -> the response's status and, when incomplete, why. */
function statusOf(finishReason: unknown): {
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
function responseObject(fields: {
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

function createdOf(value: unknown): number {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0
    ? value
    : Math.floor(Date.now() / 1000);
}

function messageItem(id: string, status: ItemStatus, parts: readonly Json[]): Json {
  return { type: "message", id, status, role: "assistant", content: parts };
}

function textPart(text: string): Json {
  return { type: "output_text", text, annotations: [] };
}

function refusalPart(refusal: string): Json {
  return { type: "refusal", refusal };
}

function functionCallItem(
  id: string,
  callId: string,
  name: string,
  args: string,
  status: ItemStatus,
): Json {
  return { type: "function_call", id, call_id: callId, name, arguments: args, status };
}

/** The hex of a request id, for item ids. */
function idTail(requestId: string): string {
  return requestId.replace(/^0x/i, "");
}

function fromCompletion(completion: unknown, charge: GatewayCharge): unknown {
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
      usage: usageOf(body["usage"], charge),
      incompleteDetails: incomplete_details,
    }),
    x_gateway: { ...charge },
  };
}

// ---------------------------------------------------------------- stream

interface MessageState {
  readonly kind: "message";
  readonly id: string;
  readonly outputIndex: number;
  /** Finished parts, then the open one. */
  readonly parts: { type: "output_text" | "refusal"; text: string }[];
  /** Set when its `response.output_item.done` is emitted. */
  status?: ItemStatus;
}

interface CallState {
  readonly kind: "function_call";
  readonly id: string;
  readonly outputIndex: number;
  readonly callId: string;
  name: string;
  arguments: string;
  /** Set when its `response.output_item.done` is emitted. */
  status?: ItemStatus;
}

type ItemState = MessageState | CallState;

/**
 * One answer's events. Items are emitted in the order the provider starts them, each with the
 * `output_index` it will keep in the final response. A message closes when a tool call starts
 * (text that comes after opens a new message). Function calls stay open until the answer ends:
 * chat providers address tool-call deltas by index, and nothing forbids a delta for an earlier
 * call after a later one began.
 */
class ResponsesStream implements StreamTranslator {
  private sequence = 0;
  private started = false;
  private ended = false;
  private createdAt = 0;
  private model: string;
  private readonly id: string;
  private readonly tail: string;
  private readonly items: ItemState[] = [];
  private message: MessageState | undefined;
  private readonly calls = new Map<number, CallState>();
  private finishReason: unknown;
  private usage: unknown;

  constructor(ctx: { readonly requestId: string; readonly model: string }) {
    this.id = responseId(ctx.requestId);
    this.tail = idTail(ctx.requestId);
    this.model = ctx.model;
  }

  chunk(chunk: unknown): DialectEvent[] {
    if (this.ended || !isObject(chunk)) return [];
    const events: DialectEvent[] = [];
    this.start(events, chunk);
    if (isObject(chunk["usage"])) this.usage = chunk["usage"];
    const choices = Array.isArray(chunk["choices"]) ? (chunk["choices"] as unknown[]) : [];
    // The canonical request asks for one choice; any other is not this answer's.
    const choice = choices.find((c) => isObject(c) && (c["index"] ?? 0) === 0);
    if (!isObject(choice)) return events;
    if (choice["finish_reason"] !== undefined && choice["finish_reason"] !== null) {
      this.finishReason = choice["finish_reason"];
    }
    const delta = isObject(choice["delta"]) ? choice["delta"] : {};
    if (typeof delta["content"] === "string" && delta["content"] !== "") {
      this.text(events, "output_text", delta["content"]);
    }
    if (typeof delta["refusal"] === "string" && delta["refusal"] !== "") {
      this.text(events, "refusal", delta["refusal"]);
    }
    if (Array.isArray(delta["tool_calls"])) {
      for (const call of delta["tool_calls"] as unknown[]) {
        if (isObject(call)) this.toolCall(events, call);
      }
    }
    return events;
  }

  finish(charge: GatewayCharge): DialectEvent[] {
    if (this.ended) return [];
    const events: DialectEvent[] = [];
    this.start(events, undefined);
    this.ended = true;
    const { status, incomplete_details } = statusOf(this.finishReason);
    // An answer with neither text nor calls is still one (empty) message, as the API gives it.
    if (this.items.length === 0) this.openMessage(events);
    for (const item of this.items) this.closeItem(events, item, status);
    const type = status === "completed" ? "response.completed" : "response.incomplete";
    const response = responseObject({
      id: this.id,
      createdAt: this.createdAt,
      model: this.model,
      status,
      output: this.items.map((item) => this.itemView(item, status)),
      usage: usageOf(this.usage, charge),
      incompleteDetails: incomplete_details,
    });
    this.emit(events, type, { response, x_gateway: { ...charge } });
    return events;
  }

  fail(error: GatewayError): DialectEvent[] {
    if (this.ended) return [];
    const events: DialectEvent[] = [];
    this.start(events, undefined);
    this.ended = true;
    const response = responseObject({
      id: this.id,
      createdAt: this.createdAt,
      model: this.model,
      status: "failed",
      output: this.items.map((item) => this.itemView(item, "incomplete")),
      usage: null,
      error: { code: error.code, message: publicMessage(error) },
    });
    this.emit(events, "response.failed", { response });
    return events;
  }

  private emit(events: DialectEvent[], type: string, fields: Json): void {
    events.push({ event: type, data: { type, sequence_number: this.sequence++, ...fields } });
  }

  /** `response.created` and `response.in_progress`, before the first event of any other kind. */
  private start(events: DialectEvent[], chunk: Json | undefined): void {
    if (this.started) return;
    this.started = true;
    this.createdAt = createdOf(chunk?.["created"]);
    if (this.model === "" && typeof chunk?.["model"] === "string") this.model = chunk["model"];
    const response = responseObject({
      id: this.id,
      createdAt: this.createdAt,
      model: this.model,
      status: "in_progress",
      output: [],
      usage: null,
    });
    this.emit(events, "response.created", { response });
    this.emit(events, "response.in_progress", { response });
  }

  private openMessage(events: DialectEvent[]): MessageState {
    const message: MessageState = {
      kind: "message",
      id: `msg_${this.tail}_${this.items.length}`,
      outputIndex: this.items.length,
      parts: [],
    };
    this.items.push(message);
    this.message = message;
    this.emit(events, "response.output_item.added", {
      output_index: message.outputIndex,
      item: messageItem(message.id, "in_progress", []),
    });
    return message;
  }

  /** Text (or refusal text) for the open message, opening the message or a part as needed. */
  private text(events: DialectEvent[], type: "output_text" | "refusal", delta: string): void {
    const message = this.message ?? this.openMessage(events);
    let part = message.parts.at(-1);
    if (part?.type !== type) {
      if (part !== undefined) this.closePart(events, message, message.parts.length - 1);
      part = { type, text: "" };
      message.parts.push(part);
      this.emit(events, "response.content_part.added", {
        item_id: message.id,
        output_index: message.outputIndex,
        content_index: message.parts.length - 1,
        part: type === "output_text" ? textPart("") : refusalPart(""),
      });
    }
    part.text += delta;
    const where = {
      item_id: message.id,
      output_index: message.outputIndex,
      content_index: message.parts.length - 1,
    };
    if (type === "output_text") {
      this.emit(events, "response.output_text.delta", { ...where, delta, logprobs: [] });
    } else {
      this.emit(events, "response.refusal.delta", { ...where, delta });
    }
  }

  private closePart(events: DialectEvent[], message: MessageState, index: number): void {
    const part = message.parts[index];
    if (part === undefined) return;
    const where = { item_id: message.id, output_index: message.outputIndex, content_index: index };
    if (part.type === "output_text") {
      this.emit(events, "response.output_text.done", { ...where, text: part.text, logprobs: [] });
    } else {
      this.emit(events, "response.refusal.done", { ...where, refusal: part.text });
    }
    this.emit(events, "response.content_part.done", { ...where, part: partView(part) });
  }

  private toolCall(events: DialectEvent[], delta: Json): void {
    const index = typeof delta["index"] === "number" ? delta["index"] : 0;
    const fn = isObject(delta["function"]) ? delta["function"] : {};
    const name = typeof fn["name"] === "string" ? fn["name"] : "";
    const args = typeof fn["arguments"] === "string" ? fn["arguments"] : "";
    let call = this.calls.get(index);
    if (call === undefined) {
      // A call begins: the message before it is complete.
      if (this.message !== undefined) {
        this.closeItem(events, this.message, "completed");
        this.message = undefined;
      }
      const outputIndex = this.items.length;
      call = {
        kind: "function_call",
        id: `fc_${this.tail}_${outputIndex}`,
        outputIndex,
        callId: typeof delta["id"] === "string" ? delta["id"] : `call_${this.tail}_${outputIndex}`,
        name,
        arguments: "",
      };
      this.calls.set(index, call);
      this.items.push(call);
      this.emit(events, "response.output_item.added", {
        output_index: outputIndex,
        item: functionCallItem(call.id, call.callId, call.name, "", "in_progress"),
      });
    } else if (call.name === "") {
      // The name comes whole (OpenAI sends it on a call's first delta); some providers repeat it
      // on every delta, so a later one is kept only when the first had none.
      call.name = name;
    }
    if (args !== "") {
      call.arguments += args;
      this.emit(events, "response.function_call_arguments.delta", {
        item_id: call.id,
        output_index: call.outputIndex,
        delta: args,
      });
    }
  }

  private closeItem(events: DialectEvent[], item: ItemState, status: ItemStatus): void {
    if (item.status !== undefined) return;
    // A call is complete once its arguments are; only the answer around it may be cut short.
    item.status = item.kind === "message" ? status : "completed";
    if (item.kind === "message") {
      if (item.parts.length === 0) {
        item.parts.push({ type: "output_text", text: "" });
        this.emit(events, "response.content_part.added", {
          item_id: item.id,
          output_index: item.outputIndex,
          content_index: 0,
          part: textPart(""),
        });
      }
      this.closePart(events, item, item.parts.length - 1);
    } else {
      this.emit(events, "response.function_call_arguments.done", {
        item_id: item.id,
        output_index: item.outputIndex,
        name: item.name,
        arguments: item.arguments,
      });
    }
    this.emit(events, "response.output_item.done", {
      output_index: item.outputIndex,
      item: this.itemView(item, status),
    });
  }

  /** An item as the response shows it: its closing status, else `status` (a cut answer). */
  private itemView(item: ItemState, status: ItemStatus): Json {
    const itemStatus = item.status ?? status;
    if (item.kind === "message") {
      return messageItem(item.id, itemStatus, item.parts.map(partView));
    }
    return functionCallItem(item.id, item.callId, item.name, item.arguments, itemStatus);
  }
}

function partView(part: { type: "output_text" | "refusal"; text: string }): Json {
  return part.type === "output_text" ? textPart(part.text) : refusalPart(part.text);
}

function createStream(ctx: {
  readonly requestId: string;
  readonly model: string;
}): StreamTranslator {
  return new ResponsesStream(ctx);
}

// ---------------------------------------------------------------- errors

/** As on the chat route: an internal error's message is for the logs only. */
function publicMessage(error: GatewayError): string {
  return error.code === "internal_error" ? "internal error" : error.message;
}

/** OpenAI's error body, with the gateway's code and type (DESIGN.md section 5). */
function errorBody(error: GatewayError): unknown {
  return {
    error: { message: publicMessage(error), type: error.type, code: error.code, param: null },
  };
}
