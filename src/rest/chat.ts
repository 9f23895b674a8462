import { Dialect } from "../../gen/gateway/v1/inference_pb.js";
import type { Dialect as DialectTranslator } from "../domain/dialects/types.js";
import type { ChatSink } from "../domain/chat/sink.js";
import type { ChatChunk, ChatCompleted, ChatStarted } from "../domain/chat/types.js";
import type { InProcessCallOptions } from "../connect/in-process-transport.js";
import { completedMessage } from "../connect/inference-messages.js";
import { GatewayError } from "../domain/errors.js";
import type { NodeRequest, NodeResponse } from "./body.js";
import { toHttpError } from "./errors.js";
import { xGatewayResource } from "./views/chat.js";

const eventStart = Buffer.from("data: ");
const namedStart = Buffer.from("event: ");
const eventEnd = Buffer.from("\n\n");
const lineEnd = Buffer.from("\n");
const lf = 0x0a;
const cr = 0x0d;
/** Largest single write of a JSON answer. */
const jsonPieceBytes = 64 * 1024;

/**
 * The SSE events of one answer. Events that arrive in the same turn of the event loop (one
 * upstream read usually carries many) leave in one write of their bytes as they came, framed: a
 * write per event costs an HTTP chunk and a syscall per event, and turning the bytes back into
 * text costs a copy.
 */
class EventWriter {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  private written = false;
  /** The last write found the client's socket full: pull nothing more until it drains. */
  blocked = false;

  constructor(private readonly res: NodeResponse) {}

  /**
   * Sends the headers (written by writeHead) by the end of this turn of the event loop: with the
   * first events when they come in it (one write, not two), else alone. Time to first byte is
   * the client's, not the provider's.
   */
  headersSoon(): void {
    setImmediate(sendHeaders, this);
  }

  sendHeaders(): void {
    if (this.written || this.res.writableEnded || this.res.destroyed) return;
    (this.res as { flushHeaders?: () => void }).flushHeaders?.();
  }

  /**
   * Queues one event whose data is `data`, for this turn's write: `data: <bytes>\n\n`, or, when
   * the data holds line breaks (CR, LF or CRLF), one `data:` line per line of it. What a provider
   * sends is data, never framing: written as it came, a line break in it would end the event's
   * line and an empty line the event itself, letting a provider forge events of its own
   * (DESIGN.md 8). A client's SSE parser joins the lines back with LF, the data as it was.
   */
  event(data: Uint8Array, name?: string): void {
    if (this.pending.length === 0) process.nextTick(flushEvents, this);
    if (name !== undefined && name !== "") {
      // A dialect's event name is the gateway's own (its translator's), never a provider's.
      const line = Buffer.from(name);
      this.pending.push(namedStart, line, lineEnd);
      this.pendingBytes += namedStart.byteLength + line.byteLength + lineEnd.byteLength;
    }
    // Two native scans; the line-by-line path is for the rare multi-line event.
    if (data.indexOf(lf) === -1 && data.indexOf(cr) === -1) {
      this.pending.push(eventStart, data, eventEnd);
      this.pendingBytes += eventStart.byteLength + data.byteLength + eventEnd.byteLength;
      return;
    }
    let start = 0;
    for (let i = 0; i < data.byteLength; i++) {
      const byte = data[i];
      if (byte !== lf && byte !== cr) continue;
      this.line(data.subarray(start, i), lineEnd);
      if (byte === cr && data[i + 1] === lf) i++;
      start = i + 1;
    }
    this.line(data.subarray(start), eventEnd);
  }

  private line(text: Uint8Array, end: Buffer): void {
    this.pending.push(eventStart, text, end);
    this.pendingBytes += eventStart.byteLength + text.byteLength + end.byteLength;
  }

  flush(): void {
    if (this.pending.length === 0) return;
    const parts = this.pending;
    const size = this.pendingBytes;
    this.pending = [];
    this.pendingBytes = 0;
    if (this.res.writableEnded || this.res.destroyed) return;
    this.written = true;
    if (!this.res.write(Buffer.concat(parts, size))) this.blocked = true;
  }

  /**
   * Resolves when the client has taken what was written (`drain`) or is gone (`close`: it left,
   * or the listener cut it after CLIENT_WRITE_TIMEOUT_MS without taking a byte). Only called
   * when a write said the socket is full, so a client that keeps up costs nothing here.
   */
  async drained(): Promise<void> {
    const res = this.res;
    // It may have drained already, between the write and now: a wait for a `drain` that
    // already came would never end.
    if (!res.destroyed && !res.writableEnded && needsDrain(res)) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          res.off("drain", done);
          res.off("close", done);
          resolve();
        };
        res.on("drain", done);
        res.on("close", done);
      });
    }
    this.blocked = false;
  }

  /** Writes what is queued, then `last`, and ends the response. */
  end(last: string): void {
    this.flush();
    this.written = true;
    this.res.end(last);
  }
}

/** Whether the response's writer was told to wait for `drain` and it has not come yet. */
function needsDrain(res: NodeResponse): boolean {
  // HTTP/2's compatibility response has no writableNeedDrain of its own; its stream does.
  const own = (res as { writableNeedDrain?: boolean }).writableNeedDrain;
  if (own !== undefined) return own;
  return (res as { stream?: { writableNeedDrain?: boolean } }).stream?.writableNeedDrain === true;
}

function flushEvents(writer: EventWriter): void {
  writer.flush();
}

function sendHeaders(writer: EventWriter): void {
  writer.sendHeaders();
}

function header(req: NodeRequest, name: string): string {
  const value = req.headers[name];
  return typeof value === "string" ? value : "";
}

/** What a chat route asks of the chat handler besides the caller (the RPC request's fields). */
export interface ChatFields {
  readonly body: Uint8Array;
  readonly permitId: string;
  readonly quoteId: string;
  readonly idempotencyKey: string;
  readonly dialect: Dialect;
}

/**
 * The chat handler as the REST facade calls it: the call guard (the caller, its rate, the
 * outcome logged as an RPC's), then the chat call pushing its answer into `sink` (sink.ts). No
 * RPC in process and no generator per event: the provider's events reach the client's socket
 * through the sink. The sink's `failed` and `cancelled` get the ConnectError the guard mapped.
 */
export type RestChat = (
  fields: ChatFields,
  options: InProcessCallOptions,
  sink: ChatSink,
) => Promise<void>;

/**
 * POST /v1/chat/completions (and the dialects' routes) -> the chat handler, the answer pushed
 * into the client's socket by {@link AnswerWriter}.
 *
 * `"stream": true` answers text/event-stream in OpenAI framing: one `data:`
 * event per upstream chunk, then a last chunk carrying `x_gateway` (the final
 * charge), then `data: [DONE]`, with the charge also as the HTTP trailer
 * X-Gateway-Credits-Charged. Otherwise the upstream's JSON object as it came.
 * Failures before the answer begins get the error body; a failure after it
 * began ends the stream with an error event (never a silent close).
 *
 * Response headers are the gateway's own, listed here and nowhere else: no header of the
 * provider's answer is copied (the upstream adapter exposes only `upstreamResponseHeaders`, and
 * none of those reaches the client), so a provider cannot set cookies, fake the
 * `X-Gateway-*` metering headers or the framing (`content-length`, `transfer-encoding`).
 */
export async function relayChat(
  chat: RestChat,
  req: NodeRequest,
  res: NodeResponse,
  body: Uint8Array,
  options: InProcessCallOptions,
  dialect?: { readonly id: Dialect; readonly translator: DialectTranslator },
): Promise<void> {
  const writer = new AnswerWriter(res, options.signal, dialect?.translator);
  await chat(
    {
      body,
      permitId: header(req, "x-gateway-permit"),
      quoteId: header(req, "x-gateway-quote"),
      idempotencyKey: header(req, "idempotency-key"),
      dialect: dialect?.id ?? Dialect.UNSPECIFIED,
    },
    options,
    writer,
  );
  // Refused before the answer began: the facade answers the error body.
  if (writer.refusal !== undefined) throw writer.refusal.error;
}

/**
 * One answer written into the client's response as the chat call pushes it (the sink contract,
 * sink.ts). One object per request; the per-event path queues bytes into the event writer.
 */
class AnswerWriter implements ChatSink {
  private begun: ChatStarted | undefined;
  private json: Uint8Array | undefined;
  private firstChunk: Uint8Array | undefined;
  /** Set when the answer streams (`"stream": true`). */
  private events: EventWriter | undefined;
  /** The call was refused before its answer began (the facade writes the error body). */
  refusal: { error: unknown } | undefined;

  constructor(
    private readonly res: NodeResponse,
    private readonly signal: AbortSignal,
    private readonly translator: DialectTranslator | undefined,
  ) {}

  started(event: ChatStarted): void {
    this.begun = event;
    if (!event.stream) return;
    this.events = new EventWriter(this.res);
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
      trailer: "X-Gateway-Credits-Charged",
      "x-gateway-request-id": event.requestId,
      "x-gateway-quote-id": event.quoteId,
      "x-gateway-offer-id": event.offerId,
      "x-gateway-tariff-version": event.tariffVersion.toString(),
    });
    this.events.headersSoon();
  }

  chunk(event: ChatChunk): boolean {
    const events = this.events;
    if (events === undefined) {
      this.json = event.data;
      return true;
    }
    this.firstChunk ??= event.data;
    events.event(event.data, event.event);
    // Backpressure: the provider is read on only once the client has taken what was written
    // (at most one upstream read's events are queued).
    return !events.blocked;
  }

  drained(): Promise<void> {
    return this.events === undefined ? Promise.resolve() : this.events.drained();
  }

  completed(done: ChatCompleted): void {
    const { begun: started, events, res } = this;
    if (started === undefined) throw new Error("completed before started");
    const charged = done.creditsCharged.toString();
    if (events === undefined) {
      const payload = this.json ?? new Uint8Array();
      res.writeHead(200, {
        "content-type": "application/json",
        "content-length": payload.byteLength,
        "x-gateway-request-id": started.requestId,
        "x-gateway-quote-id": started.quoteId,
        "x-gateway-offer-id": started.offerId,
        "x-gateway-tariff-version": started.tariffVersion.toString(),
        "x-gateway-credits-charged": charged,
      });
      // A big answer in pieces (views, no copies): the listener sees a slow reader's
      // progress per piece taken, where one write would show none until all of it left
      // (CLIENT_WRITE_TIMEOUT_MS would cut a client that reads, slowly).
      let at = 0;
      for (; payload.byteLength - at > jsonPieceBytes; at += jsonPieceBytes)
        res.write(payload.subarray(at, at + jsonPieceBytes));
      res.end(at === 0 ? payload : payload.subarray(at));
    } else if (this.translator !== undefined) {
      // The dialect's closing events (the last with x_gateway) came as chunks; no [DONE].
      res.addTrailers({ "X-Gateway-Credits-Charged": charged });
      events.end("");
    } else {
      events.event(Buffer.from(JSON.stringify(finalChunk(this.firstChunk, done))));
      res.addTrailers({ "X-Gateway-Credits-Charged": charged });
      events.end("data: [DONE]\n\n");
    }
  }

  failed(error: unknown): void {
    this.end(error);
  }

  cancelled(reason: unknown): void {
    this.end(reason);
  }

  /** The call ended without its answer: the error body (the facade's), or the stream's last event. */
  private end(error: unknown): void {
    const { events, res } = this;
    if (events === undefined || !res.headersSent) {
      this.refusal = { error };
      return;
    }
    if (res.writableEnded || res.destroyed) return;
    // Cut by shutdown: the signal's reason (`shutting_down`) is the stream's last event.
    const reason: unknown = this.signal.aborted ? this.signal.reason : undefined;
    const { body: errorBody } = toHttpError(reason instanceof GatewayError ? reason : error);
    if (this.translator === undefined) {
      events.end(`data: ${JSON.stringify(errorBody)}\n\n`);
      return;
    }
    const failure = new GatewayError(errorBody.error.code, errorBody.error.message);
    const stream = this.translator.createStream({
      requestId: this.begun?.requestId ?? "",
      model: "",
    });
    for (const out of stream.fail(failure))
      events.event(Buffer.from(JSON.stringify(out.data)), out.event);
    events.end("");
  }
}

/** The last chunk before [DONE]: OpenAI chunk framing (id, model as the stream had them), no choices, and the charge. */
function finalChunk(first: Uint8Array | undefined, done: ChatCompleted) {
  let head: { id?: unknown; created?: unknown; model?: unknown } = {};
  try {
    if (first !== undefined)
      head = JSON.parse(
        Buffer.from(first.buffer, first.byteOffset, first.byteLength).toString("utf8"),
      ) as typeof head;
  } catch {
    head = {};
  }
  return {
    id: head.id ?? done.requestId,
    object: "chat.completion.chunk",
    created: head.created ?? Math.floor(Date.now() / 1000),
    model: head.model ?? "",
    choices: [],
    x_gateway: xGatewayResource.view(completedMessage(done)),
  };
}
