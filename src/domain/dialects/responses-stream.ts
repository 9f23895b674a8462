import type { GatewayError } from "../errors.js";
import { isObject, type JsonObject as Json } from "./json.js";
import {
  createdOf,
  functionCallItem,
  idTail,
  messageItem,
  publicMessage,
  refusalPart,
  responseId,
  responseObject,
  statusOf,
  textPart,
  usageOf,
  type ItemStatus,
} from "./responses-answer.js";
import { fitting, HeldText } from "./responses-held-text.js";
import type { DialectEvent, GatewayCharge, StreamTranslator } from "./types.js";

/**
 * The Responses dialect's stream translator: canonical chunks in, the Responses events out, within
 * bounds (responses.ts says what a stream holds and why).
 */

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
      usage: usageOf(charge),
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

export function createStream(ctx: {
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
