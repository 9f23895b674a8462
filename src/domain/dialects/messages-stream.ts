import type { GatewayError } from "../errors.js";
import { isObject, type JsonObject } from "./json.js";
import {
  errorBody,
  firstChoice,
  messageId,
  stopOf,
  toolUseId,
  usageOf,
} from "./messages-answer.js";
import type { DialectEvent, GatewayCharge, StreamTranslator } from "./types.js";

/**
 * The Messages dialect's stream translator: canonical chunks in, the named Messages events out,
 * within bounds (messages.ts says what a stream holds and why).
 */

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
        usage: usageOf(charge),
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

export function createStream(ctx: {
  readonly requestId: string;
  readonly model: string;
}): StreamTranslator {
  return new MessagesStream(ctx.requestId, ctx.model);
}
