import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { Dialect, InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { handlerContext, type GuardedCall } from "../connect/call-guard.js";
import type { AnswerController, ChatChunk, ChatCompleted, ChatSink } from "../domain/chat/index.js";
import { chunkChargeOf, type DialectStarted } from "../domain/dialects/index.js";
import { GatewayError } from "../domain/errors.js";
import { claimedPayer, paymentRefusalCodes } from "../domain/x402/index.js";
import { decodePaymentSignatureHeader, encodePaymentResponseHeader } from "@x402/core/http";
import type { NodeRequest, NodeResponse } from "./body.js";
import { errorCodeOf, toConnectError } from "../connect/errors.js";
import { toHttpError } from "./errors.js";
import { EventWriter } from "./event-writer.js";
import type { Call } from "./route-kit.js";

/** Largest single write of a JSON answer. */
const jsonPieceBytes = 64 * 1024;

function header(req: NodeRequest, name: string): string {
  const value = req.headers[name];
  return typeof value === "string" ? value : "";
}

/**
 * The request's x402 payment (`PAYMENT-SIGNATURE`, base64 JSON), decoded; undefined without
 * one; null when it cannot be decoded (refused 402 `payment_invalid` with what to pay).
 */
function paymentPayload(req: NodeRequest): unknown {
  const value = req.headers["payment-signature"];
  if (typeof value !== "string" || value === "") return undefined;
  if (value.length > 64 * 1024) return null;
  try {
    return decodePaymentSignatureHeader(value) as unknown;
  } catch {
    return null;
  }
}

/** The payer and network of a payment that reached the answer (the pipeline verified both). */
function paidBy(
  payload: unknown,
  payer: string | undefined,
): { payer: string; network: string } | undefined {
  if (payload === undefined || payload === null) return undefined;
  const network = (payload as { accepted?: { network?: unknown } }).accepted?.network;
  return payer === undefined || typeof network !== "string" ? undefined : { payer, network };
}

/**
 * x402's PAYMENT-RESPONSE of a paid JSON answer: the charge (`amount`, what settlement will
 * move, at most the signed amount), the payer and network; `transaction` is empty, since the
 * settlement is batched after the answer (GET /v1/requests/{id} shows it once it lands).
 */
function paymentResponse(
  payment: { payer: string; network: string },
  requestId: string,
  charged: string,
): string {
  return encodePaymentResponseHeader({
    success: true,
    payer: payment.payer,
    network: payment.network as `${string}:${string}`,
    transaction: "",
    amount: charged,
    extra: { requestId, settlement: "pending" },
  });
}

/**
 * A payment sent and refused (402 other than `payment_required`, which asks for one): it cost a
 * signature's check, and maybe a chain call, and counts against its address's failure budget.
 */
function refusedPayment(error: unknown): boolean {
  return paymentRefusals.has(errorCodeOf(toConnectError(error)));
}

const paymentRefusals: ReadonlySet<string> = new Set(paymentRefusalCodes);

/** The chat RPC, by name: how the REST chat routes' calls are logged and counted. */
const chatRpc = `${InferenceService.typeName}/${InferenceService.method.streamChatCompletion.name}`;

/**
 * POST /v1/chat/completions (and the dialects' routes) -> the InferenceService's chat method
 * (`chatInto`, the one body the RPC also runs), through the call guard (the caller, its rate,
 * the outcome logged and counted as the chat RPC's), the answer pushed into the client's socket
 * by {@link AnswerWriter}. No RPC in process and no generator per event.
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
  { req, res, request, guard, services }: Call,
  body: Uint8Array,
  dialect: Dialect = Dialect.UNSPECIFIED,
): Promise<void> {
  const call = guard.open(chatRpc, request);
  const values = createContextValues();
  // Without credentials on a payable route (the facade let it through): x402 (issue 37).
  const payload = request.address === undefined ? undefined : paymentPayload(req);
  const x402 =
    request.address === undefined ? undefined : { payload, url: `http://gateway${req.url ?? ""}` };
  // The address the payment names (unverified until the pipeline checks its signature).
  const payer = payload === undefined ? undefined : claimedPayer(payload);
  try {
    if (x402 === undefined) await call.admit("apiKey", values);
    else
      await call.admitPaying(
        payer === undefined ? `x402-address:${request.address}` : `x402:${payer.toLowerCase()}`,
        values,
        x402.payload !== undefined,
      );
    if (services.inference?.chatInto === undefined)
      throw new ConnectError(`${chatRpc} is not implemented`, Code.Unimplemented);
  } catch (error) {
    throw call.outcome(error);
  }
  const method = InferenceService.method.streamChatCompletion;
  const ctx = handlerContext(method, call, request.header, values);
  const writer = new AnswerWriter(
    res,
    call,
    dialect !== Dialect.UNSPECIFIED,
    paidBy(payload, payer),
  );
  const fields = {
    body,
    permitId: header(req, "x-gateway-permit"),
    quoteId: header(req, "x-gateway-quote"),
    idempotencyKey: header(req, "idempotency-key"),
    dialect,
    x402,
  };
  try {
    await services.inference.chatInto(fields, ctx, writer);
    call.outcome(undefined, "rpc stream ok");
  } catch (error) {
    // After the answer (its charge's record): the service's to log, not the client's.
    call.outcome(error);
  }
  // Refused before the answer began: the facade answers the error body.
  if (writer.refusal !== undefined) {
    const { error } = writer.refusal;
    if (x402?.payload !== undefined && refusedPayment(error)) call.paymentRefused();
    throw error;
  }
}

/**
 * One answer written into the client's response as the chat call pushes it (the sink contract,
 * src/domain/chat/types.ts). One object per request; the per-event path queues bytes into the
 * event writer. Its terminal calls end the guard's call: the failure it is handed is mapped,
 * logged and counted there, once.
 */
class AnswerWriter implements ChatSink {
  private begun: DialectStarted | undefined;
  private json: Uint8Array | undefined;
  private firstChunk: Uint8Array | undefined;
  /** Set when the answer streams (`"stream": true`). */
  private events: EventWriter | undefined;
  /** The call's flow control, and whether this writer paused it until the socket drains. */
  private controller: AnswerController | undefined;
  private waitingForDrain = false;
  /** The call was refused before its answer began (the facade writes the error body). */
  refusal: { error: unknown } | undefined;

  constructor(
    private readonly res: NodeResponse,
    private readonly call: GuardedCall,
    /** A dialect's answer (Responses, Messages): its own closing events, no `[DONE]`. */
    private readonly dialect: boolean,
    /** Paid with x402: the payer and network its JSON answer's PAYMENT-RESPONSE names. */
    private readonly payment?: { readonly payer: string; readonly network: string } | undefined,
  ) {}

  started(event: DialectStarted, controller: AnswerController): void {
    this.begun = event;
    this.controller = controller;
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

  chunk(event: ChatChunk): void {
    const events = this.events;
    if (events === undefined) {
      this.json = event.data;
      return;
    }
    this.firstChunk ??= event.data;
    events.event(event.data, event.event);
    // Backpressure: the provider is read on only once the client has taken what was written
    // (at most one upstream read's events are queued).
    if (events.blocked && !this.waitingForDrain) {
      this.waitingForDrain = true;
      this.controller?.pause();
      // A closure only on this slow path: a client that keeps up costs no bound function.
      void events.drained().then(() => this.drained());
    }
  }

  /** The client took what was written, or is gone (its signal then ends the call). */
  private drained(): void {
    this.waitingForDrain = false;
    this.controller?.resume();
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
        ...(this.payment === undefined
          ? {}
          : { "payment-response": paymentResponse(this.payment, started.requestId, charged) }),
      });
      // A big answer in pieces (views, no copies): the listener sees a slow reader's
      // progress per piece taken, where one write would show none until all of it left
      // (CLIENT_WRITE_TIMEOUT_MS would cut a client that reads, slowly).
      let at = 0;
      for (; payload.byteLength - at > jsonPieceBytes; at += jsonPieceBytes)
        res.write(payload.subarray(at, at + jsonPieceBytes));
      res.end(at === 0 ? payload : payload.subarray(at));
    } else if (this.dialect) {
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
    this.end(this.call.outcome(error));
  }

  cancelled(reason: unknown): void {
    this.end(this.call.outcome(reason));
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
    const { signal } = this.call;
    const reason: unknown = signal.aborted ? signal.reason : undefined;
    const { body: errorBody } = toHttpError(reason instanceof GatewayError ? reason : error);
    if (!this.dialect) {
      events.end(`data: ${JSON.stringify(errorBody)}\n\n`);
      return;
    }
    // The call's own translator goes on: its events' sequence continues into the failure.
    const failure = new GatewayError(errorBody.error.code, errorBody.error.message);
    for (const out of this.begun?.failure?.(failure) ?? []) events.event(out.data, out.event);
    events.end("");
  }
}

/** A provider's chunk id the final chunk may repeat: printable ASCII, no spaces, bounded. */
const chunkId = /^[\x21-\x7e]{1,128}$/;
/** A provider's model name the final chunk may repeat: bounded, no control characters. */
// eslint-disable-next-line no-control-regex -- the control characters are what it refuses
const modelName = /^[^\x00-\x1f\x7f]{1,256}$/u;
/** The largest `created` taken from a provider (Unix seconds, year 2286). */
const maxCreated = 9_999_999_999;

/**
 * The last chunk before [DONE], the gateway's own: OpenAI chunk framing (the `id`, `created` and
 * `model` the stream's first chunk had, so that a client sees one stream, when they are what
 * OpenAI's clients expect of them: a bounded token, Unix seconds, a bounded name; else the
 * request id, the gateway's time and ""), no choices, and the charge. A provider's values are
 * data: whatever the provider sent in them (an object, a huge or multi-line string) never
 * reaches the client in the gateway's chunk.
 */
function finalChunk(first: Uint8Array | undefined, done: ChatCompleted) {
  const head = firstChunkHead(first);
  const { id, created, model } = head;
  return {
    id: typeof id === "string" && chunkId.test(id) ? id : done.requestId,
    object: "chat.completion.chunk",
    created:
      typeof created === "number" &&
      Number.isInteger(created) &&
      created >= 0 &&
      created <= maxCreated
        ? created
        : Math.floor(Date.now() / 1000),
    model: typeof model === "string" && modelName.test(model) ? model : "",
    choices: [],
    x_gateway: chunkChargeOf(done),
  };
}

function firstChunkHead(first: Uint8Array | undefined): Record<string, unknown> {
  if (first === undefined) return {};
  try {
    const head: unknown = JSON.parse(
      Buffer.from(first.buffer, first.byteOffset, first.byteLength).toString("utf8"),
    );
    return typeof head === "object" && head !== null && !Array.isArray(head)
      ? (head as Record<string, unknown>)
      : {};
  } catch {
    return {};
  }
}
