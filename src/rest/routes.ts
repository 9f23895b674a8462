import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { GatewayService } from "../../gen/gateway/v1/gateway_pb.js";
import { Dialect, InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { ModelStatusSchema, OfferStatusSchema } from "../../gen/gateway/v1/market_pb.js";
import { PermitAuthorizationStatusSchema, PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import { BatchStatusSchema, SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import type { InProcessCallOptions, InProcessCaller } from "../connect/in-process-transport.js";
import { payerRequestMaxBytes } from "../connect/routes.js";
import { dialects } from "../domain/dialects/index.js";
import type { Dialect as DialectTranslator } from "../domain/dialects/types.js";
import { GatewayError } from "../domain/errors.js";
import { ChatRequest } from "../schema/chat.js";
import { Hex32, OptionalNullable } from "../schema/common.js";
import { MessagesRequest } from "../schema/messages.js";
import {
  ErrorBody,
  flushResource,
  Health,
  ModelList,
  ModelWithOffers,
  OfferEnvelope,
  OfferKeyBindingEnvelope,
  SettlementBatchList,
  batchRecordResource,
  offerEarningsResource,
  offerKeyBindingResource,
  OfferList,
  PayerAuthorizationList,
  PayerRevocation,
  PermitAuthorizationEnvelope,
  PermitAuthorizationList,
  Readiness,
  VerifiedOffer,
  verificationRunResource,
  modelResource,
  offerHealthResource,
  offerResource,
  permitAuthorizationResource,
  permitBalanceResource,
  quoteResource,
  requestResource,
  settlementOfRequest,
} from "./views/resources.js";
import { ResponsesRequest } from "../schema/responses.js";
import {
  AuthorizationChallengeRequest,
  AuthorizeKeyRequest,
  AuthorizeKeyTypedData,
  BindKeyRequest,
  BindOfferKeyTypedData,
  ChallengeRequest,
  KeyBindingChallengeRequest,
  ListPayerAuthorizationsRequest,
  RegisterRequest,
  RegistrationTypedData,
  RevokeBySignatureRequest,
  RevokeKeyAuthorizationTypedData,
  RevokePayerAuthorizationsRequest,
} from "../schema/signing.js";
import { compileBody, type BodyCheck } from "../domain/body-check.js";
import { ChatCompletion, ChatCompletionChunk, ChatStreamFinalChunk } from "./views/chat.js";
import { AnthropicError, MessagesAnswer, MessagesStreamEvent } from "./views/messages.js";
import { enumWords } from "./views/proto-view.js";
import { gatewayResource, PermitReceiptList, SignedUsageReceipt } from "./views/receipts.js";
import { OpenAIError, ResponsesAnswer, ResponsesStreamEvent } from "./views/responses.js";
import { readJsonBytes, type NodeRequest } from "./body.js";
import { relayChat } from "./chat.js";
import {
  buildOpenApiDocument,
  header,
  parameter,
  statusFilter,
  type Parameter,
  type Response,
  type RouteSpec,
} from "./document.js";
import type { ErrorBody as ErrorBodyValue } from "./errors.js";
import type { FacadeDeps, NodeResponse } from "./facade.js";
import {
  authorizeKeyTypedDataView,
  bindOfferKeyTypedDataView,
  parseStatusFilter,
  revokeTypedDataView,
  typedDataView,
  usageReceiptView,
} from "./views.js";

/**
 * The REST surface, one entry per route: what the OpenAPI document says of it (src/rest/
 * document.ts generates the document from these entries: the path, the body's and the answer's
 * schemas, the route's own error codes) and the handler that turns the HTTP request into one
 * RPC call and its answer back into the spec's JSON. No business rule lives here.
 */

export interface Call<Body = unknown> {
  readonly req: NodeRequest;
  readonly res: NodeResponse;
  /** The query string, without its `?` ("" when there is none). */
  readonly query: string;
  readonly params: readonly string[];
  /** What carries the caller's credentials, request id and cancellation to the RPC. */
  readonly options: InProcessCallOptions;
  readonly rpc: InProcessCaller;
  readonly deps: FacadeDeps;
  /** The JSON body, validated against the route's body schema (routes whose facade reads it). */
  readonly body: Body;
}

export interface Reply {
  readonly status?: number;
  readonly body: unknown;
  readonly headers?: Record<string, string>;
}

export interface Route extends RouteSpec {
  readonly handle: (call: Call) => Promise<Reply | undefined>;
  /**
   * Validates the JSON body before the handler runs (the facade reads it); absent: the handler
   * reads the raw bytes itself and the core validates them (chat, quotes, dialects).
   */
  readonly checkBody?: BodyCheck<TSchema>;
  /** The route's own error body (a dialect's shape); default the spec's `{error: {...}}`. */
  readonly errorBody?: (error: ErrorBodyValue["error"]) => unknown;
  /** A smaller bound than BODY_LIMIT_BYTES on the JSON body the facade reads (413 above it). */
  readonly bodyLimitBytes?: number;
  /** The API key may come as `x-api-key` when there is no `Authorization` (Anthropic's clients). */
  readonly apiKeyHeader?: boolean;
}

/** A route whose JSON body the facade validates: the handler gets it typed. */
function withBody<S extends TSchema>(
  schema: S,
  route: Omit<Route, "handle" | "body" | "checkBody"> & {
    readonly optional?: boolean;
    readonly handle: (call: Call<Static<S>>) => Promise<Reply | undefined>;
  },
): Route {
  const { optional, handle, ...rest } = route;
  return {
    ...rest,
    body: { schema, ...(optional === true ? { optional } : {}) },
    checkBody: compileBody(schema),
    handle: handle as Route["handle"],
  };
}

/** A dialect's error body, carrying the gateway's code. */
const dialectError =
  (dialect: DialectTranslator) =>
  (error: ErrorBodyValue["error"]): unknown =>
    dialect.errorBody(new GatewayError(error.code, error.message));

/** Anthropic clients send the API key as `x-api-key`; the gateway reads a bearer token. */
function withApiKeyHeader(options: InProcessCallOptions, req: NodeRequest): InProcessCallOptions {
  const key = req.headers["x-api-key"];
  if (req.headers.authorization !== undefined || typeof key !== "string") return options;
  return { ...options, headers: { ...req.headers, authorization: `Bearer ${key}` } };
}

/** `?dialect=` of a quote: which dialect its body is written in. */
function quoteDialect(query: string): Dialect {
  const word = query === "" ? null : new URLSearchParams(query).get("dialect");
  switch (word) {
    case null:
    case "chat":
      return Dialect.UNSPECIFIED;
    case "responses":
      return Dialect.RESPONSES;
    case "messages":
      return Dialect.MESSAGES;
    default:
      throw new GatewayError("invalid_request", "'dialect' must be chat, responses or messages");
  }
}

const statusOf = <T extends number>(
  schema: Parameters<typeof parseStatusFilter>[0],
  query: string,
): T | undefined => {
  const word = query === "" ? null : new URLSearchParams(query).get("status");
  const value = parseStatusFilter<T>(schema, word);
  if (word !== null && word !== "" && value === undefined) {
    throw new GatewayError("invalid_request", `unknown status filter '${word.slice(0, 40)}'`);
  }
  return value;
};

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
  503: ["no_eligible_offer", "upstream_unavailable", "chain_unavailable"],
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
    handle: async ({ options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      const callOptions = spec.apiKeyHeader === true ? withApiKeyHeader(options, req) : options;
      await relayChat(deps.chat, req, res, body, callOptions, {
        id: spec.dialect,
        translator: spec.translator,
      });
      return undefined;
    },
  };
}

const FlushRequest = Type.Object(
  {
    maxRequests: OptionalNullable(Type.Integer({ minimum: 1, maximum: 4294967295 })),
    max_requests: OptionalNullable(Type.Integer({ minimum: 1, maximum: 4294967295 })),
    dryRun: OptionalNullable(Type.Boolean()),
    dry_run: OptionalNullable(Type.Boolean()),
  },
  { description: "camelCase; snake_case (`max_requests`, `dry_run`) is accepted too" },
);

/** A query parameter that is a non-negative integer (Unix seconds, a count); else 400. */
function integerQuery(query: string, name: string): number | undefined {
  const word = query === "" ? null : new URLSearchParams(query).get(name);
  if (word === null || word === "") return undefined;
  if (!/^[0-9]{1,15}$/.test(word))
    throw new GatewayError("invalid_request", `'${name}' must be a non-negative integer`);
  return Number(word);
}

const secondsParameter = (name: string, description: string): Parameter => ({
  name,
  in: "query",
  required: false,
  description,
  schema: { type: "integer", minimum: 0, maximum: 999_999_999_999_999 },
});

/** The batch states a stored batch can be in (a dry run is never stored). */
const storedBatchStates = enumWords(BatchStatusSchema).filter((w) => w !== "dry_run");

const offerIdParameter = { description: "offer id", schema: Hex32 };

const typedDataAnswer = (schema: TSchema) => ({
  description: "Wallet-ready typed data (eth_signTypedData_v4)",
  schema,
});

const authorizationId = { description: "authorization id (`pauth_...`)" };

const payerParameter: Parameter = {
  name: "payer",
  in: "path",
  required: true,
  description: "the payer's address (0x + 40 hex digits)",
  schema: { type: "string" },
};

/**
 * `/metrics` is served before the facade (src/server.ts: on the main port, or only on
 * METRICS_PORT); it is declared here for the document.
 */
const metricsRoute: RouteSpec = {
  method: "GET",
  path: "/metrics",
  operationId: "getMetrics",
  summary: "Prometheus metrics",
  description:
    "Served on the main port unless METRICS_PORT is set, then only on that port (here a 404). No credentials, no X-Request-Id.",
  tag: "operations",
  auth: "none",
  answer: {
    description: "Prometheus text exposition format",
    content: { "text/plain": { schema: { type: "string" } } },
  },
  onlyOwnErrors: true,
  errors: { 404: ["route_not_found"], 503: ["shutting_down"] },
};

let document: Record<string, unknown> | undefined;

/** The OpenAPI 3.1 document of these routes (generated once; src/rest/document.ts). */
export function openApiDocument(): Record<string, unknown> {
  document ??= buildOpenApiDocument([...routes.slice(0, 2), metricsRoute, ...routes.slice(2)]);
  return document;
}

export const routes: readonly Route[] = [
  {
    method: "GET",
    path: "/health",
    operationId: "getHealth",
    summary: "Liveness",
    tag: "operations",
    auth: "none",
    answer: { description: "The process is up", schema: Health },
    handle: async () => ({ body: { status: "ok" } }),
  },
  {
    method: "GET",
    path: "/ready",
    operationId: "getReady",
    summary: "Readiness: the database and the chain answer",
    description:
      "503 `unavailable` with the failing check, or `shutting_down` from SIGTERM on (before anything else stops).",
    tag: "operations",
    auth: "none",
    answer: { description: "Ready", schema: Readiness },
    otherAnswers: {
      503: {
        description: "Not ready: a check failed, or the gateway is shutting down",
        headers: { "X-Request-Id": header("X-Request-Id-Optional") },
        content: { "application/json": { schema: Readiness } },
      },
    },
    onlyOwnErrors: true,
    errors: { 500: ["internal_error"] },
    handle: async ({ deps }) => {
      const readiness = await deps.readiness();
      if (readiness.shuttingDown === true)
        return { status: 503, body: { status: "shutting_down" } };
      return {
        status: readiness.ok ? 200 : 503,
        body: { status: readiness.ok ? "ready" : "unavailable", checks: readiness.checks },
      };
    },
  },
  {
    method: "GET",
    path: "/openapi.json",
    operationId: "getOpenApi",
    summary: "This document",
    tag: "operations",
    auth: "none",
    answer: {
      description: "The OpenAPI 3.1 description of the REST facade",
      schema: Type.Object(
        { openapi: Type.String(), info: Type.Object({}), paths: Type.Object({}) },
        { additionalProperties: true },
      ),
    },
    handle: async () => ({ body: openApiDocument() }),
  },
  {
    method: "GET",
    path: "/v1/gateway",
    operationId: "getGateway",
    summary: "This gateway's public facts (no credentials)",
    description:
      "The chain and market it serves, its settlement account and the address that signs its usage receipts (null when it has no receipt key). Answered from memory.",
    tag: "operations",
    auth: "none",
    answer: { description: "The gateway", schema: gatewayResource.schema },
    handle: async ({ rpc, options }) => {
      const { gateway } = await rpc.unary(GatewayService.method.getGateway, {}, options);
      if (gateway === undefined) throw new Error("GetGateway answered without the facts");
      return { body: gatewayResource.view(gateway) };
    },
  },
  {
    method: "GET",
    path: "/v1/models",
    operationId: "listModels",
    summary: "List canonical models",
    tag: "catalog",
    parameters: [statusFilter(enumWords(ModelStatusSchema))],
    answer: { description: "The models", schema: ModelList },
    errors: { 400: ["invalid_request"] },
    handle: async ({ rpc, options, query }) => {
      const { models } = await rpc.unary(
        CatalogService.method.listModels,
        { status: statusOf(ModelStatusSchema, query) },
        options,
      );
      return { body: { object: "list", data: models.map(modelResource.view) } };
    },
  },
  {
    method: "GET",
    path: "/v1/models/{id}",
    operationId: "getModel",
    summary: "Get one model with its offers",
    tag: "catalog",
    pathId: { description: "the public model id, an alias, or the ModelID (Hex32)" },
    answer: { description: "The model", schema: ModelWithOffers },
    errors: { 404: ["model_not_found"] },
    handle: async ({ rpc, options, params }) => {
      const { model, offers } = await rpc.unary(
        CatalogService.method.getModel,
        { id: params[0] },
        options,
      );
      if (model === undefined) throw new Error("GetModel answered without a model");
      return { body: { ...modelResource.view(model), offers: offers.map(offerResource.view) } };
    },
  },
  {
    method: "GET",
    path: "/v1/models/{id}/offers",
    operationId: "listOffers",
    summary: "List the offers of a model",
    tag: "catalog",
    pathId: { description: "the public model id, an alias, or the ModelID (Hex32)" },
    parameters: [statusFilter(enumWords(OfferStatusSchema))],
    answer: { description: "The offers", schema: OfferList },
    errors: { 404: ["model_not_found"] },
    handle: async ({ rpc, options, params, query }) => {
      const { offers } = await rpc.unary(
        CatalogService.method.listOffers,
        { model: params[0], status: statusOf(OfferStatusSchema, query) },
        options,
      );
      return { body: { object: "list", data: offers.map(offerResource.view) } };
    },
  },
  {
    method: "POST",
    path: "/v1/quotes",
    operationId: "createQuote",
    summary: "Quote the most a chat request can cost",
    description:
      "Bound to the request's model, messages, output limit, tools, tool choice and response format; single use; expires after 60 s. No permit needed. With `?dialect=responses` or `?dialect=messages` the body is a Responses or Messages request, and the quote binds the chat completion it translates to (DESIGN.md section 9).",
    tag: "inference",
    parameters: [
      {
        name: "dialect",
        in: "query",
        required: false,
        description: "The dialect of the body: `chat` (default), `responses` or `messages`",
        schema: { enum: ["chat", "responses", "messages"] },
      },
    ],
    body: { schema: Type.Union([ChatRequest, ResponsesRequest, MessagesRequest]) },
    answer: { description: "The quote", schema: quoteResource.schema },
    errors: {
      400: ["invalid_hex"],
      404: ["model_not_found"],
      503: ["no_eligible_offer", "chain_unavailable"],
    },
    handle: async ({ rpc, options, req, deps, query }) => {
      const dialect = quoteDialect(query);
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      const { quote } = await rpc.unary(
        QuoteService.method.createQuote,
        { body, dialect },
        options,
      );
      if (quote === undefined) throw new Error("CreateQuote answered without a quote");
      return { body: quoteResource.view(quote) };
    },
  },
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
    handle: async ({ options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      await relayChat(deps.chat, req, res, body, options);
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
  {
    method: "GET",
    path: "/v1/requests/{id}",
    operationId: "getRequest",
    summary: "Get an inference request record (only the API key that made it)",
    tag: "inference",
    pathId: { description: "request id (X-Gateway-Request-Id)", schema: Hex32 },
    answer: { description: "The record", schema: requestResource.schema },
    errors: { 400: ["invalid_hex"], 404: ["request_not_found"] },
    handle: async ({ rpc, options, params }) => {
      const { request } = await rpc.unary(
        InferenceService.method.getRequest,
        { id: params[0] },
        options,
      );
      if (request === undefined) throw new Error("GetRequest answered without a record");
      return { body: requestResource.view(request) };
    },
  },
  {
    method: "GET",
    path: "/v1/requests/{id}/receipt",
    operationId: "getRequestReceipt",
    summary: "The signed usage receipt of a request (only the API key that made it)",
    description: [
      "EIP-712 `UsageReceipt` typed data over the request's closed record, wallet-ready",
      "(`eth_signTypedData_v4`; ethers' `verifyTypedData` without the `EIP712Domain` entry), and",
      "the gateway's receipt key's signature over it; `signer` is the address `GET /v1/gateway`",
      "publishes. Signed from the durable record when asked (deterministic: the same record,",
      "the same signature). Another key's request is 404 `request_not_found`, as the record;",
      "an open request 409 `request_not_closed`; one closed without a charge (void) 404",
      "`receipt_not_found`; a gateway without a receipt key 503 `receipts_unavailable`.",
    ].join("\n"),
    tag: "inference",
    pathId: { description: "request id (X-Gateway-Request-Id)", schema: Hex32 },
    answer: { description: "The signed receipt", schema: SignedUsageReceipt },
    errors: {
      400: ["invalid_hex"],
      404: ["request_not_found", "receipt_not_found"],
      409: ["request_not_closed"],
      503: ["receipts_unavailable"],
    },
    handle: async ({ rpc, options, params }) => {
      const answer = await rpc.unary(
        InferenceService.method.getRequestReceipt,
        { id: params[0] },
        options,
      );
      if (answer.receipt === undefined) throw new Error("GetRequestReceipt answered no receipt");
      return {
        body: {
          receipt: usageReceiptView(answer.receipt),
          signature: answer.signature,
          signer: answer.signer,
        },
      };
    },
  },
  {
    method: "GET",
    path: "/v1/permits/{id}",
    operationId: "getPermit",
    summary: "A permit's balance (API keys the permit's payer authorized)",
    tag: "inference",
    pathId: { description: "permit id", schema: Hex32 },
    answer: { description: "The balance", schema: permitBalanceResource.schema },
    errors: {
      400: ["invalid_hex"],
      402: ["permit_not_found"],
      403: ["permit_not_authorized"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, params }) => {
      const { permit } = await rpc.unary(
        InferenceService.method.getPermit,
        { permitId: params[0] },
        options,
      );
      if (permit === undefined) throw new Error("GetPermit answered without a permit");
      return { body: permitBalanceResource.view(permit) };
    },
  },
  {
    method: "GET",
    path: "/v1/permits/{id}/receipts",
    operationId: "listPermitReceipts",
    summary: "The signed usage receipts of a permit (API keys the permit's payer authorized)",
    description: [
      "Every charged request of the permit, whichever API key made it, in the order they closed,",
      "each as `GET /v1/requests/{id}/receipt` signs it, with its settlement: `status` and",
      "`batch_id`, the settlement batch that settled the charge (or is settling it). What settled",
      "on chain for the permit is the sum of the `charge` of its `settled` receipts",
      "(`gateway permit audit`). Pages: `limit` (1 to 100, default 50) and `starting_after` (the",
      "last `requestId` of the previous page); `has_more` says whether another page follows.",
    ].join("\n"),
    tag: "inference",
    pathId: { description: "permit id", schema: Hex32 },
    parameters: [
      {
        name: "limit",
        in: "query",
        required: false,
        description: "receipts per page, 1 to 100 (default 50)",
        schema: { type: "integer", minimum: 1, maximum: 100 },
      },
      {
        name: "starting_after",
        in: "query",
        required: false,
        description: "the last requestId of the previous page",
        schema: Hex32,
      },
    ],
    answer: { description: "The receipts", schema: PermitReceiptList },
    errors: {
      400: ["invalid_hex", "invalid_request"],
      402: ["permit_not_found"],
      403: ["permit_not_authorized"],
      503: ["chain_unavailable", "receipts_unavailable"],
    },
    handle: async ({ rpc, options, params, query }) => {
      const page = receiptsPage(query);
      const { receipts, hasMore } = await rpc.unary(
        InferenceService.method.listPermitReceipts,
        { permitId: params[0], ...page },
        options,
      );
      return {
        body: {
          object: "list",
          data: receipts.map((r) => ({
            object: "usage_receipt",
            receipt: usageReceiptView(r.receipt!),
            signature: r.signature,
            signer: r.signer,
            settlement: settlementOfRequest.view(r.settlement ?? {}),
          })),
          has_more: hasMore,
        },
      };
    },
  },
  withBody(AuthorizationChallengeRequest, {
    method: "POST",
    path: "/v1/permit-authorizations/challenge",
    operationId: "createAuthorizationChallenge",
    summary: "EIP-712 AuthorizeKey typed data for a payer to sign for the calling API key",
    description:
      "The calling key's public id is filled in as `keyId`, with a random single-use nonce. `permitId` absent or all zeros: every permit of the payer.",
    tag: "permits",
    answer: typedDataAnswer(AuthorizeKeyTypedData),
    errors: { 400: ["invalid_hex", "authorization_expiry_too_far", "authorization_cap_invalid"] },
    handle: async ({ rpc, options, body }) => {
      const { typedData } = await rpc.unary(
        PermitService.method.createAuthorizationChallenge,
        {
          payer: body.payer,
          permitId: body.permitId ?? "",
          expiresAt: seconds(body.expiresAt),
          totalCap: body.totalCap ?? "",
          perRequestCap: body.perRequestCap ?? "",
        },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: authorizeKeyTypedDataView(typedData) };
    },
  }),
  withBody(AuthorizeKeyRequest, {
    method: "POST",
    path: "/v1/permit-authorizations",
    operationId: "authorizeKey",
    summary: "Store a payer's signed AuthorizeKey for the calling API key",
    description:
      "Verified against the payer (ECDSA, or ERC-1271 for a contract wallet); the nonce is consumed atomically. Refused 403 authorization_revoked when the payer has since revoked everything it signed up to a time at or after its issuedAt (POST /v1/payers/{payer}/authorizations/revoke). Effective at once on every gateway sharing its database (within API_KEY_CACHE_MS on one that cannot hear the database's signals: gateway_authority_listener_up 0).",
    tag: "permits",
    answer: { description: "The authorization", schema: PermitAuthorizationEnvelope },
    errors: {
      400: ["invalid_hex", "authorization_expiry_too_far", "authorization_cap_invalid"],
      401: ["invalid_signature"],
      403: ["wrong_deployment", "authorization_revoked"],
      409: ["nonce_used", "challenge_expired"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, body }) => {
      const { authorization } = await rpc.unary(
        PermitService.method.authorizeKey,
        {
          payer: body.payer,
          permitId: body.permitId,
          expiresAt: BigInt(body.expiresAt),
          issuedAt: BigInt(body.issuedAt),
          deployment: body.deployment ?? "",
          totalCap: body.totalCap ?? "",
          perRequestCap: body.perRequestCap ?? "",
          nonce: body.nonce,
          signature: body.signature,
        },
        options,
      );
      if (authorization === undefined) throw new Error("AuthorizeKey answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  }),
  {
    method: "GET",
    path: "/v1/permit-authorizations",
    operationId: "listAuthorizations",
    summary: "The authorizations the calling API key holds, newest first",
    tag: "permits",
    parameters: [statusFilter(enumWords(PermitAuthorizationStatusSchema))],
    answer: { description: "The authorizations", schema: PermitAuthorizationList },
    errors: { 400: ["invalid_request"] },
    handle: async ({ rpc, options, query }) => {
      const { authorizations } = await rpc.unary(
        PermitService.method.listAuthorizations,
        { status: statusOf(PermitAuthorizationStatusSchema, query) },
        options,
      );
      return {
        body: { object: "list", data: authorizations.map(permitAuthorizationResource.view) },
      };
    },
  },
  {
    method: "DELETE",
    path: "/v1/permit-authorizations/{id}",
    operationId: "revokeAuthorization",
    summary: "Revoke an authorization the calling API key holds",
    description:
      "Refused at once on every gateway sharing its database (within API_KEY_CACHE_MS on one that cannot hear the database's signals). Revoking again answers it unchanged.",
    tag: "permits",
    pathId: authorizationId,
    answer: { description: "The authorization, revoked", schema: PermitAuthorizationEnvelope },
    errors: { 404: ["authorization_not_found"] },
    handle: async ({ rpc, options, params, req }) => {
      req.resume(); // a DELETE takes no body
      const { authorization } = await rpc.unary(
        PermitService.method.revokeAuthorization,
        { id: params[0] },
        options,
      );
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  },
  {
    method: "POST",
    path: "/v1/permit-authorizations/{id}/revocation-challenge",
    operationId: "createRevocationChallenge",
    summary: "EIP-712 RevokeKeyAuthorization typed data for the payer to sign (no body)",
    tag: "permits",
    pathId: authorizationId,
    answer: typedDataAnswer(RevokeKeyAuthorizationTypedData),
    errors: { 404: ["authorization_not_found"] },
    handle: async ({ rpc, options, params, req }) => {
      req.resume(); // the typed data is fixed by the authorization: no body
      const { typedData } = await rpc.unary(
        PermitService.method.createRevocationChallenge,
        { id: params[0] },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: revokeTypedDataView(typedData) };
    },
  },
  withBody(RevokeBySignatureRequest, {
    method: "POST",
    path: "/v1/permit-authorizations/{id}/revoke",
    operationId: "revokeAuthorizationBySignature",
    summary: "Revoke an authorization with the payer's signature (any API key may submit it)",
    tag: "permits",
    pathId: authorizationId,
    answer: { description: "The authorization, revoked", schema: PermitAuthorizationEnvelope },
    errors: {
      401: ["invalid_signature"],
      404: ["authorization_not_found"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, params, body }) => {
      const { authorization } = await rpc.unary(
        PermitService.method.revokeAuthorizationBySignature,
        { id: params[0], signature: body.signature },
        options,
      );
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  }),
  withBody(ListPayerAuthorizationsRequest, {
    method: "POST",
    path: "/v1/payers/{payer}/authorizations",
    operationId: "listPayerAuthorizations",
    summary:
      "Every authorization made for a payer's address, on the payer's signature (no API key)",
    description: [
      "Whichever key holds them, newest first, revoked and expired ones included. The credential is",
      "the payer's EIP-712 signature over `ListAuthorizations(address payer, string deployment,",
      "uint64 expiresAt)` in the gateway's domain, which the payer's tool builds itself (there is no",
      "challenge): a read token usable by whoever holds it until `expiresAt`, at most 10 minutes",
      "ahead. Pages: `limit` (1 to 100, default 50) and `startingAfter` (the last id of the previous",
      "page); `has_more` says whether another page follows. Bodies above 4096 bytes are refused.",
    ].join("\n"),
    tag: "permits",
    auth: "none",
    pathParams: [payerParameter],
    bodyLimitBytes: payerRequestMaxBytes,
    answer: { description: "The payer's authorizations", schema: PayerAuthorizationList },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature", "signature_expired"],
      403: ["wrong_deployment"],
      503: ["chain_unavailable", "database_unavailable"],
    },
    handle: async ({ rpc, options, params, body }) => {
      const { authorizations, hasMore } = await rpc.unary(
        PermitService.method.listPayerAuthorizations,
        {
          payer: params[0],
          deployment: body.deployment,
          expiresAt: BigInt(body.expiresAt),
          signature: body.signature,
          limit: body.limit ?? 0,
          startingAfter: body.startingAfter ?? "",
        },
        options,
      );
      return {
        body: {
          object: "list",
          data: authorizations.map(permitAuthorizationResource.view),
          has_more: hasMore,
        },
      };
    },
  }),
  withBody(RevokePayerAuthorizationsRequest, {
    method: "POST",
    path: "/v1/payers/{payer}/authorizations/revoke",
    operationId: "revokePayerAuthorizations",
    summary:
      "Revoke a payer's authorizations by key, by permit or all, on its signature (no API key)",
    description: [
      "The payer's EIP-712 signature over `RevokeAuthorizations(address payer, string deployment,",
      "string keyId, bytes32 permitId, uint64 before)` in the gateway's domain, built by the payer's",
      "tool (no challenge): revokes every authorization of the payer issued at or before `before`",
      "(at most a minute ahead of the gateway's clock) of the key `keyId` (empty: any) naming the",
      "permit `permitId` (zero: any). With neither (revoke all) the payer's epoch is raised to",
      "`before`: an `AuthorizeKey` issued at or before it, signed but not yet submitted, is refused",
      "403 `authorization_revoked` when submitted. Replaying the signature revokes nothing issued",
      "after `before`. Refused at once on this gateway. Bodies above 4096 bytes are refused.",
    ].join("\n"),
    tag: "permits",
    auth: "none",
    pathParams: [payerParameter],
    bodyLimitBytes: payerRequestMaxBytes,
    answer: { description: "What was revoked", schema: PayerRevocation },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature"],
      403: ["wrong_deployment"],
      503: ["chain_unavailable", "database_unavailable"],
    },
    handle: async ({ rpc, options, params, body }) => {
      const outcome = await rpc.unary(
        PermitService.method.revokePayerAuthorizations,
        {
          payer: params[0],
          deployment: body.deployment,
          keyId: body.keyId ?? "",
          permitId: body.permitId ?? "",
          before: BigInt(body.before),
          signature: body.signature,
        },
        options,
      );
      return {
        body: {
          object: "payer_revocation",
          revoked: Number(outcome.revoked),
          authorizations: outcome.authorizations.map(permitAuthorizationResource.view),
          epoch: outcome.epoch === undefined ? null : Number(outcome.epoch),
        },
      };
    },
  }),
  withBody(ChallengeRequest, {
    method: "POST",
    path: "/v1/provider-offers/challenge",
    operationId: "createRegistrationChallenge",
    summary: "EIP-712 typed data for the offer's operator to sign",
    tag: "provider",
    answer: typedDataAnswer(RegistrationTypedData),
    errors: {
      400: ["invalid_hex", "challenge_expiry_invalid"],
      404: ["offer_not_found"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, body }) => {
      const { typedData } = await rpc.unary(
        ProviderService.method.createRegistrationChallenge,
        {
          offerId: body.offerId,
          endpointUrl: body.endpointUrl,
          nonce: body.nonce ?? "",
          expiresAt: seconds(body.expiresAt),
          endpointToken: body.endpointToken ?? "",
        },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: typedDataView(typedData) };
    },
  }),
  withBody(RegisterRequest, {
    method: "POST",
    path: "/v1/provider-offers/register",
    operationId: "registerEndpoint",
    summary: "Register the offer's private endpoint with the signed challenge",
    description: "The nonce is consumed atomically; the endpoint URL and token are never returned.",
    tag: "provider",
    answer: { description: "The offer", schema: OfferEnvelope },
    errors: {
      400: ["invalid_hex", "challenge_expiry_invalid", "endpoint_not_allowed"],
      401: ["invalid_signature"],
      403: ["not_offer_operator"],
      404: ["offer_not_found"],
      409: ["nonce_used"],
      503: ["chain_unavailable", "upstream_unavailable"],
    },
    handle: async ({ rpc, options, body }) => {
      const { offer } = await rpc.unary(
        ProviderService.method.registerEndpoint,
        {
          offerId: body.offerId,
          endpointUrl: body.endpointUrl,
          nonce: body.nonce,
          expiresAt: BigInt(body.expiresAt),
          signature: body.signature,
          endpointToken: body.endpointToken ?? "",
        },
        options,
      );
      if (offer === undefined) throw new Error("registration answered without an offer");
      return { body: { offer: offerResource.view(offer) } };
    },
  }),
  {
    method: "GET",
    path: "/v1/provider-offers/{id}/health",
    operationId: "getOfferHealth",
    summary: "An offer's health",
    tag: "provider",
    pathId: { description: "offer id", schema: Hex32 },
    answer: { description: "The health", schema: offerHealthResource.schema },
    errors: {
      400: ["invalid_hex"],
      404: ["offer_not_found"],
      503: ["chain_unavailable", "upstream_unavailable"],
    },
    handle: async ({ rpc, options, params }) => {
      const { health } = await rpc.unary(
        ProviderService.method.getOfferHealth,
        { offerId: params[0] },
        options,
      );
      if (health === undefined) throw new Error("health answered without a health record");
      return { body: offerHealthResource.view(health) };
    },
  },
  {
    method: "POST",
    path: "/v1/provider-offers/{id}/verify",
    operationId: "verifyOffer",
    summary: "Refresh the offer's verification (no body)",
    description:
      "Checks the endpoint: model listed, one-token completion, stream with usage, usage claims the gateway's own count of known prompts does not contradict (JSON and streamed; else 422 usage_diverged). Runs are shared per offer and at most one per `VERIFY_MIN_INTERVAL_SECONDS` across the fleet: inside that bound the last run's outcome is answered (`verification.replayed`; a failure's message says when it ran), and while the endpoint's first run is under way on another gateway, 429 `rate_limited`. A wrong answer names the check (422) and clears the verification; a run that gets no answer (timeout, refused connection, 429, 5xx) is 502 `endpoint_unreachable` and leaves a standing verification in place.",
    tag: "provider",
    pathId: { description: "offer id", schema: Hex32 },
    answer: { description: "The offer, verified", schema: VerifiedOffer },
    errors: {
      400: ["invalid_hex", "endpoint_not_allowed"],
      404: ["offer_not_found", "model_not_found"],
      422: [
        "model_not_listed",
        "completion_failed",
        "stream_failed",
        "usage_missing",
        "usage_diverged",
      ],
      502: ["endpoint_unreachable"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, params, req }) => {
      req.resume(); // the spec's verify takes no body
      const { offer, verification } = await rpc.unary(
        ProviderService.method.verifyOffer,
        { offerId: params[0] },
        options,
      );
      if (offer === undefined) throw new Error("verify answered without an offer");
      return {
        body: {
          offer: offerResource.view(offer),
          ...(verification === undefined
            ? {}
            : { verification: verificationRunResource.view(verification) }),
        },
      };
    },
  },
  withBody(KeyBindingChallengeRequest, {
    method: "POST",
    path: "/v1/provider-offers/{id}/key-bindings/challenge",
    operationId: "createKeyBindingChallenge",
    summary:
      "EIP-712 BindOfferKey typed data for the offer's operator to sign for the calling API key",
    description:
      "The offer's operator as the chain names it now, the calling key's public id and a random single-use nonce are filled in. An empty body is `{}`.",
    tag: "provider",
    optional: true,
    pathId: offerIdParameter,
    answer: typedDataAnswer(BindOfferKeyTypedData),
    errors: { 400: ["invalid_hex"], 404: ["offer_not_found"], 503: ["chain_unavailable"] },
    handle: async ({ rpc, options, params, body }) => {
      const { typedData } = await rpc.unary(
        ProviderService.method.createKeyBindingChallenge,
        { offerId: params[0], expiresAt: seconds(body.expiresAt) },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: bindOfferKeyTypedDataView(typedData) };
    },
  }),
  withBody(BindKeyRequest, {
    method: "POST",
    path: "/v1/provider-offers/{id}/key-bindings",
    operationId: "bindKey",
    summary: "Store the operator's signed BindOfferKey for the calling API key",
    description:
      "Verified against the offer's operator as the chain names it now (ECDSA, or ERC-1271 for a contract operator); the nonce is consumed atomically. The key may then read the offer's earnings.",
    tag: "provider",
    pathId: offerIdParameter,
    answer: { description: "The binding", schema: OfferKeyBindingEnvelope },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature"],
      404: ["offer_not_found"],
      409: ["nonce_used"],
      503: ["chain_unavailable"],
    },
    handle: async ({ rpc, options, params, body }) => {
      const { binding } = await rpc.unary(
        ProviderService.method.bindKey,
        {
          offerId: params[0],
          expiresAt: BigInt(body.expiresAt),
          nonce: body.nonce,
          signature: body.signature,
        },
        options,
      );
      if (binding === undefined) throw new Error("BindKey answered without a binding");
      return { body: { binding: offerKeyBindingResource.view(binding) } };
    },
  }),
  {
    method: "DELETE",
    path: "/v1/provider-offers/{id}/key-bindings/{bindingId}",
    operationId: "revokeKeyBinding",
    summary: "Revoke a key binding the calling API key holds on the offer",
    description:
      "Effective at once on every gateway sharing the database. Revoking again answers it unchanged.",
    tag: "provider",
    pathId: offerIdParameter,
    pathParams: [
      {
        name: "bindingId",
        in: "path",
        required: true,
        description: "binding id (`okb_...`)",
        schema: { type: "string" },
      },
    ],
    answer: { description: "The binding, revoked", schema: OfferKeyBindingEnvelope },
    errors: { 400: ["invalid_hex"], 404: ["binding_not_found"] },
    handle: async ({ rpc, options, params, req }) => {
      req.resume(); // a DELETE takes no body
      const { binding } = await rpc.unary(
        ProviderService.method.revokeKeyBinding,
        { offerId: params[0], id: params[1] },
        options,
      );
      if (binding === undefined) throw new Error("revocation answered without a binding");
      return { body: { binding: offerKeyBindingResource.view(binding) } };
    },
  },
  {
    method: "GET",
    path: "/v1/provider-offers/{id}/earnings",
    operationId: "getOfferEarnings",
    summary:
      "An offer's earnings by settlement state (its operator's bound keys, or the settlement operator)",
    description:
      "Charges completed in [from, to) by settlement state (unsettled, settling, settled, unsettleable with the reasons), and the batches carrying them (newest first, at most 100). Only an API key the offer's current operator bound to the offer (POST .../key-bindings), or the settlement operator token; any other key is 403 `not_offer_operator`.",
    tag: "provider",
    auth: "apiKeyOrOperator",
    pathId: offerIdParameter,
    parameters: [
      secondsParameter("from", "Unix seconds, inclusive (default `to` less 30 days)"),
      secondsParameter(
        "to",
        "Unix seconds, exclusive (default now); the window spans at most 366 days (else 400 `invalid_request`)",
      ),
    ],
    answer: { description: "The earnings", schema: offerEarningsResource.schema },
    errors: {
      400: ["invalid_hex", "invalid_request"],
      403: ["not_offer_operator"],
      404: ["offer_not_found"],
    },
    handle: async ({ rpc, options, params, query }) => {
      const from = integerQuery(query, "from");
      const to = integerQuery(query, "to");
      const { earnings } = await rpc.unary(
        ProviderService.method.getOfferEarnings,
        {
          offerId: params[0],
          ...(from === undefined ? {} : { from: BigInt(from) }),
          ...(to === undefined ? {} : { to: BigInt(to) }),
        },
        options,
      );
      if (earnings === undefined) throw new Error("GetOfferEarnings answered without earnings");
      return { body: offerEarningsResource.view(earnings) };
    },
  },
  {
    method: "GET",
    path: "/settlements/batches",
    operationId: "listSettlementBatches",
    summary: "The most recent settlement batches, newest first (settlement operator)",
    tag: "settlement",
    auth: "operator",
    parameters: [
      {
        name: "limit",
        in: "query",
        required: false,
        description: "At most this many (default 50, at most 500; else 400 `invalid_request`).",
        schema: { type: "integer", minimum: 1, maximum: 500 },
      },
      statusFilter(storedBatchStates),
    ],
    answer: { description: "The batches", schema: SettlementBatchList },
    errors: { 400: ["invalid_request"], 503: ["database_unavailable"] },
    handle: async ({ rpc, options, query }) => {
      const limit = integerQuery(query, "limit");
      const { batches } = await rpc.unary(
        SettlementService.method.listBatches,
        {
          ...(limit === undefined ? {} : { limit: Math.min(limit, 4294967295) }),
          status: statusOf(BatchStatusSchema, query),
        },
        options,
      );
      return { body: { object: "list", data: batches.map(batchRecordResource.view) } };
    },
  },
  withBody(FlushRequest, {
    method: "POST",
    path: "/settlements/flush",
    operationId: "flushSettlement",
    summary: "Settle unsettled charges on chain now (settlement worker)",
    description:
      "Safe to call concurrently (another flush in progress: `busy: true`) and after a crash. An empty body is `{}`.",
    tag: "settlement",
    auth: "operator",
    optional: true,
    answer: { description: "What the flush did", schema: flushResource.schema },
    errors: { 503: ["settlement_unavailable", "chain_unavailable", "database_unavailable"] },
    handle: async ({ rpc, options, body }) => {
      const maxRequests = body.maxRequests ?? body.max_requests;
      const dryRun = body.dryRun ?? body.dry_run;
      const response = await rpc.unary(
        SettlementService.method.flush,
        { ...(maxRequests == null ? {} : { maxRequests }), dryRun: dryRun === true },
        options,
      );
      return { body: flushResource.view(response) };
    },
  }),
];

/** `?limit=&starting_after=` of the receipts list (400 `invalid_request` on a bad limit). */
function receiptsPage(query: string): { limit: number; startingAfter: string } {
  const params = new URLSearchParams(query);
  const limit = params.get("limit");
  if (limit !== null && !/^[1-9]\d{0,2}$/.test(limit))
    throw new GatewayError("invalid_request", "'limit' must be an integer from 1 to 100");
  return {
    limit: limit === null ? 0 : Number(limit),
    startingAfter: params.get("starting_after") ?? "",
  };
}

/** Unix seconds of an optional request member, for an RPC's optional int64. */
function seconds(value: number | null | undefined): bigint | undefined {
  return value === undefined || value === null ? undefined : BigInt(value);
}
