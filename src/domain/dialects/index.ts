import { checkJsonBounds, parseJsonText, type JsonBounds } from "../chat/request/index.js";
import { ForwardingSink } from "../chat/sink.js";
import type { AnswerController, AnswerSink } from "../chat/types.js";
import type { ChatChunk, ChatCompleted, ChatStarted, UsageFigures } from "../chat/types.js";
import { GatewayError } from "../errors.js";
import { budgetWarningText, type BudgetWarning } from "../permit-authorization/index.js";
import { messagesDialect } from "./messages.js";
import { responsesDialect } from "./responses.js";
import type {
  Dialect,
  GatewayBudgetWarning,
  GatewayCharge,
  GatewayFigures,
  StreamTranslator,
} from "./types.js";

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

/**
 * The `started` event of a dialect's stream: what it is, and the way to end this call's own
 * stream when it fails after it began (the dialect's error events from the translator that made
 * its other events, so that they go on from there: one `response.created`, sequence numbers that
 * keep increasing). Only the REST facade writes them; the RPC ends with its error status.
 */
export interface DialectStarted extends ChatStarted {
  readonly failure?: (error: GatewayError) => readonly DialectChunk[];
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
  const { chat } = dialect.toCanonical(parseJsonText(raw));
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
    ...(done.receipt === undefined ? {} : { receipt: done.receipt }),
    ...(done.budgetWarning === undefined
      ? {}
      : { budget_warning: budgetWarningOf(done.budgetWarning) }),
  };
}

/** `x_gateway.budget_warning` (issue 38): the view of ChatCompleted's `budget_warning`. */
function budgetWarningOf(w: BudgetWarning): GatewayBudgetWarning {
  return {
    code: "authorization_warn_threshold_reached",
    message: budgetWarningText(w),
    authorization_id: w.authorizationId,
    warn_at: w.warnAt.toString(),
    used: w.used.toString(),
    cap: w.cap.toString(),
    period: w.period,
    period_renews_at: w.renewsAt ?? null,
  };
}

/**
 * The order of `x_gateway`'s members in a chat completion stream's final chunk: its first
 * writer's (the RPC's ChatCompleted field order), kept so that those bytes do not change. The
 * members and their values are {@link chargeOf}'s.
 */
const chunkChargeOrder = [
  "request_id",
  "quote_id",
  "offer_id",
  "tariff_version",
  "input_tokens",
  "output_tokens",
  "credits_charged",
  "billing",
  "cached_input_tokens",
  "reasoning_tokens",
  "usage_claimed",
  "usage_counted",
  "usage_source",
  "receipt",
  "budget_warning",
] as const satisfies readonly (keyof GatewayCharge)[];

/** {@link chargeOf} in a chat completion stream's final chunk (its members' order). */
export function chunkChargeOf(done: ChatCompleted): GatewayCharge {
  const charge = chargeOf(done);
  const ordered: Record<string, unknown> = {};
  for (const key of chunkChargeOrder) if (key in charge) ordered[key] = charge[key];
  return ordered as unknown as GatewayCharge;
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
 * The canonical events of one answer -> the dialect's, pushed to `next` (sink.ts): `started`
 * and `completed` as they are (the facade's headers and the record), each provider chunk as
 * the dialect events it makes (fed the chunk the relay parsed, not parsed again; a replayed
 * chunk is parsed here), the dialect's closing events (the last with `x_gateway`) just before
 * `completed`; a JSON answer becomes the dialect's JSON answer, with `x_gateway`, just before
 * `completed`. Metering is the canonical chunk's: a translated event carries what its chunk
 * carried.
 */
export function translatingSink(dialect: Dialect, model: string, next: AnswerSink): AnswerSink {
  return new TranslatingSink(dialect, model, next);
}

class TranslatingSink extends ForwardingSink {
  private stream: StreamTranslator | undefined;
  private json: ChatChunk | undefined;
  private last: ChatChunk | undefined;

  constructor(
    private readonly dialect: Dialect,
    private readonly model: string,
    next: AnswerSink,
  ) {
    super(next);
  }

  override started(event: ChatStarted, controller: AnswerController): void | Promise<void> {
    if (!event.stream) return this.next.started(event, controller);
    const stream = this.dialect.createStream({ requestId: event.requestId, model: this.model });
    this.stream = stream;
    const started: DialectStarted = {
      ...event,
      failure: (error) => stream.fail(error).map((out) => dialectChunk(out, this.last)),
    };
    return this.next.started(started, controller);
  }

  override chunk(event: ChatChunk, parsed?: unknown): void {
    this.last = event;
    const stream = this.stream;
    if (stream === undefined) {
      this.json = event;
      return;
    }
    const chunk = parsed ?? parseChunk(event.data);
    if (chunk === undefined) return; // not an event of the answer (metered as it came)
    for (const out of stream.chunk(chunk)) this.next.chunk(dialectChunk(out, event));
  }

  override completed(event: ChatCompleted): void | Promise<void> {
    const charge = chargeOf(event);
    if (this.stream !== undefined) {
      for (const out of this.stream.finish(charge)) this.next.chunk(dialectChunk(out, this.last));
    } else {
      const completion = this.json === undefined ? undefined : parseChunk(this.json.data);
      this.next.chunk(
        dialectChunk(
          { data: this.dialect.fromCompletion(completion ?? {}, charge) },
          this.json ?? this.last,
        ),
      );
    }
    return this.next.completed(event);
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
