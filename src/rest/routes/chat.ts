import { Type, type TSchema } from "@sinclair/typebox";
import { Dialect } from "../../../gen/gateway/v1/inference_pb.js";
import { dialects } from "../../domain/dialects/index.js";
import type { Dialect as DialectTranslator } from "../../domain/dialects/types.js";
import { GatewayError } from "../../domain/errors.js";
import { paymentRefusalCodes } from "../../domain/x402/index.js";
import { ChatRequest } from "../../schema/chat.js";
import { MessagesRequest } from "../../schema/messages.js";
import { ResponsesRequest } from "../../schema/responses.js";
import { ChatCompletion, ChatCompletionChunk, ChatStreamFinalChunk } from "../views/chat.js";
import { AnthropicError, MessagesAnswer, MessagesStreamEvent } from "../views/messages.js";
import { ErrorBody } from "../views/resources.js";
import { OpenAIError, ResponsesAnswer, ResponsesStreamEvent } from "../views/responses.js";
import { readJsonBytes } from "../body.js";
import { relayChat } from "../chat.js";
import { header, parameter } from "../document.js";
import type { Response } from "../route-spec.js";
import type { ErrorBody as ErrorBodyValue } from "../errors.js";
import type { Route } from "../route-kit.js";

/**
 * The chat routes (InferenceService's chat, src/rest/chat.ts relays it): chat completions and
 * the dialects translated to them, Responses and Messages (DESIGN.md section 9).
 */

/** A dialect's error body, carrying the gateway's code. */
const dialectError =
  (dialect: DialectTranslator) =>
  (error: ErrorBodyValue["error"]): unknown =>
    dialect.errorBody(new GatewayError(error.code, error.message));

/** What the chat route and every dialect route may answer (DESIGN.md section 9). */
const chatErrors = {
  400: ["invalid_hex"],
  402: [
    "permit_missing",
    "permit_not_found",
    "permit_expired",
    "permit_closing",
    "permit_closed",
    "permit_model_mismatch",
    "permit_offer_mismatch",
    "insufficient_credits",
    "authorization_cap_exhausted",
    "authorization_period_cap_exhausted",
    "payment_required",
    ...paymentRefusalCodes,
  ],
  403: ["permit_not_authorized", "authorization_per_request_cap_exceeded"],
  404: ["model_not_found", "quote_not_found"],
  409: [
    "quote_expired",
    "quote_mismatch",
    "quote_used",
    "tariff_changed",
    "idempotency_in_progress",
    "idempotency_result_too_large",
  ],
  422: ["idempotency_key_reused"],
  429: ["offer_at_capacity"],
  502: ["upstream_error"],
  503: [
    "no_eligible_offer",
    "offer_cooling_down",
    "offer_model_mismatch",
    "model_loading",
    "upstream_unavailable",
    "chain_unavailable",
  ],
} as const;

const chatParameters = [
  parameter("X-Gateway-Permit"),
  parameter("X-Gateway-Quote"),
  parameter("Idempotency-Key"),
];

/** The 200 of the chat route and the dialect routes: JSON, or the event stream. */
function chatAnswer(json: TSchema, events: TSchema, description: string): Response {
  return {
    description,
    headers: {
      "X-Request-Id": header("X-Request-Id"),
      "X-Gateway-Request-Id": header("X-Gateway-Request-Id"),
      "X-Gateway-Quote-Id": header("X-Gateway-Quote-Id"),
      "X-Gateway-Offer-Id": header("X-Gateway-Offer-Id"),
      "X-Gateway-Tariff-Version": header("X-Gateway-Tariff-Version"),
      "X-Gateway-Credits-Charged": header("X-Gateway-Credits-Charged-Json"),
      "X-Gateway-Budget-Warning": header("X-Gateway-Budget-Warning"),
      Trailer: header("Trailer"),
    },
    content: {
      "application/json": { schema: json },
      "text/event-stream": {
        schema: {
          type: "string",
          description:
            "SSE events (each event's `data` is described by x-sse-data); the last carries `x_gateway`",
        },
        "x-sse-data": events,
      },
    },
  };
}

/** A dialect route (DESIGN.md section 9): the chat route's parameters, headers and codes. */
function dialectRoute(spec: {
  readonly path: string;
  readonly operationId: string;
  readonly summary: string;
  readonly description: string;
  readonly request: TSchema;
  readonly answer: TSchema;
  readonly events: TSchema;
  readonly error: TSchema;
  readonly dialect: Dialect;
  readonly translator: DialectTranslator;
  readonly apiKeyHeader?: boolean;
}): Route {
  return {
    method: "POST",
    path: spec.path,
    operationId: spec.operationId,
    summary: spec.summary,
    description: spec.description,
    tag: "inference",
    parameters: chatParameters,
    body: { schema: spec.request },
    answer: chatAnswer(
      spec.answer,
      spec.events,
      'The answer: JSON, or the dialect\'s event stream with `"stream": true`',
    ),
    errors: chatErrors,
    errorSchema: spec.error,
    errorBody: dialectError(spec.translator),
    ...(spec.apiKeyHeader === true ? { apiKeyHeader: true } : {}),
    payable: true,
    handle: async (call) => {
      const body = await readJsonBytes(call.req, call.deps.bodyLimitBytes);
      await relayChat(call, body, spec.dialect);
      return undefined;
    },
  };
}

export const chatRoutes: readonly Route[] = [
  {
    method: "POST",
    path: "/v1/chat/completions",
    operationId: "createChatCompletion",
    summary: "Create a metered chat completion",
    description: [
      'Proxied to an eligible provider and metered. `"stream": true` answers',
      "`text/event-stream` in OpenAI framing: one `data:` event per upstream chunk, then a",
      "last chunk carrying `x_gateway` (the final charge), then `data: [DONE]`; the charge",
      "is also sent as the HTTP trailer `X-Gateway-Credits-Charged`. A stream that fails",
      'after its first byte (or is cut by shutdown) ends with one `data: {"error": ...}`',
      "event and no `[DONE]`. Otherwise the provider's JSON object as it came.",
      "`Idempotency-Key` replays a finished answer (status, body, X-Gateway-* headers).",
    ].join("\n"),
    tag: "inference",
    parameters: chatParameters,
    body: { schema: ChatRequest },
    answer: chatAnswer(
      ChatCompletion,
      Type.Union([ChatStreamFinalChunk, ChatCompletionChunk, ErrorBody], {
        description:
          "The JSON `data` of one SSE event: an upstream chunk, the final chunk with `x_gateway`, or (last, no `[DONE]` after it) an error",
      }),
      'The completion: JSON, or an SSE stream with `"stream": true`',
    ),
    errors: chatErrors,
    payable: true,
    handle: async (call) => {
      const body = await readJsonBytes(call.req, call.deps.bodyLimitBytes);
      await relayChat(call, body);
      return undefined;
    },
  },
  dialectRoute({
    path: "/v1/responses",
    operationId: "createResponse",
    summary: "Create a metered response (OpenAI Responses API, stateless)",
    description: [
      "The OpenAI Responses API, translated at the edge to a chat completion and served as one",
      "(DESIGN.md section 9): the same permit, quote, Idempotency-Key, X-Gateway-* headers and",
      "billing. `previous_response_id`, `conversation`, `store: true`, `background` and built-in",
      'tools are refused (`invalid_request`). `"stream": true` answers typed events (`event:` is',
      "the event's `type`) from `response.created` to `response.completed` (or",
      "`response.incomplete` / `response.failed`), no `[DONE]`; the last event and the JSON answer",
      "carry `x_gateway`. Errors in OpenAI's shape with the gateway's code.",
    ].join("\n"),
    request: ResponsesRequest,
    answer: ResponsesAnswer,
    events: ResponsesStreamEvent,
    error: OpenAIError,
    dialect: Dialect.RESPONSES,
    translator: dialects.responses,
  }),
  dialectRoute({
    path: "/v1/messages",
    operationId: "createMessage",
    summary: "Create a metered message (Anthropic Messages API)",
    description: [
      "The Anthropic Messages API, translated at the edge to a chat completion and served as one",
      "(DESIGN.md section 9). The API key may come as `x-api-key` (as Anthropic's clients send",
      "it) or as a bearer token; `anthropic-version` is accepted and not required. The same",
      'permit, quote, Idempotency-Key, X-Gateway-* headers and billing. `"stream": true` answers',
      "`message_start` ... `content_block_*` ... `message_delta` (stop reason, usage),",
      "`message_stop` (the last, with `x_gateway`). Errors in Anthropic's shape",
      '(`{type: "error", error: {type, message, code}}`) with the gateway\'s code.',
    ].join("\n"),
    request: MessagesRequest,
    answer: MessagesAnswer,
    events: MessagesStreamEvent,
    error: AnthropicError,
    dialect: Dialect.MESSAGES,
    translator: dialects.messages,
    apiKeyHeader: true,
  }),
];
