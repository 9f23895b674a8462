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
 * `offer` and `provider`, pass through unchanged, as on the chat route.
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

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A field of an object; `null` counts as absent (the API marks optional fields nullable). */
function fieldOf(object: Json, key: string): unknown {
  const value = Object.hasOwn(object, key) ? object[key] : undefined;
  return value === null ? undefined : value;
}

const stateless =
  "this gateway's Responses API is stateless; send the whole conversation in 'input'";

/** Fields read below; any other top-level field is refused. */
const knownFields = new Set([
  "model",
  "input",
  "instructions",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "max_output_tokens",
  "temperature",
  "top_p",
  "text",
  "reasoning",
  "stream",
  "stream_options",
  "store",
  "user",
  "metadata",
  "include",
  "prompt_cache_key",
  "prompt_cache_retention",
  "safety_identifier",
  "service_tier",
  "truncation",
  "background",
  "previous_response_id",
  "conversation",
  "prompt",
  "top_logprobs",
  // The gateway's own, as on the chat route.
  "offer",
  "provider",
]);

/** Recognized fields that ask for something a stateless translator cannot give. */
const refusedFields: Record<string, string> = {
  previous_response_id: `'previous_response_id' is not supported: ${stateless}`,
  conversation: `'conversation' is not supported: ${stateless}`,
  prompt: "'prompt' (a stored prompt template) is not supported; send the text in 'input'",
  top_logprobs: "'top_logprobs' is not supported by this gateway's Responses API",
};

/**
 * Validates a Responses request and returns the canonical chat completion request. Shapes the
 * chat parser checks anyway (the model's string, numbers' ranges) are checked here too, so the
 * message names the Responses field, not its chat counterpart.
 */
function toCanonical(body: unknown): { chat: Json; stream: boolean } {
  if (!isObject(body)) invalid("the request body must be a JSON object");
  for (const key of Object.keys(body)) {
    if (!knownFields.has(key)) invalid(`'${key}' is not supported by this gateway's Responses API`);
    const refusal = refusedFields[key];
    if (refusal !== undefined && fieldOf(body, key) !== undefined) invalid(refusal);
  }
  const model = fieldOf(body, "model");
  if (typeof model !== "string" || model.length === 0) {
    invalid("'model' is required and must be a non-empty string");
  }
  const store = fieldOf(body, "store");
  if (store !== undefined && typeof store !== "boolean") invalid("'store' must be a boolean");
  if (store === true) {
    invalid(`'store: true' is not supported: ${stateless}; leave 'store' out or set it to false`);
  }
  const background = fieldOf(body, "background");
  if (background !== undefined && typeof background !== "boolean") {
    invalid("'background' must be a boolean");
  }
  if (background === true) invalid("'background: true' is not supported: answers are not stored");
  const truncation = fieldOf(body, "truncation");
  if (truncation !== undefined && truncation !== "disabled") {
    invalid("'truncation' must be \"disabled\" (the gateway does not truncate input)");
  }
  const stream = fieldOf(body, "stream");
  if (stream !== undefined && typeof stream !== "boolean") invalid("'stream' must be a boolean");
  for (const key of ["metadata", "stream_options"]) {
    const value = fieldOf(body, key);
    if (value !== undefined && !isObject(value)) invalid(`'${key}' must be an object`);
  }
  const include = fieldOf(body, "include");
  if (include !== undefined && !(Array.isArray(include) && include.every(isString))) {
    invalid("'include' must be an array of strings");
  }
  for (const key of [
    "user",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
  ]) {
    const value = fieldOf(body, key);
    if (value !== undefined && typeof value !== "string") invalid(`'${key}' must be a string`);
  }

  const messages: Json[] = [];
  const instructions = fieldOf(body, "instructions");
  if (instructions !== undefined) {
    if (typeof instructions !== "string") invalid("'instructions' must be a string");
    messages.push({ role: "system", content: instructions });
  }
  messages.push(...inputMessages(fieldOf(body, "input")));

  const chat: Json = { model, messages };
  const tools = fieldOf(body, "tools");
  if (tools !== undefined) {
    if (!Array.isArray(tools)) invalid("'tools' must be an array");
    chat["tools"] = tools.map(chatTool);
  }
  const toolChoice = fieldOf(body, "tool_choice");
  if (toolChoice !== undefined) chat["tool_choice"] = chatToolChoice(toolChoice);
  const parallel = fieldOf(body, "parallel_tool_calls");
  if (parallel !== undefined) {
    if (typeof parallel !== "boolean") invalid("'parallel_tool_calls' must be a boolean");
    chat["parallel_tool_calls"] = parallel;
  }
  const maxOutput = fieldOf(body, "max_output_tokens");
  if (maxOutput !== undefined) {
    if (typeof maxOutput !== "number" || !Number.isSafeInteger(maxOutput) || maxOutput < 1) {
      invalid("'max_output_tokens' must be an integer of at least 1");
    }
    chat["max_completion_tokens"] = maxOutput;
  }
  for (const key of ["temperature", "top_p"]) {
    const value = fieldOf(body, key);
    if (value === undefined) continue;
    if (typeof value !== "number" || !Number.isFinite(value)) invalid(`'${key}' must be a number`);
    chat[key] = value;
  }
  const text = fieldOf(body, "text");
  if (text !== undefined) Object.assign(chat, textConfig(text));
  const reasoning = fieldOf(body, "reasoning");
  if (reasoning !== undefined) {
    if (!isObject(reasoning)) invalid("'reasoning' must be an object");
    for (const key of Object.keys(reasoning)) {
      if (key !== "effort" && key !== "summary" && key !== "generate_summary") {
        invalid(`'reasoning.${key}' is not supported by this gateway's Responses API`);
      }
    }
    const effort = fieldOf(reasoning, "effort");
    if (effort !== undefined) {
      if (typeof effort !== "string") invalid("'reasoning.effort' must be a string");
      chat["reasoning_effort"] = effort;
    }
  }
  const user = fieldOf(body, "user");
  if (user !== undefined) chat["user"] = user;
  for (const key of ["offer", "provider"]) {
    if (Object.hasOwn(body, key)) chat[key] = body[key];
  }
  chat["stream"] = stream === true;
  // The closing `response.completed` carries usage: the provider must report it on the stream.
  if (stream === true) chat["stream_options"] = { include_usage: true };
  return { chat, stream: stream === true };
}

function isString(value: unknown): value is string {
  return typeof value === "string";
}

/** `input` -> chat messages. Function calls join the assistant message they follow. */
function inputMessages(input: unknown): Json[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  if (!Array.isArray(input) || input.length === 0) {
    invalid("'input' is required and must be a string or a non-empty array of input items");
  }
  const messages: Json[] = [];
  // The assistant message the next function_call item joins; any other item ends it.
  let assistant: Json | undefined;
  input.forEach((item: unknown, index) => {
    const at = `input[${index}]`;
    if (!isObject(item)) invalid(`'${at}' must be an object`);
    const type = fieldOf(item, "type") ?? "message";
    if (type === "message") {
      const message = inputMessage(item, at);
      messages.push(message);
      assistant = message["role"] === "assistant" ? message : undefined;
    } else if (type === "function_call") {
      const call = functionCall(item, at);
      if (assistant === undefined) {
        assistant = { role: "assistant", content: null };
        messages.push(assistant);
      }
      const calls = (assistant["tool_calls"] ??= []) as Json[];
      calls.push(call);
    } else if (type === "function_call_output") {
      messages.push(functionCallOutput(item, at));
      assistant = undefined;
    } else if (type === "reasoning") {
      // Another provider's opaque reasoning state: chat has no place for it (see the module doc).
    } else if (type === "item_reference") {
      invalid(`'${at}': an item_reference is not supported: ${stateless}`);
    } else {
      invalid(
        `'${at}.type' ${JSON.stringify(type)} is not supported by this gateway's Responses API`,
      );
    }
  });
  if (messages.length === 0) invalid("'input' holds no message");
  return messages;
}

const messageRoles = new Set(["user", "assistant", "system", "developer"]);

function inputMessage(item: Json, at: string): Json {
  const role = fieldOf(item, "role");
  if (typeof role !== "string" || !messageRoles.has(role)) {
    invalid(`'${at}.role' must be one of user, assistant, system, developer`);
  }
  const chatRole = role === "developer" ? "system" : role;
  const content = fieldOf(item, "content");
  if (typeof content === "string") return { role: chatRole, content };
  if (!Array.isArray(content)) {
    invalid(`'${at}.content' must be a string or an array of content parts`);
  }
  const parts: Json[] = [];
  const refusals: string[] = [];
  content.forEach((part: unknown, index) => {
    const partAt = `${at}.content[${index}]`;
    if (!isObject(part)) invalid(`'${partAt}' must be an object`);
    const type = fieldOf(part, "type");
    if (type === "input_text" || type === "output_text") {
      const text = fieldOf(part, "text");
      if (typeof text !== "string") invalid(`'${partAt}.text' must be a string`);
      parts.push({ type: "text", text });
    } else if (type === "refusal" && role === "assistant") {
      const refusal = fieldOf(part, "refusal");
      if (typeof refusal !== "string") invalid(`'${partAt}.refusal' must be a string`);
      refusals.push(refusal);
    } else if (type === "input_image" && role === "user") {
      parts.push(imagePart(part, partAt));
    } else {
      invalid(
        `'${partAt}.type' ${JSON.stringify(type)} is not supported in a ${role} message by this gateway's Responses API`,
      );
    }
  });
  const message: Json = { role: chatRole, content: chatContent(parts) };
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

function imagePart(part: Json, at: string): Json {
  if (fieldOf(part, "file_id") !== undefined) {
    invalid(`'${at}.file_id' is not supported (no files are stored); send 'image_url'`);
  }
  const url = fieldOf(part, "image_url");
  if (typeof url !== "string" || url.length === 0) {
    invalid(`'${at}.image_url' must be a URL or a data URL`);
  }
  const detail = fieldOf(part, "detail");
  // "original" has no chat counterpart: the provider's default.
  return {
    type: "image_url",
    image_url: typeof detail === "string" && imageDetails.has(detail) ? { url, detail } : { url },
  };
}

function requiredString(item: Json, key: string, at: string): string {
  const value = fieldOf(item, key);
  if (typeof value !== "string" || value.length === 0) {
    invalid(`'${at}.${key}' must be a non-empty string`);
  }
  return value;
}

function functionCall(item: Json, at: string): Json {
  const callId = requiredString(item, "call_id", at);
  const name = requiredString(item, "name", at);
  const args = fieldOf(item, "arguments");
  if (typeof args !== "string") invalid(`'${at}.arguments' must be a string`);
  return { id: callId, type: "function", function: { name, arguments: args } };
}

function functionCallOutput(item: Json, at: string): Json {
  const callId = requiredString(item, "call_id", at);
  const output = fieldOf(item, "output");
  if (typeof output === "string") return { role: "tool", tool_call_id: callId, content: output };
  if (!Array.isArray(output))
    invalid(`'${at}.output' must be a string or an array of content parts`);
  const texts = output.map((part: unknown, index) => {
    const partAt = `${at}.output[${index}]`;
    if (!isObject(part) || fieldOf(part, "type") !== "input_text") {
      invalid(`'${partAt}' must be an input_text part (other tool outputs are not supported)`);
    }
    const text = fieldOf(part, "text");
    if (typeof text !== "string") invalid(`'${partAt}.text' must be a string`);
    return { type: "text", text };
  });
  return { role: "tool", tool_call_id: callId, content: chatContent(texts) };
}

function chatTool(tool: unknown, index: number): Json {
  const at = `tools[${index}]`;
  if (!isObject(tool)) invalid(`'${at}' must be an object`);
  const type = fieldOf(tool, "type");
  if (type !== "function") {
    invalid(
      `'${at}.type' ${JSON.stringify(type)} is not supported: this gateway runs no built-in tools; declare a function tool`,
    );
  }
  const fn: Json = { name: requiredString(tool, "name", at) };
  const description = fieldOf(tool, "description");
  if (description !== undefined) {
    if (typeof description !== "string") invalid(`'${at}.description' must be a string`);
    fn["description"] = description;
  }
  const parameters = fieldOf(tool, "parameters");
  if (parameters !== undefined) {
    if (!isObject(parameters)) invalid(`'${at}.parameters' must be a JSON schema object`);
    fn["parameters"] = parameters;
  }
  const strict = fieldOf(tool, "strict");
  if (strict !== undefined) {
    if (typeof strict !== "boolean") invalid(`'${at}.strict' must be a boolean`);
    fn["strict"] = strict;
  }
  return { type: "function", function: fn };
}

function chatToolChoice(choice: unknown): unknown {
  if (choice === "auto" || choice === "none" || choice === "required") return choice;
  if (isObject(choice) && fieldOf(choice, "type") === "function") {
    return {
      type: "function",
      function: { name: requiredString(choice, "name", "tool_choice") },
    };
  }
  invalid(
    '\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "name": ...}',
  );
}

function textConfig(text: unknown): Json {
  if (!isObject(text)) invalid("'text' must be an object");
  const out: Json = {};
  for (const key of Object.keys(text)) {
    if (key !== "format" && key !== "verbosity") {
      invalid(`'text.${key}' is not supported by this gateway's Responses API`);
    }
  }
  const verbosity = fieldOf(text, "verbosity");
  if (verbosity !== undefined) {
    if (verbosity !== "low" && verbosity !== "medium" && verbosity !== "high") {
      invalid("'text.verbosity' must be low, medium or high");
    }
    out["verbosity"] = verbosity;
  }
  const format = fieldOf(text, "format");
  if (format === undefined) return out;
  if (!isObject(format)) invalid("'text.format' must be an object");
  const type = fieldOf(format, "type");
  if (type === "text") return out;
  if (type === "json_object") return { ...out, response_format: { type: "json_object" } };
  if (type !== "json_schema") {
    invalid("'text.format.type' must be text, json_object or json_schema");
  }
  const schema = fieldOf(format, "schema");
  if (!isObject(schema)) invalid("'text.format.schema' must be a JSON schema object");
  const jsonSchema: Json = { name: requiredString(format, "name", "text.format"), schema };
  const description = fieldOf(format, "description");
  if (description !== undefined) {
    if (typeof description !== "string") invalid("'text.format.description' must be a string");
    jsonSchema["description"] = description;
  }
  const strict = fieldOf(format, "strict");
  if (strict !== undefined) {
    if (typeof strict !== "boolean") invalid("'text.format.strict' must be a boolean");
    jsonSchema["strict"] = strict;
  }
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
