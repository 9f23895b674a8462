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
 *
 * What a stream holds (docs/decisions.md, "Client dialects"). The Responses API sends the answer
 * again at its end: `response.output_text.done` a part's whole `text`,
 * `response.content_part.done` the part, `response.function_call_arguments.done` a call's whole
 * `arguments`, `response.output_item.done` the item, and `response.completed` (`.incomplete`,
 * `.failed`) the response with every item in its `output`. The official SDK reads them: its
 * accumulator replaces a part's text, an item and at last its whole snapshot with what they carry,
 * and `finalResponse()` is the closing event's response. So a stream holds each item's text,
 * arguments, name and call id until the end, and nothing else of the answer: the usage as its
 * figures, the finish reason as the status it makes. Bounded: at most {@link maxHeldChars} code
 * units of the provider's strings and {@link maxHeldParts} items and content parts per answer. An
 * answer that would pass either is cut there, as the output limit cuts one: what fits of that
 * delta is relayed, nothing of the answer after it; the response ends `incomplete`
 * (`max_output_tokens`), its open message `incomplete`, a call whose arguments were cut
 * `incomplete`. The done events carry exactly what was relayed, so the deltas, the done events and
 * the SDK's final response agree. What the provider sent past the cut is still metered as it came
 * (the translator does not see the count).
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

/**
 * The most UTF-16 code units of the provider's strings one streamed answer holds (texts,
 * refusals, call arguments, names and call ids, and the model's name when the chunk gives it):
 * 1 Mi, some 250,000 tokens of English, above every model's output limit; at most 2 MiB of
 * memory, as text is held in flat pieces (see {@link HeldText}).
 */
export const maxHeldChars = 1 << 20;

/** The most output items and content parts (together) one streamed answer holds. */
export const maxHeldParts = 1024;

/** What a streamed answer holds: the provider's strings (UTF-16 code units), items and parts. */
export interface Held {
  readonly chars: number;
  readonly parts: number;
}

/** Deltas are joined into one flat string once this many code units have come. */
const pieceChars = 8192;

/**
 * Text held as it comes. Appending to a string makes a rope: a node (and the delta's own string)
 * per delta, tens of bytes each, many times the text for one-token deltas. Here the deltas are
 * joined into flat pieces of about {@link pieceChars} units, so the memory is the text's.
 */
class HeldText {
  private readonly pieces: string[] = [];
  private tail: string[] = [];
  private tailChars = 0;
  length = 0;

  append(text: string): void {
    this.tail.push(text);
    this.tailChars += text.length;
    this.length += text.length;
    if (this.tailChars >= pieceChars) this.seal();
  }

  /** The whole text, kept as one piece from then on. */
  toString(): string {
    this.seal();
    if (this.pieces.length > 1) this.pieces.splice(0, this.pieces.length, this.pieces.join(""));
    return this.pieces[0] ?? "";
  }

  private seal(): void {
    if (this.tail.length === 0) return;
    this.pieces.push(this.tail.join(""));
    this.tail = [];
    this.tailChars = 0;
  }
}

/**
 * The start of `text` that fits in `room` code units, not ending between the two halves of a
 * surrogate pair; a copy, so that it does not keep the provider's whole string alive.
 */
function fitting(text: string, room: number): string {
  if (text.length <= room) return text;
  let end = Math.max(room, 0);
  const last = text.charCodeAt(end - 1);
  if (end > 0 && last >= 0xd800 && last <= 0xdbff) end -= 1;
  return Buffer.from(text.slice(0, end), "utf16le").toString("utf16le");
}

interface PartState {
  readonly type: "output_text" | "refusal";
  readonly text: HeldText;
}

interface MessageState {
  readonly kind: "message";
  readonly id: string;
  readonly outputIndex: number;
  /** Finished parts, then the open one. */
  readonly parts: PartState[];
  /** Set when its `response.output_item.done` is emitted. */
  status?: ItemStatus;
}

interface CallState {
  readonly kind: "function_call";
  readonly id: string;
  readonly outputIndex: number;
  readonly callId: string;
  name: string;
  readonly arguments: HeldText;
  /** Arguments of it were not relayed (the answer was cut at the held bound). */
  cut: boolean;
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
 *
 * What it holds (the module doc says why): each item's text, arguments, name and call id, within
 * {@link maxHeldChars} and {@link maxHeldParts}; the usage as its figures, the finish reason only
 * as the status it makes, the model's name and creation time, counters. Once a bound would be
 * passed the answer is cut (`cut`): what fits of that delta is relayed, nothing of the answer
 * after it.
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
  /** The finish reasons that make the response incomplete; any other is `undefined`. */
  private finishReason: "length" | "content_filter" | undefined;
  private usage: Usage | null = null;
  /** Code units of the provider's strings held, and items and parts held. */
  private heldChars = 0;
  private heldParts = 0;
  /** The answer passed a bound: nothing more of it is relayed, and it ends incomplete. */
  private cut = false;

  constructor(ctx: { readonly requestId: string; readonly model: string }) {
    this.id = responseId(ctx.requestId);
    this.tail = idTail(ctx.requestId);
    this.model = ctx.model;
  }

  get held(): Held {
    return { chars: this.heldChars, parts: this.heldParts };
  }

  chunk(chunk: unknown): DialectEvent[] {
    if (this.ended || !isObject(chunk)) return [];
    const events: DialectEvent[] = [];
    this.start(events, chunk);
    if (isObject(chunk["usage"])) this.usage = usageOf(chunk["usage"], undefined);
    const choices = Array.isArray(chunk["choices"]) ? (chunk["choices"] as unknown[]) : [];
    // The canonical request asks for one choice; any other is not this answer's.
    const choice = choices.find((c) => isObject(c) && (c["index"] ?? 0) === 0);
    if (!isObject(choice)) return events;
    const reason = choice["finish_reason"];
    if (reason !== undefined && reason !== null) {
      this.finishReason = reason === "length" || reason === "content_filter" ? reason : undefined;
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
    const { status, incomplete_details } = this.cut
      ? statusOf("length")
      : statusOf(this.finishReason);
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
      usage: this.usage ?? usageOf(undefined, charge),
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
    const model = chunk?.["model"];
    // The provider's name for the model, when the request named none (and it fits the bound).
    if (this.model === "" && typeof model === "string" && model.length <= maxHeldChars) {
      this.model = model;
      this.heldChars += model.length;
    }
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

  /** Room for `parts` more items or parts: else the answer is cut here. */
  private roomFor(parts: number): boolean {
    if (this.heldParts + parts <= maxHeldParts) return true;
    this.cut = true;
    return false;
  }

  /** What of `text` is held and relayed: all of it, or what fits (the answer is then cut). */
  private hold(text: string): string {
    const kept = fitting(text, maxHeldChars - this.heldChars);
    if (kept.length < text.length) this.cut = true;
    this.heldChars += kept.length;
    return kept;
  }

  private openMessage(events: DialectEvent[]): MessageState {
    const message: MessageState = {
      kind: "message",
      id: `msg_${this.tail}_${this.items.length}`,
      outputIndex: this.items.length,
      parts: [],
    };
    this.items.push(message);
    this.heldParts += 1;
    this.message = message;
    this.emit(events, "response.output_item.added", {
      output_index: message.outputIndex,
      item: messageItem(message.id, "in_progress", []),
    });
    return message;
  }

  /** Text (or refusal text) for the open message, opening the message or a part as needed. */
  private text(events: DialectEvent[], type: "output_text" | "refusal", delta: string): void {
    if (this.cut) return;
    let part = this.message?.parts.at(-1);
    const opens = (this.message === undefined ? 1 : 0) + (part?.type === type ? 0 : 1);
    if (!this.roomFor(opens)) return;
    const relayed = this.hold(delta);
    if (relayed === "") return;
    const message = this.message ?? this.openMessage(events);
    if (part?.type !== type) {
      if (part !== undefined) this.closePart(events, message, message.parts.length - 1);
      part = { type, text: new HeldText() };
      message.parts.push(part);
      this.heldParts += 1;
      this.emit(events, "response.content_part.added", {
        item_id: message.id,
        output_index: message.outputIndex,
        content_index: message.parts.length - 1,
        part: type === "output_text" ? textPart("") : refusalPart(""),
      });
    }
    part.text.append(relayed);
    const where = {
      item_id: message.id,
      output_index: message.outputIndex,
      content_index: message.parts.length - 1,
    };
    if (type === "output_text") {
      this.emit(events, "response.output_text.delta", { ...where, delta: relayed, logprobs: [] });
    } else {
      this.emit(events, "response.refusal.delta", { ...where, delta: relayed });
    }
  }

  private closePart(events: DialectEvent[], message: MessageState, index: number): void {
    const part = message.parts[index];
    if (part === undefined) return;
    const where = { item_id: message.id, output_index: message.outputIndex, content_index: index };
    const text = part.text.toString();
    if (part.type === "output_text") {
      this.emit(events, "response.output_text.done", { ...where, text, logprobs: [] });
    } else {
      this.emit(events, "response.refusal.done", { ...where, refusal: text });
    }
    this.emit(events, "response.content_part.done", { ...where, part: partView(part) });
  }

  private toolCall(events: DialectEvent[], delta: Json): void {
    if (this.cut) return;
    const index = typeof delta["index"] === "number" ? delta["index"] : 0;
    const fn = isObject(delta["function"]) ? delta["function"] : {};
    const name = typeof fn["name"] === "string" ? fn["name"] : "";
    const args = typeof fn["arguments"] === "string" ? fn["arguments"] : "";
    let call = this.calls.get(index);
    if (call === undefined) {
      const id = typeof delta["id"] === "string" ? delta["id"] : undefined;
      // A call is relayed with its name and id whole, or not at all.
      const chars = name.length + (id?.length ?? 0);
      if (!this.roomFor(1)) return;
      if (this.heldChars + chars > maxHeldChars) {
        this.cut = true;
        return;
      }
      this.heldChars += chars;
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
        callId: id ?? `call_${this.tail}_${outputIndex}`,
        name,
        arguments: new HeldText(),
        cut: false,
      };
      this.calls.set(index, call);
      this.items.push(call);
      this.heldParts += 1;
      this.emit(events, "response.output_item.added", {
        output_index: outputIndex,
        item: functionCallItem(call.id, call.callId, call.name, "", "in_progress"),
      });
    } else if (call.name === "" && name !== "") {
      // The name comes whole (OpenAI sends it on a call's first delta); some providers repeat it
      // on every delta, so a later one is kept only when the first had none.
      if (this.heldChars + name.length > maxHeldChars) {
        this.cut = true;
        return;
      }
      this.heldChars += name.length;
      call.name = name;
    }
    if (args !== "") {
      const relayed = this.hold(args);
      if (this.cut) call.cut = true;
      if (relayed === "") return;
      call.arguments.append(relayed);
      this.emit(events, "response.function_call_arguments.delta", {
        item_id: call.id,
        output_index: call.outputIndex,
        delta: relayed,
      });
    }
  }

  private closeItem(events: DialectEvent[], item: ItemState, status: ItemStatus): void {
    if (item.status !== undefined) return;
    // A call is complete once its arguments are; only the answer around it may be cut short.
    item.status = item.kind === "message" ? status : item.cut ? "incomplete" : "completed";
    if (item.kind === "message") {
      if (item.parts.length === 0) {
        item.parts.push({ type: "output_text", text: new HeldText() });
        this.heldParts += 1;
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
        arguments: item.arguments.toString(),
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
    return functionCallItem(item.id, item.callId, item.name, item.arguments.toString(), itemStatus);
  }
}

function partView(part: PartState): Json {
  const text = part.text.toString();
  return part.type === "output_text" ? textPart(text) : refusalPart(text);
}

function createStream(ctx: {
  readonly requestId: string;
  readonly model: string;
}): StreamTranslator {
  return new ResponsesStream(ctx);
}

/** What a stream of this dialect holds (its bound is tested with it). */
export function heldBy(stream: StreamTranslator): Held {
  if (!(stream instanceof ResponsesStream)) throw new TypeError("not a Responses stream");
  return stream.held;
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
