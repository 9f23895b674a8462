import type { ChatCompleted, ChatStarted } from "../../gen/gateway/v1/inference_pb.js";
import { Dialect, InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import type { Dialect as DialectTranslator } from "../domain/dialects/types.js";
import type { InProcessCallOptions, InProcessCaller } from "../connect/in-process-transport.js";
import { GatewayError } from "../domain/errors.js";
import type { NodeRequest } from "./body.js";
import { toHttpError } from "./errors.js";
import type { NodeResponse } from "./facade.js";
import { xGatewayResource } from "../schema/chat.js";

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
 * text costs a copy. (A class, not closures: under tsx every named closure made per request
 * costs a defineProperty for its name.)
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

/**
 * POST /v1/chat/completions -> InferenceService.StreamChatCompletion.
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
  rpc: InProcessCaller,
  req: NodeRequest,
  res: NodeResponse,
  body: Uint8Array,
  options: InProcessCallOptions,
  dialect?: { readonly id: Dialect; readonly translator: DialectTranslator },
): Promise<void> {
  const messages = await rpc.stream(
    InferenceService.method.streamChatCompletion,
    {
      body,
      permitId: header(req, "x-gateway-permit"),
      quoteId: header(req, "x-gateway-quote"),
      idempotencyKey: header(req, "idempotency-key"),
      dialect: dialect?.id ?? Dialect.UNSPECIFIED,
    },
    options,
  );

  let started: ChatStarted | undefined;
  let json: Uint8Array | undefined;
  let firstChunk: Uint8Array | undefined;
  // Set when the answer streams (`"stream": true`).
  let events: EventWriter | undefined;
  let answered = false;
  try {
    for await (const message of messages) {
      const event = message.event;
      if (event.case === "chunk") {
        if (events === undefined) json = event.value.data;
        else {
          firstChunk ??= event.value.data;
          events.event(event.value.data, event.value.event);
          // Backpressure: the next message is pulled, and so the provider read, only once the
          // client has taken what was written (at most one upstream read's events are queued).
          if (events.blocked) {
            await events.drained();
            if (res.destroyed) break;
          }
        }
      } else if (event.case === "started") {
        started = event.value;
        if (started.stream) {
          events = new EventWriter(res);
          res.writeHead(200, {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            trailer: "X-Gateway-Credits-Charged",
            "x-gateway-request-id": started.requestId,
            "x-gateway-quote-id": started.quoteId,
            "x-gateway-offer-id": started.offerId,
            "x-gateway-tariff-version": started.tariffVersion,
          });
          events.headersSoon();
        }
      } else if (event.case === "completed") {
        const done = event.value;
        if (started === undefined) throw new Error("completed before started");
        if (events === undefined) {
          const payload = json ?? new Uint8Array();
          res.writeHead(200, {
            "content-type": "application/json",
            "content-length": payload.byteLength,
            "x-gateway-request-id": started.requestId,
            "x-gateway-quote-id": started.quoteId,
            "x-gateway-offer-id": started.offerId,
            "x-gateway-tariff-version": started.tariffVersion,
            "x-gateway-credits-charged": done.creditsCharged,
          });
          // A big answer in pieces (views, no copies): the listener sees a slow reader's
          // progress per piece taken, where one write would show none until all of it left
          // (CLIENT_WRITE_TIMEOUT_MS would cut a client that reads, slowly).
          let at = 0;
          for (; payload.byteLength - at > jsonPieceBytes; at += jsonPieceBytes)
            res.write(payload.subarray(at, at + jsonPieceBytes));
          res.end(at === 0 ? payload : payload.subarray(at));
        } else if (dialect !== undefined) {
          // The dialect's closing events (the last with x_gateway) came as chunks; no [DONE].
          res.addTrailers({ "X-Gateway-Credits-Charged": done.creditsCharged });
          events.end("");
        } else {
          events.event(Buffer.from(JSON.stringify(finalChunk(firstChunk, done))));
          res.addTrailers({ "X-Gateway-Credits-Charged": done.creditsCharged });
          events.end("data: [DONE]\n\n");
        }
        // The call goes on until the charge is recorded; the client need not wait for that.
        answered = true;
      }
    }
    if (!answered) throw new GatewayError("upstream_error", "the answer ended before it completed");
  } catch (error) {
    // After the answer: a failure to record its charge is the service's to log, not the client's.
    if (answered) return;
    if (events === undefined || !res.headersSent) throw error;
    if (!res.writableEnded && !res.destroyed) {
      // Cut by shutdown: the signal's reason (`shutting_down`) is the stream's last event.
      const reason: unknown = options.signal.aborted ? options.signal.reason : undefined;
      const { body: errorBody } = toHttpError(reason instanceof GatewayError ? reason : error);
      if (dialect === undefined) {
        events.end(`data: ${JSON.stringify(errorBody)}\n\n`);
        return;
      }
      const failure = new GatewayError(errorBody.error.code, errorBody.error.message);
      const stream = dialect.translator.createStream({
        requestId: started?.requestId ?? "",
        model: "",
      });
      for (const out of stream.fail(failure))
        events.event(Buffer.from(JSON.stringify(out.data)), out.event);
      events.end("");
    }
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
    x_gateway: xGatewayResource.view(done),
  };
}
