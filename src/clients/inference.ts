import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import type { Hex } from "viem";
import { Dialect, InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import type { AuditAnswer, AuditClient } from "../domain/audits/runner.js";
import type { AuditBody } from "../domain/audits/traffic.js";

/**
 * The auditor's way into the gateway (issue 39): typed gRPC clients of its own QuoteService and
 * InferenceService over one HTTP/2 connection, as internal callers reach it (the settlement
 * worker's client, settlement.ts, is the same), authenticated with the operator's audit API key.
 * An audit is then a chat request like a client's: the guard, the permit, routing, metering, the
 * ledger's charge and settlement are the same code.
 */

export interface AuditConnection {
  readonly client: AuditClient;
  /** Closes the HTTP/2 connection. Safe to call twice. */
  close(): void;
}

const dialects = {
  chat: Dialect.UNSPECIFIED,
  messages: Dialect.MESSAGES,
  responses: Dialect.RESPONSES,
} as const;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The body with `offer` added: the quote pins the audit to the offer (the chat body does not name it). */
function pinned(body: AuditBody, offerId: Hex): Uint8Array {
  const value = JSON.parse(decoder.decode(body.bytes)) as Record<string, unknown>;
  return encoder.encode(JSON.stringify({ ...value, offer: offerId }));
}

function parseData(bytes: Uint8Array): unknown {
  try {
    return JSON.parse(decoder.decode(bytes)) as unknown;
  } catch {
    return undefined;
  }
}

export function connectAudits(baseUrl: string, apiKey: string): AuditConnection {
  const sessionManager = new Http2SessionManager(baseUrl, {
    pingIntervalMs: 30_000,
    pingTimeoutMs: 15_000,
  });
  const transport = createGrpcTransport({ baseUrl, sessionManager });
  const quotes = createClient(QuoteService, transport);
  const inference = createClient(InferenceService, transport);
  const headers = { authorization: `Bearer ${apiKey}` };

  const chargeOf = async (requestId: Hex | undefined): Promise<bigint | undefined> => {
    if (requestId === undefined) return undefined;
    try {
      const { request } = await inference.getRequest({ id: requestId }, { headers });
      return request === undefined ? undefined : BigInt(request.creditsCharged || "0");
    } catch {
      return undefined;
    }
  };

  const client: AuditClient = {
    async quote(body, offerId) {
      const { quote } = await quotes.createQuote(
        { body: pinned(body, offerId), dialect: dialects[body.dialect] },
        { headers },
      );
      if (quote === undefined) throw new ConnectError("the gateway answered no quote");
      return {
        quoteId: quote.quoteId as Hex,
        offerId: quote.offerId as Hex,
        maximumCredits: BigInt(quote.maximumCredits),
      };
    },
    async send(body, permitId, quoteId) {
      const events: { data: unknown; event?: string }[] = [];
      let requestId: Hex | undefined;
      try {
        const stream = inference.streamChatCompletion(
          { body: body.bytes, permitId, quoteId, dialect: dialects[body.dialect] },
          { headers },
        );
        for await (const message of stream) {
          const { event } = message;
          if (event.case === "started") requestId = event.value.requestId as Hex;
          else if (event.case === "chunk") {
            events.push({
              data: parseData(event.value.data),
              ...(event.value.event === "" ? {} : { event: event.value.event }),
            });
          } else if (event.case === "completed") {
            const answer: AuditAnswer = {
              requestId,
              events,
              completed: true,
              charged: BigInt(event.value.creditsCharged || "0"),
            };
            // The stream's end is read too, so the call closes cleanly.
            for await (const _ of stream) void _;
            return answer;
          }
        }
      } catch {
        // Failed: what the ledger charged for it, when the request began.
        return { requestId, events, completed: false, charged: await chargeOf(requestId) };
      }
      return { requestId, events, completed: false, charged: await chargeOf(requestId) };
    },
  };
  return { client, close: () => sessionManager.abort() };
}
