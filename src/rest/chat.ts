import type { Client } from "@connectrpc/connect";
import type {
  ChatCompleted,
  ChatStarted,
  InferenceService,
} from "../../gen/gateway/v1/inference_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { NodeRequest } from "./body.js";
import { toHttpError } from "./errors.js";
import type { NodeResponse } from "./facade.js";
import { billingWord } from "./views.js";

/**
 * POST /v1/chat/completions -> InferenceService.StreamChatCompletion.
 *
 * `"stream": true` answers text/event-stream in OpenAI framing: one `data:`
 * event per upstream chunk, then a last chunk carrying `x_gateway` (the final
 * charge), then `data: [DONE]`, with the charge also as the HTTP trailer
 * X-Gateway-Credits-Charged. Otherwise the upstream's JSON object as it came.
 * Failures before the answer begins get the error body; a failure after it
 * began ends the stream with an error event (never a silent close).
 */
export async function relayChat(
  client: Client<typeof InferenceService>,
  req: NodeRequest,
  res: NodeResponse,
  body: Uint8Array,
  options: { headers: Record<string, string>; signal: AbortSignal },
): Promise<void> {
  const header = (name: string): string => {
    const value = req.headers[name];
    return typeof value === "string" ? value : "";
  };
  const messages = client.streamChatCompletion(
    {
      body,
      permitId: header("x-gateway-permit"),
      quoteId: header("x-gateway-quote"),
      idempotencyKey: header("idempotency-key"),
    },
    options,
  );

  let started: ChatStarted | undefined;
  let json: Uint8Array | undefined;
  let firstChunk: Uint8Array | undefined;
  let sse = false;
  let answered = false;
  // Events that arrive in the same turn of the event loop (one upstream read usually carries
  // many) leave in one socket write: a write per event costs a syscall per event.
  let corked = false;
  const uncork = (): void => {
    corked = false;
    res.uncork();
  };
  const writeEvent = (text: string): void => {
    if (!corked) {
      corked = true;
      res.cork();
      process.nextTick(uncork);
    }
    res.write(text);
  };
  try {
    for await (const message of messages) {
      const event = message.event;
      if (event.case === "started") {
        started = event.value;
        sse = started.stream;
        if (sse) {
          res.writeHead(200, {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            trailer: "X-Gateway-Credits-Charged",
            ...startedHeaders(started),
          });
          // Flush the headers now: time to first byte is the client's, not the provider's.
          (res as { flushHeaders?: () => void }).flushHeaders?.();
        }
      } else if (event.case === "chunk") {
        if (!sse) json = event.value.data;
        else {
          firstChunk ??= event.value.data;
          writeEvent(`data: ${Buffer.from(event.value.data).toString("utf8")}\n\n`);
        }
      } else if (event.case === "completed") {
        const done = event.value;
        if (started === undefined) throw new Error("completed before started");
        if (!sse) {
          const payload = json ?? new Uint8Array();
          res.writeHead(200, {
            "content-type": "application/json",
            "content-length": payload.byteLength,
            ...startedHeaders(started),
            "x-gateway-credits-charged": done.creditsCharged,
          });
          res.end(payload);
        } else {
          writeEvent(`data: ${JSON.stringify(finalChunk(firstChunk, done))}\n\n`);
          writeEvent("data: [DONE]\n\n");
          res.addTrailers({ "X-Gateway-Credits-Charged": done.creditsCharged });
          res.end();
        }
        // The call goes on until the charge is recorded; the client need not wait for that.
        answered = true;
      }
    }
    if (!answered) throw new GatewayError("upstream_error", "the answer ended before it completed");
  } catch (error) {
    // After the answer: a failure to record its charge is the service's to log, not the client's.
    if (answered) return;
    if (!sse || !res.headersSent) throw error;
    const { body: errorBody } = toHttpError(error);
    if (!res.writableEnded && !res.destroyed) {
      res.write(`data: ${JSON.stringify(errorBody)}\n\n`);
      res.end();
    }
  }
}

function startedHeaders(started: ChatStarted): Record<string, string> {
  return {
    "x-gateway-request-id": started.requestId,
    "x-gateway-quote-id": started.quoteId,
    "x-gateway-offer-id": started.offerId,
    "x-gateway-tariff-version": started.tariffVersion,
  };
}

/** The last chunk before [DONE]: OpenAI chunk framing (id, model as the stream had them), no choices, and the charge. */
function finalChunk(first: Uint8Array | undefined, done: ChatCompleted) {
  let head: { id?: unknown; created?: unknown; model?: unknown } = {};
  try {
    if (first !== undefined) head = JSON.parse(Buffer.from(first).toString("utf8")) as typeof head;
  } catch {
    head = {};
  }
  return {
    id: head.id ?? done.requestId,
    object: "chat.completion.chunk",
    created: head.created ?? Math.floor(Date.now() / 1000),
    model: head.model ?? "",
    choices: [],
    x_gateway: {
      request_id: done.requestId,
      quote_id: done.quoteId,
      offer_id: done.offerId,
      tariff_version: done.tariffVersion,
      input_tokens: done.inputTokens.toString(),
      output_tokens: done.outputTokens.toString(),
      credits_charged: done.creditsCharged,
      billing: billingWord(done.billing),
    },
  };
}
