import { checkJsonBounds, type JsonBounds } from "../chat-request.js";
import type { ChatEvent, ChatChunk, ChatCompleted, UsageFigures } from "../chat/types.js";
import { GatewayError } from "../errors.js";
import { messagesDialect } from "./messages.js";
import { responsesDialect } from "./responses.js";
import type { Dialect, GatewayCharge, GatewayFigures, StreamTranslator } from "./types.js";

/**
 * The translator stage (DESIGN.md section 9): a client's dialect in, the canonical chat
 * completion through routing, metering and settlement, the dialect's answer out. Quotes,
 * permits, routing, metering and records see only the canonical request.
 */

export type DialectName = Dialect["name"];

export const dialects: Readonly<Record<DialectName, Dialect>> = {
  responses: responsesDialect,
  messages: messagesDialect,
};

/** A chunk of a dialect's answer: one event of its stream (named), or its whole JSON answer. */
export interface DialectChunk extends ChatChunk {
  /** The SSE event name (`response.output_text.delta`, `message_stop`, ...). */
  readonly event?: string;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/**
 * A dialect's request body -> the canonical chat completion body (UTF-8 JSON). The same bounds
 * as a chat body apply before anything is parsed; `invalid_json` / `invalid_request` otherwise.
 */
export function canonicalBody(
  dialect: Dialect,
  raw: Uint8Array,
  bounds: { maxBytes: number } & JsonBounds,
): { readonly body: Uint8Array; readonly model: string } {
  if (raw.byteLength > bounds.maxBytes) {
    throw new GatewayError(
      "request_too_large",
      `the request body is larger than ${bounds.maxBytes} bytes`,
    );
  }
  checkJsonBounds(raw, bounds);
  let parsed: unknown;
  try {
    parsed = JSON.parse(utf8.decode(raw));
  } catch (err) {
    const detail = err instanceof Error ? `: ${err.message.slice(0, 200)}` : "";
    throw new GatewayError("invalid_json", `the request body is not valid JSON${detail}`);
  }
  const { chat } = dialect.toCanonical(parsed);
  const model = typeof chat["model"] === "string" ? chat["model"] : "";
  return { body: encoder.encode(JSON.stringify(chat)), model };
}

/** The `x_gateway` object of a completed answer. */
export function chargeOf(done: ChatCompleted): GatewayCharge {
  return {
    request_id: done.requestId,
    quote_id: done.quoteId,
    offer_id: done.offerId,
    tariff_version: done.tariffVersion.toString(),
    input_tokens: done.inputTokens.toString(),
    output_tokens: done.outputTokens.toString(),
    cached_input_tokens: (done.cachedInputTokens ?? 0n).toString(),
    reasoning_tokens: (done.reasoningTokens ?? 0n).toString(),
    credits_charged: done.creditsCharged.toString(),
    billing: done.billing,
    usage_claimed: figuresOf(done.claimed),
    usage_counted: figuresOf(done.counted),
    usage_source: done.usageFromProvider ? "provider" : "gateway",
  };
}

function figuresOf(figures: UsageFigures | undefined): GatewayFigures | null {
  if (figures === undefined) return null;
  return {
    input_tokens: figures.inputTokens.toString(),
    output_tokens: figures.outputTokens.toString(),
    cached_input_tokens: figures.cachedInputTokens.toString(),
    reasoning_tokens: figures.reasoningTokens.toString(),
  };
}

function parseChunk(data: Uint8Array): unknown {
  try {
    return JSON.parse(utf8.decode(data));
  } catch {
    return undefined;
  }
}

/**
 * The canonical events of one answer -> the dialect's: `started` and `completed` as they are
 * (the facade's headers and the record), each provider chunk as the dialect events it makes,
 * the dialect's closing events (the last with `x_gateway`) just before `completed`; a JSON
 * answer becomes the dialect's JSON answer, with `x_gateway`, just before `completed`.
 * Metering is the canonical chunk's: a translated event carries what its chunk carried.
 */
export async function* translateEvents(
  dialect: Dialect,
  model: string,
  events: AsyncIterable<ChatEvent>,
): AsyncGenerator<ChatEvent | DialectChunk, void, undefined> {
  let stream: StreamTranslator | undefined;
  let json: ChatChunk | undefined;
  let last: ChatChunk | undefined;
  for await (const event of events) {
    switch (event.type) {
      case "started":
        if (event.stream) stream = dialect.createStream({ requestId: event.requestId, model });
        yield event;
        break;
      case "chunk": {
        last = event;
        if (stream === undefined) {
          json = event;
          break;
        }
        const chunk = parseChunk(event.data);
        if (chunk === undefined) break; // not an event of the answer (metered as it came)
        for (const out of stream.chunk(chunk)) yield dialectChunk(out, event);
        break;
      }
      case "completed": {
        const charge = chargeOf(event);
        if (stream !== undefined) {
          for (const out of stream.finish(charge)) yield dialectChunk(out, last);
        } else {
          const completion = json === undefined ? undefined : parseChunk(json.data);
          yield dialectChunk(
            { data: dialect.fromCompletion(completion ?? {}, charge) },
            json ?? last,
          );
        }
        yield event;
        break;
      }
      case "failed":
        yield event;
        break;
    }
  }
}

const noMetering = { inputTokens: 0n, outputTokens: 0n, credits: 0n } as const;

function dialectChunk(
  out: { readonly event?: string; readonly data: unknown },
  from: ChatChunk | undefined,
): DialectChunk {
  return {
    type: "chunk",
    data: encoder.encode(JSON.stringify(out.data)),
    metering: from?.metering ?? noMetering,
    ...(out.event === undefined ? {} : { event: out.event }),
  };
}
