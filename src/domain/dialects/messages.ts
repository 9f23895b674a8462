import type { Static } from "@sinclair/typebox";
import { MessagesRequest } from "../../schema/messages.js";
import { compileBody } from "../../schema/validate.js";
import { GatewayError, type ErrorKind } from "../errors.js";
import type { Dialect, DialectEvent, GatewayCharge, StreamTranslator } from "./types.js";

/**
 * The Anthropic Messages dialect (`POST /v1/messages`, DESIGN.md section 9): a Messages request
 * becomes the canonical chat completion request, and the canonical answer (a chat.completion, or
 * its chat.completion.chunk stream) becomes a Messages answer (a `message`, or the named SSE
 * events `message_start` ... `message_stop`). Pure: no I/O, no clock, no randomness; ids derive
 * from the gateway's request id.
 *
 * Decisions where the two APIs differ (each one visible to a client, so written down here):
 * - `top_k` is dropped: chat completions has no such parameter (OpenAI refuses it, so passing it
 *   on would fail at some providers); it is a sampling hint that changes neither the answer's
 *   shape nor its price, and Anthropic itself calls it "for advanced use cases only".
 * - `thinking` is refused unless `{"type": "disabled"}`: the providers answer chat completions,
 *   which have no thinking blocks, signatures or budget; a client that asked for thinking would
 *   get none, and could not send the blocks back. Thinking blocks in assistant messages are
 *   refused for the same reason; reasoning deltas a provider streams are not relayed.
 * - `metadata` is dropped, except `metadata.user_id`, which becomes `user`; `service_tier`
 *   (Anthropic's capacity) is dropped. Other fields Anthropic knows (`container`, `mcp_servers`,
 *   `output_config`...) and unknown fields are refused, naming the field, as Anthropic does.
 * - The gateway's own request fields `offer` (pin) and `provider` (preferences) pass through to
 *   the canonical request, which validates them.
 * - `max_tokens` stays `max_tokens` on the chat request: the name more OpenAI-compatible
 *   servers know, and the gateway's quote reads either.
 * - Usage in Anthropic's sense: `input_tokens` excludes the cache reads, so `input_tokens +
 *   cache_read_input_tokens` is the provider's `prompt_tokens` (`x_gateway` keeps the gateway's
 *   own counts, as billed); reasoning tokens, when reported, become
 *   `output_tokens_details.thinking_tokens` (still counted in `output_tokens`).
 * - A streamed answer's `message_start` says `input_tokens: 0`: the count is known only from the
 *   provider's last chunk; `message_delta` carries it (the SDKs take it from there).
 * - `finish_reason` -> `stop_reason`: `length` -> `max_tokens`, `tool_calls` -> `tool_use` (also
 *   when a provider says `stop` but called tools), `content_filter` -> `refusal`, else
 *   `end_turn`; `stop_sequence` when the provider names the stop string it met (vLLM's
 *   `stop_reason` on the choice), since chat completions otherwise does not say.
 * - `tool_result` with `is_error: true` becomes a tool message whose content starts with
 *   `Error: `: chat completions has no error flag, and the model should still learn it failed.
 * - What a stream holds (docs/decisions.md, "Client dialects"): no text and no arguments. Nothing
 *   of the answer is sent again at its end (`content_block_stop`, `message_delta` and
 *   `message_stop` carry none; the official SDK builds the message from the deltas alone, by
 *   block index), so each delta is relayed as it comes and let go. Per tool call the stream keeps
 *   its block index, for a provider's later argument deltas to that call; a call whose name has
 *   not come keeps its id and arguments, all such calls at most {@link maxPendingChars} together
 *   (past it, the call that passed it starts its block with an empty name, as at the end). At most {@link maxToolCalls} calls: one more cuts the
 *   answer as the output limit does (nothing of it after is relayed; `stop_reason` is
 *   `max_tokens`). The usage is held as its figures, the finish reason as one of those that
 *   matter, the stop string as the provider named it.
 */

type JsonObject = Record<string, unknown>;

function invalid(message: string): never {
  throw new GatewayError("invalid_request", message);
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

// ---------------------------------------------------------------- request

type Request = Static<typeof MessagesRequest>;
type Message = Request["messages"][number];
type ClientTool = NonNullable<Request["tools"]>[number];
type ImageSource = Extract<
  Extract<Message, { role: "user" }>["content"][number],
  { type: "image" }
>["source"];

/**
 * The request's shape, refusals included, is the schema's (src/schema/messages.ts): unknown
 * members, server tools, thinking and a system role are refused by the schema, each with a message
 * that says why (`x-error-message`), not by a check before it, so the document states every
 * refusal and the one validator cannot disagree with it. What follows trusts the typed value and
 * checks only what spans members: each tool_use answered by the next message, tool names and
 * tool_use ids unique, `tool_choice` naming a declared tool.
 */
const checkRequest = compileBody(MessagesRequest);

function toCanonical(body: unknown): { chat: JsonObject; stream: boolean } {
  const request = checkRequest(body);
  const messages: JsonObject[] = [];
  if (request.system != null) {
    const text = textOf(request.system);
    if (text.length > 0) messages.push({ role: "system", content: text });
  }
  convertMessages(request.messages, messages);

  const chat: JsonObject = { model: request.model, messages, max_tokens: request.max_tokens };
  if (request.stop_sequences != null && request.stop_sequences.length > 0) {
    chat["stop"] = request.stop_sequences;
  }
  if (request.temperature != null) chat["temperature"] = request.temperature;
  if (request.top_p != null) chat["top_p"] = request.top_p;

  const tools = request.tools == null ? undefined : convertTools(request.tools);
  if (tools !== undefined) chat["tools"] = tools;
  if (request.tool_choice != null) convertToolChoice(request.tool_choice, tools, chat);

  const user = request.metadata?.user_id;
  if (user != null) chat["user"] = user;

  const stream = request.stream === true;
  if (stream) {
    chat["stream"] = true;
    chat["stream_options"] = { include_usage: true };
  }
  if (request.offer != null) chat["offer"] = request.offer;
  if (request.provider != null) chat["provider"] = request.provider;
  return { chat, stream };
}

/** `system` or a tool result's `content`: a string, or text blocks (joined by LF). */
function textOf(value: string | readonly { text: string }[]): string {
  return typeof value === "string" ? value : value.map((block) => block.text).join("\n");
}

function convertMessages(messages: readonly Message[], out: JsonObject[]): void {
  // The tool_use ids of the previous assistant message: the next message must answer each.
  let awaiting: Set<string> | undefined;
  let awaitingPath = "";
  messages.forEach((message, i) => {
    const path = `messages[${i}]`;
    if (message.role === "user") {
      userMessage(message.content, path, awaiting, awaitingPath, out);
      awaiting = undefined;
    } else {
      if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
      awaiting = assistantMessage(message.content, path, out);
      awaitingPath = path;
    }
  });
  if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
}

function unanswered(ids: Set<string>, path: string): never {
  const [id] = ids;
  invalid(
    `tool_use '${id}' in '${path}' has no tool_result: the next message must be a user ` +
      "message with a tool_result block for each tool_use",
  );
}

/** Tool results become `tool` messages (first, answering the assistant's calls), the rest one user message. */
function userMessage(
  content: Extract<Message, { role: "user" }>["content"],
  path: string,
  awaiting: Set<string> | undefined,
  awaitingPath: string,
  out: JsonObject[],
): void {
  if (typeof content === "string") {
    if (awaiting !== undefined) unanswered(awaiting, awaitingPath);
    out.push({ role: "user", content });
    return;
  }
  const parts: JsonObject[] = [];
  const answered = new Set<string>();
  content.forEach((block, j) => {
    if (block.type === "text") {
      parts.push({ type: "text", text: block.text });
    } else if (block.type === "image") {
      parts.push({ type: "image_url", image_url: { url: imageUrl(block.source) } });
    } else {
      const id = block.tool_use_id;
      if (awaiting === undefined || !awaiting.has(id) || answered.has(id)) {
        invalid(
          `'${path}.content[${j}]': tool_result '${id}' answers no tool_use of the previous assistant message`,
        );
      }
      answered.add(id);
      const text = block.content == null ? "" : textOf(block.content);
      out.push({
        role: "tool",
        tool_call_id: id,
        content: block.is_error === true ? `Error: ${text}` : text,
      });
    }
  });
  if (awaiting !== undefined) {
    for (const id of awaiting) if (!answered.has(id)) unanswered(new Set([id]), awaitingPath);
  }
  // Tool results only: no user message (the schema refuses an empty content array).
  if (parts.length === 0) return;
  const only = parts[0];
  out.push({
    role: "user",
    content: parts.length === 1 && only?.["type"] === "text" ? only["text"] : parts,
  });
}

/** An image block's source as a URL: a `data:` URL for base64 data, or the URL itself. */
function imageUrl(source: ImageSource): string {
  return source.type === "base64" ? `data:${source.media_type};base64,${source.data}` : source.url;
}

/** Text blocks become the content, tool_use blocks its tool calls; returns the tool_use ids. */
function assistantMessage(
  content: Extract<Message, { role: "assistant" }>["content"],
  path: string,
  out: JsonObject[],
): Set<string> | undefined {
  if (typeof content === "string") {
    out.push({ role: "assistant", content });
    return undefined;
  }
  const texts: string[] = [];
  const calls: JsonObject[] = [];
  const ids = new Set<string>();
  content.forEach((block, j) => {
    if (block.type === "text") {
      texts.push(block.text);
      return;
    }
    const { id, name, input } = block;
    if (ids.has(id)) invalid(`'${path}.content[${j}].id': tool_use id '${id}' is used twice`);
    ids.add(id);
    calls.push({ id, type: "function", function: { name, arguments: JSON.stringify(input) } });
  });
  const message: JsonObject = {
    role: "assistant",
    content: texts.length === 0 && calls.length > 0 ? null : texts.join("\n"),
  };
  if (calls.length > 0) message["tool_calls"] = calls;
  out.push(message);
  return ids.size > 0 ? ids : undefined;
}

function convertTools(tools: readonly ClientTool[]): JsonObject[] {
  const names = new Set<string>();
  return tools.map((tool, i) => {
    if (names.has(tool.name)) invalid(`'tools[${i}].name': tool '${tool.name}' is defined twice`);
    names.add(tool.name);
    const fn: JsonObject = { name: tool.name };
    if (tool.description != null) fn["description"] = tool.description;
    fn["parameters"] = tool.input_schema;
    if (tool.strict != null) fn["strict"] = tool.strict;
    return { type: "function", function: fn };
  });
}

function convertToolChoice(
  choice: NonNullable<Request["tool_choice"]>,
  tools: JsonObject[] | undefined,
  chat: JsonObject,
): void {
  const hasTools = tools !== undefined && tools.length > 0;
  if (choice.type === "tool") {
    if (!hasTools) invalid("'tool_choice' of type 'tool' needs 'tools'");
    const name = choice.name;
    if (!tools.some((t) => (t["function"] as JsonObject)["name"] === name)) {
      invalid(`'tool_choice.name': no tool named '${name}' in 'tools'`);
    }
    chat["tool_choice"] = { type: "function", function: { name } };
  } else if (choice.type === "any") {
    if (!hasTools) invalid("'tool_choice' of type 'any' needs 'tools'");
    chat["tool_choice"] = "required";
  } else {
    if (!hasTools) return;
    chat["tool_choice"] = choice.type;
  }
  if (choice.disable_parallel_tool_use === true && choice.type !== "none") {
    chat["parallel_tool_calls"] = false;
  }
}

// ---------------------------------------------------------------- answers

/** `msg_` and the request id's hex (request ids are 0x-prefixed hex). */
function messageId(requestId: string): string {
  return `msg_${requestId.replace(/^0x/i, "")}`;
}

/** A tool_use id for a tool call the provider gave none. */
function toolUseId(requestId: string, index: number): string {
  return `toolu_${requestId.replace(/^0x/i, "").slice(0, 24)}_${index}`;
}

type StopReason = "end_turn" | "max_tokens" | "stop_sequence" | "tool_use" | "refusal";

function stopOf(
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

function count(value: unknown): number | undefined {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? value : undefined;
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

/** The figures of a chat usage object a Messages usage is made of (held by a stream, not the object). */
interface Claim {
  readonly prompt: number | undefined;
  readonly completion: number | undefined;
  /** Cached prompt tokens as reported (0 when none). */
  readonly cached: number;
  readonly reasoning: number | undefined;
}

function claimOf(usage: unknown): Claim {
  const u = isObject(usage) ? usage : {};
  const details = u["prompt_tokens_details"];
  const completion = u["completion_tokens_details"];
  return {
    prompt: count(u["prompt_tokens"]),
    completion: count(u["completion_tokens"]),
    cached: (isObject(details) && count(details["cached_tokens"])) || 0,
    reasoning: isObject(completion) ? count(completion["reasoning_tokens"]) : undefined,
  };
}

/** Anthropic usage from a chat usage object's figures, else from the charge's counts. */
function usageOf(claim: Claim, charge: GatewayCharge): Usage {
  const prompt = claim.prompt ?? chargeCount(charge.input_tokens);
  const output = claim.completion ?? chargeCount(charge.output_tokens);
  // A detail above its total is the provider's error: 0, as the record keeps it (metering).
  const cached = claim.cached <= prompt ? claim.cached : 0;
  const thinking = claim.reasoning;
  const reasoning = thinking === undefined || thinking <= output ? thinking : 0;
  return {
    input_tokens: prompt - cached,
    output_tokens: output,
    cache_read_input_tokens: cached,
    cache_creation_input_tokens: 0,
    ...(reasoning === undefined ? {} : { output_tokens_details: { thinking_tokens: reasoning } }),
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

function firstChoice(value: unknown): JsonObject | undefined {
  if (!isObject(value) || !Array.isArray(value["choices"])) return undefined;
  const choices = value["choices"] as unknown[];
  const choice = choices.find((c) => isObject(c) && c["index"] === 0) ?? choices[0];
  return isObject(choice) ? choice : undefined;
}

function fromCompletion(completion: unknown, charge: GatewayCharge): unknown {
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
    usage: usageOf(claimOf(isObject(completion) ? completion["usage"] : undefined), charge),
    x_gateway: charge,
  };
}

// ---------------------------------------------------------------- stream

/** The most tool calls one streamed answer holds (a block index each). */
export const maxToolCalls = 1024;

/**
 * The most code units held for the tool calls whose names have not come (their ids and
 * arguments: a block cannot start without its name), all together: past it, the call that passed
 * it starts its block with an empty name, as at the end of the answer.
 */
export const maxPendingChars = 64 * 1024;

/** What a stream holds: the provider's strings (UTF-16 code units), and tool calls. */
export interface Held {
  readonly chars: number;
  readonly toolCalls: number;
}

/** A tool call whose name has not come: its id and the arguments so far, and their length. */
interface WaitingCall {
  id: string | undefined;
  readonly pending: string[];
  chars: number;
}

/** The finish reasons {@link stopOf} tells apart; any other is `"other"`. */
const finishReasons = new Set(["length", "content_filter", "tool_calls", "function_call", "stop"]);

function named<T extends { readonly type: string }>(data: T): DialectEvent {
  return { event: data.type, data };
}

/**
 * One streamed answer. Content blocks are sequential, as Anthropic streams them: a block stops
 * when the next starts (text at the position it first came, each tool call after it in the
 * order the provider began them). A provider that interleaves the argument deltas of parallel
 * tool calls gets each delta sent to its own block's index even after that block stopped: the
 * SDKs assemble by index, and nothing is lost.
 *
 * What it holds (the module doc says why): no text and no arguments once relayed; per tool call
 * its block index (the calls whose names have not come: their ids and arguments, within
 * {@link maxPendingChars} together), at most {@link maxToolCalls} calls; the usage as its figures, the
 * finish reason, the stop string, the open block, counters. A tool call past the bound cuts the
 * answer: nothing of it after that is relayed, and it stops with `max_tokens`.
 */
class MessagesStream implements StreamTranslator {
  private started = false;
  private ended = false;
  private nextBlock = 0;
  /** The index of the block that is open, and whether it is text. */
  private open: { index: number; text: boolean } | undefined;
  /** Each tool call by its chat index: its block's index, or the call while its name is awaited. */
  private readonly tools = new Map<number, number | WaitingCall>();
  private finishReason: string | undefined;
  private stopString: string | undefined;
  private claim: Claim | undefined;
  /** The code units the waiting calls hold (see {@link maxPendingChars}). */
  private waitingChars = 0;
  /** A tool call passed the bound: nothing more of the answer is relayed. */
  private cut = false;

  constructor(
    private readonly requestId: string,
    private readonly model: string,
  ) {}

  get held(): Held {
    return {
      chars: this.waitingChars + (this.stopString?.length ?? 0),
      toolCalls: this.tools.size,
    };
  }

  chunk(chunk: unknown): DialectEvent[] {
    if (this.ended || !isObject(chunk)) return [];
    const events: DialectEvent[] = [];
    this.start(events, chunk["model"]);
    if (isObject(chunk["usage"])) this.claim = claimOf(chunk["usage"]);
    const choice = firstChoice(chunk);
    if (choice === undefined) return events;
    const delta = isObject(choice["delta"]) ? choice["delta"] : {};
    const text = delta["content"];
    if (typeof text === "string" && text.length > 0 && !this.cut) {
      if (this.open?.text !== true) this.startBlock(events, { type: "text", text: "" });
      events.push(
        named({
          type: "content_block_delta",
          index: this.nextBlock - 1,
          delta: { type: "text_delta", text },
        }),
      );
    }
    if (Array.isArray(delta["tool_calls"])) {
      (delta["tool_calls"] as unknown[]).forEach((call, position) => {
        if (isObject(call) && !this.cut) this.toolCall(events, call, position);
      });
    }
    const reason = choice["finish_reason"];
    if (typeof reason === "string")
      this.finishReason = finishReasons.has(reason) ? reason : "other";
    const stop = choice["stop_reason"];
    if (stop !== undefined) this.stopString = typeof stop === "string" ? stop : undefined;
    return events;
  }

  finish(charge: GatewayCharge): DialectEvent[] {
    if (this.ended) return [];
    const events: DialectEvent[] = [];
    this.start(events, undefined);
    // Tool calls whose name never came still become blocks, so their arguments are not lost.
    for (const [key, state] of this.tools) {
      if (typeof state !== "number") this.startTool(events, key, state, "");
    }
    this.stopOpen(events);
    this.ended = true;
    events.push(
      named({
        type: "message_delta",
        delta: this.cut
          ? { stop_reason: "max_tokens", stop_sequence: null }
          : stopOf(this.finishReason, this.tools.size > 0, this.stopString),
        usage: usageOf(this.claim ?? claimOf(undefined), charge),
      }),
      named({ type: "message_stop", x_gateway: charge }),
    );
    return events;
  }

  fail(error: GatewayError): DialectEvent[] {
    if (this.ended) return [];
    this.ended = true;
    return [{ event: "error", data: errorBody(error) }];
  }

  /** `message_start`, with the provider's model name when its first chunk gives one. */
  private start(events: DialectEvent[], model: unknown): void {
    if (this.started) return;
    this.started = true;
    events.push(
      named({
        type: "message_start",
        message: {
          id: messageId(this.requestId),
          type: "message",
          role: "assistant",
          model: typeof model === "string" && model.length > 0 ? model : this.model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: {
            input_tokens: 0,
            output_tokens: 0,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
          },
        },
      }),
    );
  }

  private startBlock(events: DialectEvent[], block: JsonObject): number {
    this.stopOpen(events);
    const index = this.nextBlock++;
    this.open = { index, text: block["type"] === "text" };
    events.push(named({ type: "content_block_start", index, content_block: block }));
    return index;
  }

  private stopOpen(events: DialectEvent[]): void {
    if (this.open === undefined) return;
    events.push(named({ type: "content_block_stop", index: this.open.index }));
    this.open = undefined;
  }

  private toolCall(events: DialectEvent[], call: JsonObject, position: number): void {
    const key = typeof call["index"] === "number" ? call["index"] : position;
    const fn = isObject(call["function"]) ? call["function"] : {};
    const args = typeof fn["arguments"] === "string" ? fn["arguments"] : "";
    let state = this.tools.get(key);
    if (typeof state === "number") {
      if (args.length > 0) this.inputDelta(events, state, args);
      return;
    }
    if (state === undefined) {
      if (this.tools.size >= maxToolCalls) {
        this.cut = true;
        return;
      }
      state = { id: undefined, pending: [], chars: 0 };
      this.tools.set(key, state);
    }
    const id = call["id"];
    if (state.id === undefined && typeof id === "string" && id.length > 0) {
      state.id = id;
      state.chars += id.length;
      this.waitingChars += id.length;
    }
    if (args.length > 0) {
      state.pending.push(args);
      state.chars += args.length;
      this.waitingChars += args.length;
    }
    const name = typeof fn["name"] === "string" && fn["name"].length > 0 ? fn["name"] : undefined;
    if (name !== undefined || this.waitingChars > maxPendingChars) {
      this.startTool(events, key, state, name ?? "");
    }
  }

  /** The call's block starts (with what came of its arguments); it is held as its index. */
  private startTool(events: DialectEvent[], key: number, call: WaitingCall, name: string): void {
    const block = this.startBlock(events, {
      type: "tool_use",
      id: call.id ?? toolUseId(this.requestId, this.nextBlock),
      name,
      input: {},
    });
    this.tools.set(key, block);
    this.waitingChars -= call.chars;
    if (call.pending.length > 0) this.inputDelta(events, block, call.pending.join(""));
  }

  private inputDelta(events: DialectEvent[], index: number, partial: string): void {
    events.push(
      named({
        type: "content_block_delta",
        index,
        delta: { type: "input_json_delta", partial_json: partial },
      }),
    );
  }
}

/** What a stream of this dialect holds (its bound is tested with it). */
export function heldBy(stream: StreamTranslator): Held {
  if (!(stream instanceof MessagesStream)) throw new TypeError("not a Messages stream");
  return stream.held;
}

// ---------------------------------------------------------------- errors

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
function errorBody(error: GatewayError): unknown {
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

/** The Anthropic Messages dialect. */
export const messagesDialect: Dialect = {
  name: "messages",
  toCanonical,
  fromCompletion,
  createStream: (ctx) => new MessagesStream(ctx.requestId, ctx.model),
  errorBody,
};
