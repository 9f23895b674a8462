/**
 * The OpenAPI 3.1 description of the REST facade (issue 12): every route `facade.ts` serves,
 * plus `GET /metrics`, which the server answers before the facade. It is served as is at
 * `GET /openapi.json`, validated as OpenAPI 3.1 by `npm run check:openapi`, and
 * test/openapi.test.ts sends real requests to every route and checks each answer against it,
 * and that every route of the facade is described here.
 *
 * Built by small helpers rather than written out: every error response lists the codes the
 * route can answer (DESIGN.md section 5, docs/decisions.md), with the one `type` its status
 * carries, so a code a route starts answering has to be added here first.
 */

/** A JSON Schema 2020-12 object (OpenAPI 3.1's dialect). */
export type JsonSchema = { readonly [keyword: string]: unknown };

/** The parts of an OpenAPI 3.1 document this one uses. */
export interface OpenApiDocument {
  readonly openapi: "3.1.0";
  readonly info: {
    readonly title: string;
    readonly version: string;
    readonly description: string;
    readonly license: { readonly name: string; readonly identifier: string };
  };
  readonly jsonSchemaDialect: string;
  readonly servers: readonly { readonly url: string; readonly description: string }[];
  readonly tags: readonly { readonly name: string; readonly description: string }[];
  readonly security: readonly Record<string, readonly string[]>[];
  readonly paths: Record<string, Record<string, Operation>>;
  readonly components: {
    readonly schemas: Record<string, JsonSchema>;
    readonly responses: Record<string, Response>;
    readonly parameters: Record<string, Parameter>;
    readonly headers: Record<string, Header>;
    readonly securitySchemes: Record<string, unknown>;
  };
}

export interface Operation {
  readonly operationId: string;
  readonly summary: string;
  readonly description?: string;
  readonly tags: readonly string[];
  readonly security?: readonly Record<string, readonly string[]>[];
  readonly parameters?: readonly (Parameter | Ref)[];
  readonly requestBody?: {
    readonly required: boolean;
    readonly content: Record<string, { readonly schema: JsonSchema }>;
  };
  readonly responses: Record<string, Response | Ref>;
}

export interface Parameter {
  readonly name: string;
  readonly in: "path" | "query" | "header";
  readonly required: boolean;
  readonly description: string;
  readonly schema: JsonSchema;
}

export interface Header {
  readonly description: string;
  readonly required: boolean;
  readonly schema: JsonSchema;
}

export interface Response {
  readonly description: string;
  readonly headers?: Record<string, Header | Ref>;
  readonly content?: Record<string, MediaType>;
}

export interface MediaType {
  readonly schema: JsonSchema;
  /** text/event-stream: the schema of each event's `data` (JSON), besides `[DONE]`. */
  readonly "x-sse-data"?: JsonSchema;
}

export interface Ref {
  readonly $ref: string;
}

const schema = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });
const ref = (kind: "responses" | "parameters" | "headers", name: string): Ref => ({
  $ref: `#/components/${kind}/${name}`,
});

/** The `type` of an error body is a function of its HTTP status (src/domain/errors.ts). */
export const errorTypes: Readonly<Record<number, string>> = {
  400: "invalid_request_error",
  401: "authentication_error",
  402: "payment_required",
  403: "permission_error",
  404: "not_found_error",
  405: "invalid_request_error",
  408: "invalid_request_error",
  409: "conflict_error",
  413: "invalid_request_error",
  415: "invalid_request_error",
  422: "invalid_request_error",
  429: "rate_limit_error",
  500: "api_error",
  501: "api_error",
  502: "api_error",
  503: "service_unavailable",
};

const reasons: Readonly<Record<number, string>> = {
  400: "Invalid request",
  401: "Missing or invalid credentials (with `WWW-Authenticate: Bearer`)",
  402: "The permit does not cover the request",
  403: "Not allowed",
  404: "Not found",
  405: "Method not allowed",
  408: "The request body did not arrive within the body timeout",
  409: "Conflict",
  413: "The request body is larger than BODY_LIMIT_BYTES",
  415: "The request body is not application/json",
  422: "Unprocessable",
  429: "Too many requests",
  500: "Internal error (the message never carries details)",
  502: "The provider failed",
  503: "Unavailable: a dependency cannot be asked, or the gateway is shutting down",
};

const hex32: JsonSchema = { type: "string", pattern: "^0x[0-9a-fA-F]{64}$" };
const requestIdHeader: Ref = ref("headers", "X-Request-Id");

/**
 * An error response whose body's `code` is one of `codes` and whose `type` is the status's.
 * 503s may come before the request id is assigned (a request refused while shutting down).
 */
function errorResponse(status: number, codes: readonly string[], extra = ""): Response {
  const headers: Record<string, Header | Ref> = {
    "X-Request-Id": status === 503 ? ref("headers", "X-Request-Id-Optional") : requestIdHeader,
  };
  if (status === 401) headers["WWW-Authenticate"] = ref("headers", "WWW-Authenticate");
  if (status === 429) {
    headers["Retry-After"] = codes.every((c) => c === "rate_limited")
      ? ref("headers", "Retry-After")
      : ref("headers", "Retry-After-Optional");
  }
  return {
    description: `${reasons[status] ?? "Error"}: ${codes.map((c) => `\`${c}\``).join(", ")}${extra}`,
    headers,
    content: {
      "application/json": {
        schema: {
          allOf: [schema("Error")],
          properties: {
            error: {
              properties: {
                code: codes.length === 1 ? { const: codes[0] } : { enum: [...codes] },
                type: { const: errorTypes[status] },
              },
            },
          },
        },
      },
    },
  };
}

type Codes = Readonly<Record<number, readonly string[]>>;

/** Merges code lists by status (later lists add codes, never drop them). */
function codes(...lists: Codes[]): Codes {
  const merged: Record<number, string[]> = {};
  for (const list of lists) {
    for (const [status, cs] of Object.entries(list)) {
      const into = (merged[Number(status)] ??= []);
      for (const c of cs) if (!into.includes(c)) into.push(c);
    }
  }
  return merged;
}

/** What any route can answer. */
const anyRoute: Codes = { 500: ["internal_error"], 503: ["shutting_down"] };
/** Routes behind the API key (the key is checked when the RPC is called, after the body). */
const apiKeyed: Codes = {
  401: ["missing_api_key", "invalid_api_key"],
  429: ["rate_limited"],
  503: ["database_unavailable"],
};
/** Routes with a JSON body (read and size-checked before the credentials). */
const withBody: Codes = {
  400: ["invalid_request", "invalid_json"],
  408: ["request_timeout"],
  413: ["request_too_large"],
  415: ["unsupported_media_type"],
};
/** Routes with a `{id}` path parameter (malformed percent-encoding). */
const withPathId: Codes = { 400: ["invalid_request"] };

function errorResponses(list: Codes, options: { body?: boolean } = {}): Record<string, Response> {
  const out: Record<string, Response> = {};
  for (const [status, cs] of Object.entries(list)) {
    out[status] = errorResponse(
      Number(status),
      cs,
      Number(status) === 400 && options.body === true
        ? " (`invalid_request` also for a JSON body nested deeper than MAX_JSON_DEPTH or with an array longer than MAX_JSON_ARRAY_ITEMS, refused before anything is reserved)"
        : "",
    );
  }
  return out;
}

/** The chat route's errors, which every dialect route shares (DESIGN.md section 9). */
const chatCodes = codes(anyRoute, apiKeyed, withBody, {
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
  ],
  403: ["permit_not_authorized"],
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
});

/**
 * A dialect route's errors (DESIGN.md section 9): the same statuses and codes as the chat route,
 * in the dialect's own error shape (`schemaName`), the gateway's code at `error.code`.
 */
function dialectErrorResponses(list: Codes, schemaName: string): Record<string, Response> {
  const out: Record<string, Response> = {};
  for (const [status, cs] of Object.entries(errorResponses(list, { body: true }))) {
    const codes = list[Number(status)] ?? [];
    out[status] = {
      ...cs,
      content: {
        "application/json": {
          schema: {
            allOf: [schema(schemaName)],
            properties: {
              error: {
                properties: {
                  code: codes.length === 1 ? { const: codes[0] } : { enum: [...codes] },
                },
              },
            },
          },
        },
      },
    };
  }
  return out;
}

/** Every operation takes `X-Request-Id` (echoed in the answer's header of the same name). */
function withRequestIds(
  paths: Record<string, Record<string, Operation>>,
): Record<string, Record<string, Operation>> {
  const requestId = ref("parameters", "X-Request-Id");
  return Object.fromEntries(
    Object.entries(paths).map(([path, item]) => [
      path,
      Object.fromEntries(
        Object.entries(item).map(([method, op]) => [
          method,
          { ...op, parameters: [...(op.parameters ?? []), requestId] },
        ]),
      ),
    ]),
  );
}

function jsonResponse(description: string, body: JsonSchema): Response {
  return {
    description,
    headers: { "X-Request-Id": requestIdHeader },
    content: { "application/json": { schema: body } },
  };
}

const idParam = (description: string, shape: JsonSchema = { type: "string" }): Parameter => ({
  name: "id",
  in: "path",
  required: true,
  description,
  schema: shape,
});

const statusFilter = (values: readonly string[]): Parameter => ({
  name: "status",
  in: "query",
  required: false,
  description: "Only entries with this status (an unknown value is 400 `invalid_request`).",
  schema: { type: "string", enum: [...values] },
});

const jsonBody = (body: JsonSchema, required = true) => ({
  required,
  content: { "application/json": { schema: body } },
});

const nullable = (shape: JsonSchema): JsonSchema => ({ oneOf: [shape, { type: "null" }] });
const decimal: JsonSchema = schema("Decimal");
const seconds: JsonSchema = schema("UnixSeconds");

const modelProperties = {
  id: { type: "string", description: "public model id (catalog id, else the ModelID)" },
  object: { const: "model" },
  model_id: schema("Hex32"),
  repository: { type: "string" },
  revision: { type: "string" },
  task: { type: "string" },
  creator: schema("Address"),
  credit_token: schema("Address"),
  pool_id: schema("Hex32"),
  position_token_id: { type: "string", pattern: "^[0-9]+$" },
  provider_count: { type: "integer", minimum: 0 },
  status: { enum: ["pending", "active", "paused", "retired"] },
  aliases: { type: "array", items: { type: "string" } },
} as const;

const chatResponseHeaders: Record<string, Header | Ref> = {
  "X-Request-Id": requestIdHeader,
  "X-Gateway-Request-Id": ref("headers", "X-Gateway-Request-Id"),
  "X-Gateway-Quote-Id": ref("headers", "X-Gateway-Quote-Id"),
  "X-Gateway-Offer-Id": ref("headers", "X-Gateway-Offer-Id"),
  "X-Gateway-Tariff-Version": ref("headers", "X-Gateway-Tariff-Version"),
};

/** POST of a dialect route (DESIGN.md section 9): the chat route's parameters, headers and codes. */
function dialectOperation(op: {
  operationId: string;
  summary: string;
  description: string;
  request: string;
  answer: string;
  error: string;
}): Record<string, Operation> {
  return {
    post: {
      operationId: op.operationId,
      summary: op.summary,
      description: op.description,
      tags: ["inference"],
      parameters: [
        ref("parameters", "X-Gateway-Permit"),
        ref("parameters", "X-Gateway-Quote"),
        ref("parameters", "Idempotency-Key"),
      ],
      requestBody: jsonBody(schema(op.request)),
      responses: {
        "200": {
          description: 'The answer: JSON, or the dialect\'s event stream with `"stream": true`',
          headers: {
            ...chatResponseHeaders,
            "X-Gateway-Credits-Charged": ref("headers", "X-Gateway-Credits-Charged-Json"),
            Trailer: ref("headers", "Trailer"),
          },
          content: {
            "application/json": { schema: schema(op.answer) },
            "text/event-stream": {
              schema: {
                type: "string",
                description:
                  "`event: <type>` and `data: <json>` per event (see x-sse-data); the last carries `x_gateway`",
              },
              "x-sse-data": schema("DialectEvent"),
            },
          },
        },
        ...dialectErrorResponses(chatCodes, op.error),
      },
    },
  };
}

export const openApiDocument: OpenApiDocument = {
  openapi: "3.1.0",
  info: {
    title: "Model Market Gateway",
    version: "2.0.0",
    license: { name: "Apache 2.0", identifier: "Apache-2.0" },
    description: [
      "OpenAI-compatible gateway for on-chain model markets: catalog, quotes, metered chat",
      "completions (JSON and server-sent events), provider onboarding and settlement.",
      "",
      "Every error answer has the body `{error: {code, type, message}}`; each response below",
      "lists the codes a route answers with that status. Besides those: a path no route",
      "serves is 404 `route_not_found` and a method a path does not serve is 405",
      "`method_not_allowed` (components `RouteNotFound`, `MethodNotAllowed`). Money is a",
      "decimal integer string in the credit token's base units; times are Unix seconds;",
      "absent optional values are `null`. Every answer but `/metrics` carries `X-Request-Id`.",
      "Requests with an API key are limited per key (rate and concurrent streams): 429",
      "`rate_limited` with `Retry-After` (whole seconds). A request body that does not arrive",
      "within the body timeout is 408 `request_timeout`.",
    ].join("\n"),
  },
  jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
  servers: [{ url: "http://127.0.0.1:8080", description: "a local gateway (`npm start`)" }],
  tags: [
    { name: "operations", description: "liveness, readiness, metrics, this document" },
    { name: "catalog", description: "models and offers, as indexed from the chain" },
    { name: "inference", description: "quotes, chat completions, request records, permits" },
    {
      name: "permits",
      description:
        "spending authority: API keys a payer authorized (EIP-712 AuthorizeKey) to spend its permits",
    },
    { name: "provider", description: "provider onboarding (EIP-712) and offer health" },
    { name: "settlement", description: "settlement on chain (operator token)" },
  ],
  security: [{ apiKey: [] }],
  paths: withRequestIds({
    "/health": {
      get: {
        operationId: "getHealth",
        summary: "Liveness",
        tags: ["operations"],
        security: [],
        responses: {
          "200": jsonResponse("The process is up", schema("Health")),
          ...errorResponses(anyRoute),
        },
      },
    },
    "/ready": {
      get: {
        operationId: "getReady",
        summary: "Readiness: the database and the chain answer",
        description:
          "503 `unavailable` with the failing check, or `shutting_down` from SIGTERM on (before anything else stops).",
        tags: ["operations"],
        security: [],
        responses: {
          "200": jsonResponse("Ready", schema("Readiness")),
          "503": {
            description: "Not ready: a check failed, or the gateway is shutting down",
            headers: { "X-Request-Id": ref("headers", "X-Request-Id-Optional") },
            content: { "application/json": { schema: schema("Readiness") } },
          },
          "500": errorResponse(500, ["internal_error"]),
        },
      },
    },
    "/metrics": {
      get: {
        operationId: "getMetrics",
        summary: "Prometheus metrics",
        description:
          "Served on the main port unless METRICS_PORT is set, then only on that port (here a 404). No credentials, no X-Request-Id.",
        tags: ["operations"],
        security: [],
        responses: {
          "200": {
            description: "Prometheus text exposition format",
            content: { "text/plain": { schema: { type: "string" } } },
          },
          "404": errorResponse(404, ["route_not_found"], " (METRICS_PORT is set)"),
          "503": errorResponse(503, ["shutting_down"]),
        },
      },
    },
    "/openapi.json": {
      get: {
        operationId: "getOpenApi",
        summary: "This document",
        tags: ["operations"],
        security: [],
        responses: {
          "200": jsonResponse("The OpenAPI 3.1 description of the REST facade", {
            type: "object",
            required: ["openapi", "info", "paths"],
          }),
          ...errorResponses(anyRoute),
        },
      },
    },
    "/v1/models": {
      get: {
        operationId: "listModels",
        summary: "List canonical models",
        tags: ["catalog"],
        parameters: [statusFilter(["pending", "active", "paused", "retired"])],
        responses: {
          "200": jsonResponse("The models", schema("ModelList")),
          ...errorResponses(codes(anyRoute, apiKeyed, { 400: ["invalid_request"] })),
        },
      },
    },
    "/v1/models/{id}": {
      get: {
        operationId: "getModel",
        summary: "Get one model with its offers",
        tags: ["catalog"],
        parameters: [ref("parameters", "ModelId")],
        responses: {
          "200": jsonResponse("The model", schema("ModelWithOffers")),
          ...errorResponses(codes(anyRoute, apiKeyed, withPathId, { 404: ["model_not_found"] })),
        },
      },
    },
    "/v1/models/{id}/offers": {
      get: {
        operationId: "listOffers",
        summary: "List the offers of a model",
        tags: ["catalog"],
        parameters: [ref("parameters", "ModelId"), statusFilter(["active", "paused", "retired"])],
        responses: {
          "200": jsonResponse("The offers", schema("OfferList")),
          ...errorResponses(codes(anyRoute, apiKeyed, withPathId, { 404: ["model_not_found"] })),
        },
      },
    },
    "/v1/quotes": {
      post: {
        operationId: "createQuote",
        summary: "Quote the most a chat request can cost",
        description:
          "Bound to the request's model, messages, output limit, tools, tool choice and response format; single use; expires after 60 s. No permit needed. With `?dialect=responses` or `?dialect=messages` the body is a Responses or Messages request, and the quote binds the chat completion it translates to (DESIGN.md section 9).",
        tags: ["inference"],
        parameters: [
          {
            name: "dialect",
            in: "query",
            required: false,
            description: "The dialect of the body: `chat` (default), `responses` or `messages`",
            schema: { enum: ["chat", "responses", "messages"] },
          },
        ],
        requestBody: jsonBody({ type: "object" }),
        responses: {
          "200": jsonResponse("The quote", schema("Quote")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withBody, {
              400: ["invalid_hex"],
              404: ["model_not_found"],
              503: ["no_eligible_offer", "chain_unavailable"],
            }),
            { body: true },
          ),
        },
      },
    },
    "/v1/chat/completions": {
      post: {
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
        tags: ["inference"],
        parameters: [
          ref("parameters", "X-Gateway-Permit"),
          ref("parameters", "X-Gateway-Quote"),
          ref("parameters", "Idempotency-Key"),
        ],
        requestBody: jsonBody(schema("ChatRequest")),
        responses: {
          "200": {
            description: 'The completion: JSON, or an SSE stream with `"stream": true`',
            headers: {
              ...chatResponseHeaders,
              "X-Gateway-Credits-Charged": ref("headers", "X-Gateway-Credits-Charged-Json"),
              Trailer: ref("headers", "Trailer"),
            },
            content: {
              "application/json": { schema: schema("ChatCompletion") },
              "text/event-stream": {
                schema: {
                  type: "string",
                  description:
                    "`data: <json>` events (see x-sse-data), ending with `data: [DONE]` or, after a failure, an error event",
                },
                "x-sse-data": schema("ChatStreamEvent"),
              },
            },
          },
          ...errorResponses(chatCodes, { body: true }),
        },
      },
    },
    "/v1/responses": dialectOperation({
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
      request: "ResponsesRequest",
      answer: "ResponsesAnswer",
      error: "OpenAIError",
    }),
    "/v1/messages": dialectOperation({
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
      request: "MessagesRequest",
      answer: "MessagesAnswer",
      error: "AnthropicError",
    }),
    "/v1/requests/{id}": {
      get: {
        operationId: "getRequest",
        summary: "Get an inference request record (only the API key that made it)",
        tags: ["inference"],
        parameters: [idParam("request id (X-Gateway-Request-Id)", schema("Hex32"))],
        responses: {
          "200": jsonResponse("The record", schema("InferenceRequest")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, {
              400: ["invalid_hex"],
              404: ["request_not_found"],
            }),
          ),
        },
      },
    },
    "/v1/permits/{id}": {
      get: {
        operationId: "getPermit",
        summary: "A permit's balance (API keys the permit's payer authorized)",
        tags: ["inference"],
        parameters: [idParam("permit id", schema("Hex32"))],
        responses: {
          "200": jsonResponse("The balance", schema("PermitBalance")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, {
              400: ["invalid_hex"],
              402: ["permit_not_found"],
              403: ["permit_not_authorized"],
              503: ["chain_unavailable"],
            }),
          ),
        },
      },
    },
    "/v1/permit-authorizations/challenge": {
      post: {
        operationId: "createAuthorizationChallenge",
        summary: "EIP-712 AuthorizeKey typed data for a payer to sign for the calling API key",
        description:
          "The calling key's public id is filled in as `keyId`, with a random single-use nonce. `permitId` absent or all zeros: every permit of the payer.",
        tags: ["permits"],
        requestBody: jsonBody(schema("AuthorizationChallengeRequest")),
        responses: {
          "200": jsonResponse(
            "Wallet-ready typed data (eth_signTypedData_v4)",
            schema("AuthorizeKeyTypedData"),
          ),
          ...errorResponses(codes(anyRoute, apiKeyed, withBody, { 400: ["invalid_hex"] }), {
            body: true,
          }),
        },
      },
    },
    "/v1/permit-authorizations": {
      post: {
        operationId: "authorizeKey",
        summary: "Store a payer's signed AuthorizeKey for the calling API key",
        description:
          "Verified against the payer (ECDSA, or ERC-1271 for a contract wallet); the nonce is consumed atomically. Effective at once on this gateway; on others sharing its database within API_KEY_CACHE_MS.",
        tags: ["permits"],
        requestBody: jsonBody(schema("AuthorizeKeyRequest")),
        responses: {
          "200": jsonResponse("The authorization", schema("PermitAuthorizationEnvelope")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withBody, {
              400: ["invalid_hex"],
              401: ["invalid_signature"],
              409: ["nonce_used"],
              503: ["chain_unavailable"],
            }),
            { body: true },
          ),
        },
      },
      get: {
        operationId: "listAuthorizations",
        summary: "The authorizations the calling API key holds, newest first",
        tags: ["permits"],
        parameters: [statusFilter(["active", "expired", "revoked"])],
        responses: {
          "200": jsonResponse("The authorizations", schema("PermitAuthorizationList")),
          ...errorResponses(codes(anyRoute, apiKeyed, { 400: ["invalid_request"] })),
        },
      },
    },
    "/v1/permit-authorizations/{id}": {
      delete: {
        operationId: "revokeAuthorization",
        summary: "Revoke an authorization the calling API key holds",
        description:
          "Refused at once on this gateway; on others sharing its database within API_KEY_CACHE_MS. Revoking again answers it unchanged.",
        tags: ["permits"],
        parameters: [idParam("authorization id (`pauth_...`)")],
        responses: {
          "200": jsonResponse("The authorization, revoked", schema("PermitAuthorizationEnvelope")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, { 404: ["authorization_not_found"] }),
          ),
        },
      },
    },
    "/v1/permit-authorizations/{id}/revocation-challenge": {
      post: {
        operationId: "createRevocationChallenge",
        summary: "EIP-712 RevokeKeyAuthorization typed data for the payer to sign (no body)",
        tags: ["permits"],
        parameters: [idParam("authorization id (`pauth_...`)")],
        responses: {
          "200": jsonResponse(
            "Wallet-ready typed data (eth_signTypedData_v4)",
            schema("RevokeKeyAuthorizationTypedData"),
          ),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, { 404: ["authorization_not_found"] }),
          ),
        },
      },
    },
    "/v1/permit-authorizations/{id}/revoke": {
      post: {
        operationId: "revokeAuthorizationBySignature",
        summary: "Revoke an authorization with the payer's signature (any API key may submit it)",
        tags: ["permits"],
        parameters: [idParam("authorization id (`pauth_...`)")],
        requestBody: jsonBody(schema("RevokeBySignatureRequest")),
        responses: {
          "200": jsonResponse("The authorization, revoked", schema("PermitAuthorizationEnvelope")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withBody, withPathId, {
              401: ["invalid_signature"],
              404: ["authorization_not_found"],
              503: ["chain_unavailable"],
            }),
            { body: true },
          ),
        },
      },
    },
    "/v1/provider-offers/challenge": {
      post: {
        operationId: "createRegistrationChallenge",
        summary: "EIP-712 typed data for the offer's operator to sign",
        tags: ["provider"],
        requestBody: jsonBody(schema("ChallengeRequest")),
        responses: {
          "200": jsonResponse(
            "Wallet-ready typed data (eth_signTypedData_v4)",
            schema("TypedData"),
          ),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withBody, {
              400: ["invalid_hex", "challenge_expiry_invalid"],
              404: ["offer_not_found"],
              503: ["chain_unavailable"],
            }),
            { body: true },
          ),
        },
      },
    },
    "/v1/provider-offers/register": {
      post: {
        operationId: "registerEndpoint",
        summary: "Register the offer's private endpoint with the signed challenge",
        description:
          "The nonce is consumed atomically; the endpoint URL and token are never returned.",
        tags: ["provider"],
        requestBody: jsonBody(schema("RegisterRequest")),
        responses: {
          "200": jsonResponse("The offer", schema("OfferEnvelope")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withBody, {
              400: ["invalid_hex", "challenge_expiry_invalid", "endpoint_not_allowed"],
              401: ["invalid_signature"],
              403: ["not_offer_operator"],
              404: ["offer_not_found"],
              409: ["nonce_used"],
              503: ["chain_unavailable", "upstream_unavailable"],
            }),
            { body: true },
          ),
        },
      },
    },
    "/v1/provider-offers/{id}/health": {
      get: {
        operationId: "getOfferHealth",
        summary: "An offer's health",
        tags: ["provider"],
        parameters: [idParam("offer id", schema("Hex32"))],
        responses: {
          "200": jsonResponse("The health", schema("OfferHealth")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, {
              400: ["invalid_hex"],
              404: ["offer_not_found"],
              503: ["chain_unavailable", "upstream_unavailable"],
            }),
          ),
        },
      },
    },
    "/v1/provider-offers/{id}/verify": {
      post: {
        operationId: "verifyOffer",
        summary: "Refresh the offer's verification (no body)",
        description:
          "Checks the endpoint: model listed, one-token completion, stream with usage. Runs are shared per offer and at most one per `VERIFY_MIN_INTERVAL_SECONDS` across the fleet: inside that bound the last run's outcome is answered (`verification.replayed`; a failure's message says when it ran), and while the endpoint's first run is under way on another gateway, 429 `rate_limited`. A wrong answer names the check (422) and clears the verification; a run that gets no answer (timeout, refused connection, 429, 5xx) is 502 `endpoint_unreachable` and leaves a standing verification in place.",
        tags: ["provider"],
        parameters: [idParam("offer id", schema("Hex32"))],
        responses: {
          "200": jsonResponse("The offer, verified", schema("VerifiedOffer")),
          ...errorResponses(
            codes(anyRoute, apiKeyed, withPathId, {
              400: ["invalid_hex", "endpoint_not_allowed"],
              404: ["offer_not_found", "model_not_found"],
              422: ["model_not_listed", "completion_failed", "stream_failed", "usage_missing"],
              502: ["endpoint_unreachable"],
              503: ["chain_unavailable"],
            }),
          ),
        },
      },
    },
    "/settlements/flush": {
      post: {
        operationId: "flushSettlement",
        summary: "Settle unsettled charges on chain now (settlement worker)",
        description:
          "Safe to call concurrently (another flush in progress: `busy: true`) and after a crash. An empty body is `{}`.",
        tags: ["settlement"],
        security: [{ operatorToken: [] }],
        requestBody: jsonBody(schema("FlushRequest"), false),
        responses: {
          "200": jsonResponse("What the flush did", schema("FlushResponse")),
          ...errorResponses(
            codes(anyRoute, withBody, {
              401: ["invalid_operator_token"],
              503: ["settlement_unavailable", "chain_unavailable", "database_unavailable"],
            }),
            { body: true },
          ),
        },
      },
    },
  }),
  components: {
    securitySchemes: {
      apiKey: {
        type: "http",
        scheme: "bearer",
        description: "`Authorization: Bearer <API key>` (issued by `gateway keys create`)",
      },
      operatorToken: {
        type: "http",
        scheme: "bearer",
        description: "`Authorization: Bearer <SETTLEMENT_OPERATOR_TOKEN>`",
      },
    },
    parameters: {
      ModelId: idParam("the public model id, an alias, or the ModelID (Hex32)"),
      "X-Gateway-Permit": {
        name: "X-Gateway-Permit",
        in: "header",
        required: true,
        description: "The on-chain permit paying for the request (missing: 402 `permit_missing`).",
        schema: schema("Hex32"),
      },
      "X-Gateway-Quote": {
        name: "X-Gateway-Quote",
        in: "header",
        required: false,
        description: "A quote from POST /v1/quotes for this exact request (single use).",
        schema: schema("Hex32"),
      },
      "Idempotency-Key": {
        name: "Idempotency-Key",
        in: "header",
        required: false,
        description:
          "Per API key, kept 24 h: the same key and body replays the finished answer; another body is 422 `idempotency_key_reused`; while the first runs, 409 `idempotency_in_progress`; an answer larger than IDEMPOTENCY_MAX_RESULT_BYTES (default 1 MiB) is not kept: it completes and is charged once, and its replay is 409 `idempotency_result_too_large` (no provider call, no charge).",
        schema: { type: "string", minLength: 1, maxLength: 255 },
      },
      "X-Request-Id": {
        name: "X-Request-Id",
        in: "header",
        required: false,
        description:
          "The request's id in logs and in the X-Request-Id answer header (any other shape is replaced by a generated id). Accepted on every route.",
        schema: { type: "string", pattern: "^[A-Za-z0-9._-]{1,128}$" },
      },
    },
    headers: {
      "X-Request-Id": {
        description: "The request's id (the caller's X-Request-Id, else generated)",
        required: true,
        schema: { type: "string", pattern: "^[A-Za-z0-9._-]{1,128}$" },
      },
      "X-Request-Id-Optional": {
        description: "The request's id; absent on a request refused while the gateway shuts down",
        required: false,
        schema: { type: "string", pattern: "^[A-Za-z0-9._-]{1,128}$" },
      },
      "WWW-Authenticate": {
        description: "`Bearer`",
        required: true,
        schema: { const: "Bearer" },
      },
      "Retry-After": {
        description: "Seconds until the API key may send again",
        required: true,
        schema: { type: "string", pattern: "^[1-9][0-9]*$" },
      },
      "Retry-After-Optional": {
        description: "With `rate_limited`: seconds until the API key may send again",
        required: false,
        schema: { type: "string", pattern: "^[1-9][0-9]*$" },
      },
      "X-Gateway-Request-Id": {
        description: "The request record's id (GET /v1/requests/{id})",
        required: true,
        schema: schema("Hex32"),
      },
      "X-Gateway-Quote-Id": {
        description: "The quote the request was admitted under (the client's, or an internal one)",
        required: true,
        schema: schema("Hex32"),
      },
      "X-Gateway-Offer-Id": {
        description: "The offer that served the request",
        required: true,
        schema: schema("Hex32"),
      },
      "X-Gateway-Tariff-Version": {
        description: "The offer's tariff version the request is priced by",
        required: true,
        schema: { type: "string", pattern: "^[0-9]+$" },
      },
      "X-Gateway-Credits-Charged-Json": {
        description:
          "The charge (JSON answers; a stream sends it as the trailer of the same name instead)",
        required: false,
        schema: decimal,
      },
      Trailer: {
        description: "`X-Gateway-Credits-Charged` (streams: the charge arrives as a trailer)",
        required: false,
        schema: { const: "X-Gateway-Credits-Charged" },
      },
    },
    responses: {
      RouteNotFound: errorResponse(404, ["route_not_found"]),
      MethodNotAllowed: errorResponse(405, ["method_not_allowed"]),
    },
    schemas: {
      Hex32: hex32,
      Address: { type: "string", pattern: "^0x[0-9a-fA-F]{40}$" },
      Decimal: {
        type: "string",
        pattern: "^(0|[1-9][0-9]*)$",
        description: "a non-negative integer in the credit token's base units (uint256)",
      },
      UnixSeconds: { type: "integer", minimum: 0 },
      Error: {
        type: "object",
        required: ["error"],
        additionalProperties: false,
        properties: {
          error: {
            type: "object",
            required: ["code", "type", "message"],
            additionalProperties: false,
            properties: {
              code: { type: "string" },
              type: { type: "string" },
              message: { type: "string" },
            },
          },
        },
      },
      Health: {
        type: "object",
        required: ["status"],
        properties: { status: { const: "ok" } },
      },
      Readiness: {
        type: "object",
        required: ["status"],
        properties: {
          status: { enum: ["ready", "unavailable", "shutting_down"] },
          checks: {
            type: "object",
            additionalProperties: {
              type: "object",
              required: ["ok"],
              properties: { ok: { type: "boolean" }, error: { type: "string" } },
            },
          },
        },
      },
      Model: {
        type: "object",
        required: Object.keys(modelProperties),
        properties: modelProperties,
      },
      ModelWithOffers: {
        type: "object",
        required: [...Object.keys(modelProperties), "offers"],
        properties: {
          ...modelProperties,
          offers: { type: "array", items: schema("Offer") },
        },
      },
      ModelList: {
        type: "object",
        required: ["object", "data"],
        properties: { object: { const: "list" }, data: { type: "array", items: schema("Model") } },
      },
      Tariff: {
        type: "object",
        required: ["version", "input_price_per_mtok", "output_price_per_mtok", "wake_fee"],
        properties: {
          version: { type: "string", pattern: "^[0-9]+$" },
          input_price_per_mtok: decimal,
          output_price_per_mtok: decimal,
          wake_fee: decimal,
        },
      },
      Offer: {
        type: "object",
        required: [
          "offer_id",
          "model_id",
          "operator",
          "payout",
          "status",
          "tariff_version",
          "capabilities",
          "verified_at",
          "verification_expires_at",
          "region",
          "hardware",
          "max_concurrency",
          "tariff",
          "verified_features",
        ],
        properties: {
          offer_id: schema("Hex32"),
          model_id: schema("Hex32"),
          operator: schema("Address"),
          payout: schema("Address"),
          status: { enum: ["active", "paused", "retired"] },
          tariff_version: { type: "string", pattern: "^[0-9]+$" },
          capabilities: { type: "object", additionalProperties: true },
          verified_at: nullable(seconds),
          verification_expires_at: nullable(seconds),
          region: { type: "string" },
          hardware: { type: "string" },
          max_concurrency: { type: "integer", minimum: 0 },
          tariff: schema("Tariff"),
          verified_features: {
            type: "array",
            items: { enum: ["tools", "json_schema", "stream_usage"] },
            description:
              "Features the endpoint's last successful verification proved: tools (a tool call answered), json_schema (a response_format json_schema answered with parseable JSON), stream_usage (a stream carried usage). provider.require_parameters routes only to offers that proved every feature a request uses.",
          },
        },
      },
      OfferList: {
        type: "object",
        required: ["object", "data"],
        properties: { object: { const: "list" }, data: { type: "array", items: schema("Offer") } },
      },
      OfferEnvelope: {
        type: "object",
        required: ["offer"],
        properties: { offer: schema("Offer") },
      },
      VerifiedOffer: {
        type: "object",
        required: ["offer", "verification"],
        properties: {
          offer: schema("Offer"),
          verification: {
            type: "object",
            description: "The verification run this answer rests on.",
            required: ["ran_at", "replayed", "next_run_at"],
            properties: {
              ran_at: { ...seconds, description: "When the run ended." },
              replayed: {
                type: "boolean",
                description:
                  "True when no run was made for this call: it came within the bound of the last run, whose outcome it is answered.",
              },
              next_run_at: { ...seconds, description: "From when a verify runs the checks again." },
            },
          },
        },
      },
      OfferHealth: {
        type: "object",
        required: [
          "offer_id",
          "status",
          "running",
          "verified_at",
          "verification_expires_at",
          "checked_at",
          "quarantine_reason",
        ],
        properties: {
          offer_id: schema("Hex32"),
          status: { enum: ["active", "paused", "retired"] },
          running: { type: "boolean" },
          verified_at: nullable(seconds),
          verification_expires_at: nullable(seconds),
          checked_at: nullable(seconds),
          quarantine_reason: nullable({ type: "string" }),
        },
      },
      ChatMessage: {
        type: "object",
        required: ["role", "content"],
        additionalProperties: true,
        properties: {
          role: { enum: ["system", "developer", "user", "assistant", "tool", "function"] },
          content: {},
        },
      },
      ChatRequest: {
        type: "object",
        required: ["model", "messages"],
        additionalProperties: true,
        properties: {
          model: { type: "string" },
          messages: { type: "array", minItems: 1, items: schema("ChatMessage") },
          offer: schema("Hex32"),
          provider: schema("ProviderPreferences"),
          max_tokens: { type: "integer", minimum: 1 },
          max_completion_tokens: { type: "integer", minimum: 1 },
          n: {
            type: "integer",
            minimum: 1,
            maximum: 128,
            default: 1,
            description:
              "How many choices to generate (null or absent: 1). Each may use the whole output limit, so the quote's max_output_tokens and maximum_credits, and the reservation, count the output limit n times; the quote binds n (another n is quote_mismatch).",
          },
          best_of: {
            type: "integer",
            description:
              "Not a chat completions parameter: refused (400 invalid_request) unless absent, null or equal to n, since the provider would generate sequences no one pays for.",
          },
          temperature: { type: "number" },
          top_p: { type: "number" },
          stop: { oneOf: [{ type: "string" }, { type: "array", items: { type: "string" } }] },
          stream: { type: "boolean" },
          tools: { type: "array" },
          tool_choice: {},
          response_format: {},
          seed: { type: "integer" },
          user: { type: "string" },
        },
      },
      ProviderPreferences: {
        type: "object",
        description:
          "OpenRouter's provider routing object, applied to this market's offers (offer ids). Ignored where the request's offer, its quote or its permit pins an offer: a pin wins. An invalid object, or an OpenRouter member this gateway does not support, is refused 400 invalid_request naming the field; preferences that leave no eligible offer are refused 503 no_eligible_offer naming the preference.",
        properties: {
          order: {
            type: "array",
            maxItems: 64,
            items: schema("Hex32"),
            description:
              "Offers tried first, in this order; the other eligible offers follow unless allow_fallbacks is false.",
          },
          only: {
            type: "array",
            maxItems: 64,
            items: schema("Hex32"),
            description: "Route only to these offers.",
          },
          ignore: {
            type: "array",
            maxItems: 64,
            items: schema("Hex32"),
            description: "Never route to these offers.",
          },
          allow_fallbacks: {
            type: "boolean",
            default: true,
            description:
              "false: only the order list is tried (failing over within it); without order, only the first offer routing ranks.",
          },
          sort: {
            enum: ["price", "latency", "throughput"],
            description:
              "Replaces the default ranking: price (lowest maximum credits first), latency (lowest measured time to first token first), throughput (highest measured output tokens per second first); offers not measured yet come last.",
          },
          max_price: {
            type: "object",
            additionalProperties: false,
            description:
              "Offers whose tariff is above either price are excluded (credit base units per million tokens).",
            properties: { prompt: decimal, completion: decimal },
          },
          require_parameters: {
            type: "boolean",
            default: false,
            description:
              "Route only to offers whose verification proved every feature the request uses: tools, a response_format JSON schema, usage on a stream (see Offer.verified_features).",
          },
        },
      },
      Quote: {
        type: "object",
        required: [
          "quote_id",
          "model",
          "model_id",
          "offer_id",
          "tariff_version",
          "input_tokens",
          "max_output_tokens",
          "wakes_endpoint",
          "maximum_credits",
          "expires_at",
        ],
        properties: {
          quote_id: schema("Hex32"),
          model: { type: "string" },
          model_id: schema("Hex32"),
          offer_id: schema("Hex32"),
          tariff_version: { type: "string", pattern: "^[0-9]+$" },
          input_tokens: decimal,
          max_output_tokens: {
            ...decimal,
            description:
              "The output tokens maximum_credits pays for: the output limit times n (every choice may use the whole limit)",
          },
          wakes_endpoint: { type: "boolean" },
          maximum_credits: decimal,
          expires_at: seconds,
        },
      },
      ChatCompletion: {
        type: "object",
        description: "The provider's OpenAI-compatible chat.completion object, as it came",
        additionalProperties: true,
        properties: {
          id: { type: "string" },
          object: { type: "string" },
          choices: { type: "array" },
          usage: { type: "object" },
        },
      },
      ChatCompletionChunk: {
        type: "object",
        description:
          "An upstream chat.completion.chunk, as it came (the gateway's last one is ChatStreamFinalChunk)",
        required: ["choices"],
        not: { required: ["x_gateway"] },
        additionalProperties: true,
        properties: {
          id: { type: "string" },
          object: { type: "string" },
          choices: { type: "array" },
        },
      },
      XGateway: {
        type: "object",
        required: [
          "request_id",
          "quote_id",
          "offer_id",
          "tariff_version",
          "input_tokens",
          "output_tokens",
          "cached_input_tokens",
          "reasoning_tokens",
          "credits_charged",
          "billing",
        ],
        properties: {
          request_id: schema("Hex32"),
          quote_id: schema("Hex32"),
          offer_id: schema("Hex32"),
          tariff_version: { type: "string", pattern: "^[0-9]+$" },
          input_tokens: decimal,
          output_tokens: decimal,
          cached_input_tokens: {
            ...decimal,
            description:
              "Of input_tokens, those the provider reported served from its prompt cache (0: none reported, or not credible); not priced (an Idempotency-Key replay of an answer stored before they were recorded: 0)",
          },
          reasoning_tokens: {
            ...decimal,
            description:
              "Of output_tokens, those the provider reported spent on reasoning (0: none reported, or not credible); not priced",
          },
          credits_charged: decimal,
          billing: nullable({ enum: ["billed", "partial", "void"] }),
        },
      },
      ChatStreamFinalChunk: {
        type: "object",
        description: "The last chunk before `[DONE]`: no choices, and the charge",
        required: ["id", "object", "created", "model", "choices", "x_gateway"],
        properties: {
          id: { type: "string" },
          object: { const: "chat.completion.chunk" },
          created: { type: "integer" },
          model: { type: "string" },
          choices: { type: "array", maxItems: 0 },
          x_gateway: schema("XGateway"),
        },
      },
      ResponsesRequest: {
        type: "object",
        additionalProperties: true,
        description:
          "An OpenAI Responses API request (stateless): `model`, `input` (text or items), `instructions`, function `tools`, `tool_choice`, `max_output_tokens`, `text.format`, `stream`, ...",
        required: ["model", "input"],
        properties: { model: { type: "string", minLength: 1 }, stream: { type: "boolean" } },
      },
      ResponsesAnswer: {
        type: "object",
        additionalProperties: true,
        description: "An OpenAI `response` object, with `x_gateway`",
        required: ["id", "object", "status", "output", "x_gateway"],
        properties: {
          id: { type: "string" },
          object: { const: "response" },
          status: { enum: ["completed", "incomplete"] },
          output: { type: "array" },
          x_gateway: schema("XGateway"),
        },
      },
      MessagesRequest: {
        type: "object",
        additionalProperties: true,
        description:
          "An Anthropic Messages API request: `model`, `max_tokens`, `system`, `messages` (text, tool_use, tool_result blocks), `tools`, `tool_choice`, `stop_sequences`, `stream`, ...",
        required: ["model", "max_tokens", "messages"],
        properties: {
          model: { type: "string", minLength: 1 },
          max_tokens: { type: "integer", minimum: 1 },
          messages: { type: "array" },
          stream: { type: "boolean" },
        },
      },
      MessagesAnswer: {
        type: "object",
        additionalProperties: true,
        description: "An Anthropic `message` object, with `x_gateway`",
        required: ["id", "type", "role", "content", "stop_reason", "usage", "x_gateway"],
        properties: {
          id: { type: "string" },
          type: { const: "message" },
          role: { const: "assistant" },
          content: { type: "array" },
          x_gateway: schema("XGateway"),
        },
      },
      DialectEvent: {
        type: "object",
        additionalProperties: true,
        description:
          "The JSON `data` of one event of a dialect's stream; `type` is also its `event:` name",
        required: ["type"],
        properties: { type: { type: "string" } },
      },
      OpenAIError: {
        type: "object",
        description: "OpenAI's error shape, with the gateway's code",
        required: ["error"],
        properties: {
          error: {
            type: "object",
            required: ["code", "type", "message"],
            properties: {
              code: { type: "string" },
              type: { type: "string" },
              message: { type: "string" },
              param: { type: ["string", "null"] },
            },
          },
        },
      },
      AnthropicError: {
        type: "object",
        description: "Anthropic's error shape, with the gateway's code at `error.code`",
        required: ["type", "error"],
        properties: {
          type: { const: "error" },
          error: {
            type: "object",
            required: ["type", "message", "code"],
            properties: {
              type: { type: "string" },
              message: { type: "string" },
              code: { type: "string" },
              details: {
                type: "object",
                description: "`error_code`: the gateway's code, where Anthropic's SDKs read it",
                properties: { error_code: { type: "string" } },
              },
            },
          },
        },
      },
      ChatStreamEvent: {
        description:
          "The JSON `data` of one SSE event: an upstream chunk, the final chunk with `x_gateway`, or (last, no `[DONE]` after it) an error",
        anyOf: [schema("ChatStreamFinalChunk"), schema("ChatCompletionChunk"), schema("Error")],
      },
      InferenceRequest: {
        type: "object",
        required: [
          "id",
          "object",
          "model",
          "model_id",
          "offer_id",
          "permit_id",
          "quote_id",
          "stream",
          "status",
          "input_tokens",
          "output_tokens",
          "cached_input_tokens",
          "reasoning_tokens",
          "maximum_credits",
          "credits_charged",
          "tariff_version",
          "billing",
          "error",
          "created_at",
          "completed_at",
          "settlement",
        ],
        properties: {
          id: schema("Hex32"),
          object: { const: "inference.request" },
          model: { type: "string" },
          model_id: schema("Hex32"),
          offer_id: schema("Hex32"),
          permit_id: schema("Hex32"),
          quote_id: { type: "string" },
          stream: { type: "boolean" },
          status: { enum: ["pending", "streaming", "completed", "failed", "cancelled"] },
          input_tokens: decimal,
          output_tokens: decimal,
          cached_input_tokens: {
            ...decimal,
            description:
              "Of input_tokens, those the provider reported served from its prompt cache: a safe integer at most prompt_tokens, else 0; 0 when it reported none. Shown, never priced",
          },
          reasoning_tokens: {
            ...decimal,
            description:
              "Of output_tokens, those the provider reported spent on reasoning: a safe integer at most completion_tokens, else 0; 0 when it reported none. Shown, never priced",
          },
          maximum_credits: decimal,
          credits_charged: decimal,
          tariff_version: { type: "string" },
          billing: nullable({ enum: ["billed", "partial", "void"] }),
          error: nullable({ type: "string" }),
          created_at: seconds,
          completed_at: nullable(seconds),
          settlement: {
            type: "object",
            required: ["status", "batch_id", "tx_hash", "settled_at", "reason"],
            properties: {
              status: { enum: ["unsettled", "settling", "settled", "none", "unsettleable"] },
              batch_id: nullable(schema("Hex32")),
              tx_hash: nullable(schema("Hex32")),
              settled_at: nullable(seconds),
              reason: nullable({ type: "string" }),
            },
          },
        },
      },
      PermitBalance: {
        type: "object",
        required: [
          "permit_id",
          "state",
          "model_id",
          "offer_id",
          "payer",
          "expires_at",
          "closable_at",
          "deposit",
          "settled",
          "charged_unsettled",
          "reserved",
          "available",
        ],
        properties: {
          permit_id: schema("Hex32"),
          state: { enum: ["open", "closing", "closed"] },
          model_id: schema("Hex32"),
          offer_id: nullable(schema("Hex32")),
          payer: schema("Address"),
          expires_at: seconds,
          closable_at: nullable(seconds),
          deposit: decimal,
          settled: decimal,
          charged_unsettled: decimal,
          reserved: decimal,
          available: decimal,
        },
      },
      AuthorizationChallengeRequest: {
        type: "object",
        required: ["payer"],
        properties: {
          payer: schema("Address"),
          permitId: {
            ...hex32,
            description: "one permit of the payer; absent or all zeros: every permit of the payer",
          },
          expiresAt: {
            type: "integer",
            description: "Unix seconds, in the future (default now + 30 days)",
          },
        },
      },
      AuthorizeKeyRequest: {
        type: "object",
        required: ["payer", "permitId", "expiresAt", "nonce", "signature"],
        description: "The challenge's message fields as signed, and the payer's signature",
        properties: {
          payer: schema("Address"),
          permitId: schema("Hex32"),
          expiresAt: { type: "integer" },
          nonce: { type: "string" },
          signature: {
            type: "string",
            pattern: "^0x([0-9a-fA-F]{128}|[0-9a-fA-F]{130})$",
            description: "the payer's 65-byte or EIP-2098 compact signature",
          },
        },
      },
      RevokeBySignatureRequest: {
        type: "object",
        required: ["signature"],
        properties: {
          signature: {
            type: "string",
            pattern: "^0x([0-9a-fA-F]{128}|[0-9a-fA-F]{130})$",
            description: "the payer's signature over the revocation challenge",
          },
        },
      },
      AuthorizeKeyTypedData: {
        type: "object",
        required: ["types", "primaryType", "domain", "message"],
        properties: {
          types: {
            type: "object",
            required: ["EIP712Domain", "AuthorizeKey"],
            properties: {
              EIP712Domain: schema("TypedDataFields"),
              AuthorizeKey: schema("TypedDataFields"),
            },
          },
          primaryType: { const: "AuthorizeKey" },
          domain: schema("AuthorizationDomain"),
          message: {
            type: "object",
            required: ["payer", "keyId", "permitId", "expiresAt", "nonce"],
            properties: {
              payer: schema("Address"),
              keyId: { type: "string", description: "the calling API key's public id" },
              permitId: schema("Hex32"),
              expiresAt: seconds,
              nonce: { type: "string" },
            },
          },
        },
      },
      RevokeKeyAuthorizationTypedData: {
        type: "object",
        required: ["types", "primaryType", "domain", "message"],
        properties: {
          types: {
            type: "object",
            required: ["EIP712Domain", "RevokeKeyAuthorization"],
            properties: {
              EIP712Domain: schema("TypedDataFields"),
              RevokeKeyAuthorization: schema("TypedDataFields"),
            },
          },
          primaryType: { const: "RevokeKeyAuthorization" },
          domain: schema("AuthorizationDomain"),
          message: {
            type: "object",
            required: ["payer", "authorizationId"],
            properties: { payer: schema("Address"), authorizationId: { type: "string" } },
          },
        },
      },
      AuthorizationDomain: {
        type: "object",
        required: ["name", "version", "chainId", "verifyingContract"],
        properties: {
          name: { const: "Model Market Gateway" },
          version: { const: "3" },
          chainId: { type: "integer", minimum: 1 },
          verifyingContract: schema("Address"),
        },
      },
      PermitAuthorization: {
        type: "object",
        required: [
          "id",
          "object",
          "api_key_id",
          "payer",
          "permit_id",
          "status",
          "expires_at",
          "created_at",
          "revoked_at",
          "revoked_by",
        ],
        properties: {
          id: { type: "string", pattern: "^pauth_[0-9a-f]{24}$" },
          object: { const: "permit_authorization" },
          api_key_id: { type: "string", description: "the public id of the key that may spend" },
          payer: schema("Address"),
          permit_id: {
            ...hex32,
            description: "the permit; all zeros: every permit of the payer",
          },
          status: { enum: ["active", "expired", "revoked"] },
          expires_at: seconds,
          created_at: seconds,
          revoked_at: nullable(seconds),
          revoked_by: nullable({ enum: ["key", "payer"] }),
        },
      },
      PermitAuthorizationEnvelope: {
        type: "object",
        required: ["authorization"],
        properties: { authorization: schema("PermitAuthorization") },
      },
      PermitAuthorizationList: {
        type: "object",
        required: ["object", "data"],
        properties: {
          object: { const: "list" },
          data: { type: "array", items: schema("PermitAuthorization") },
        },
      },
      ChallengeRequest: {
        type: "object",
        required: ["offerId", "endpointUrl"],
        properties: {
          offerId: schema("Hex32"),
          endpointUrl: { type: "string", format: "uri" },
          nonce: { type: "string", description: "default: a random Hex32 the gateway makes" },
          expiresAt: {
            type: "integer",
            description: "Unix seconds, at most 15 minutes ahead (default now + 10 min)",
          },
          endpointToken: {
            type: "string",
            description:
              "the bearer the registration will present (optional): only its hash (message.endpointTokenHash) enters the typed data; the token is neither kept nor returned",
          },
        },
      },
      RegisterRequest: {
        type: "object",
        required: ["offerId", "endpointUrl", "nonce", "expiresAt", "signature"],
        properties: {
          offerId: schema("Hex32"),
          endpointUrl: { type: "string", format: "uri" },
          nonce: { type: "string" },
          expiresAt: { type: "integer" },
          signature: {
            type: "string",
            pattern: "^0x([0-9a-fA-F]{128}|[0-9a-fA-F]{130})$",
            description: "65-byte or EIP-2098 compact signature of the challenge",
          },
          endpointToken: {
            type: "string",
            description:
              "the bearer the gateway presents to the endpoint (never returned); must be the token whose hash the signed challenge carries, and absent when it carries the zero hash (else 401 invalid_signature)",
          },
        },
      },
      TypedData: {
        type: "object",
        required: ["types", "primaryType", "domain", "message"],
        properties: {
          types: {
            type: "object",
            required: ["EIP712Domain", "RegisterEndpoint"],
            properties: {
              EIP712Domain: schema("TypedDataFields"),
              RegisterEndpoint: schema("TypedDataFields"),
            },
          },
          primaryType: { const: "RegisterEndpoint" },
          domain: {
            type: "object",
            required: ["name", "version", "chainId", "verifyingContract"],
            properties: {
              name: { const: "Model Market Gateway" },
              version: { const: "3" },
              chainId: { type: "integer", minimum: 1 },
              verifyingContract: schema("Address"),
            },
          },
          message: {
            type: "object",
            required: [
              "offerId",
              "operator",
              "endpointUrlHash",
              "endpointTokenHash",
              "nonce",
              "expiresAt",
            ],
            properties: {
              offerId: schema("Hex32"),
              operator: schema("Address"),
              endpointUrlHash: schema("Hex32"),
              endpointTokenHash: {
                ...schema("Hex32"),
                description:
                  "keccak256(utf8(endpointToken)), or the zero bytes32 when the challenge names no token",
              },
              nonce: { type: "string" },
              expiresAt: seconds,
            },
          },
        },
      },
      TypedDataFields: {
        type: "array",
        items: {
          type: "object",
          required: ["name", "type"],
          properties: { name: { type: "string" }, type: { type: "string" } },
        },
      },
      FlushRequest: {
        type: "object",
        description: "camelCase; snake_case (`max_requests`, `dry_run`) is accepted too",
        properties: {
          maxRequests: { type: "integer", minimum: 1, maximum: 4294967295 },
          dryRun: { type: "boolean" },
        },
      },
      FlushResponse: {
        type: "object",
        required: ["batches", "settled_requests", "settled_credits", "unsettleable", "busy"],
        properties: {
          batches: {
            type: "array",
            items: {
              type: "object",
              required: [
                "batch_id",
                "requests",
                "credits",
                "tx_hash",
                "status",
                "charges",
                "gas",
                "error",
              ],
              properties: {
                batch_id: schema("Hex32"),
                requests: { type: "integer", minimum: 0 },
                credits: decimal,
                tx_hash: nullable(schema("Hex32")),
                status: { enum: ["pending", "submitted", "settled", "failed", "dry_run"] },
                charges: { type: "integer", minimum: 0 },
                gas: nullable(decimal),
                error: nullable({ type: "string" }),
              },
            },
          },
          settled_requests: { type: "integer", minimum: 0 },
          settled_credits: decimal,
          unsettleable: {
            type: "array",
            items: {
              type: "object",
              required: ["permit_id", "offer_id", "requests", "credits", "reason"],
              properties: {
                permit_id: schema("Hex32"),
                offer_id: schema("Hex32"),
                requests: { type: "integer", minimum: 0 },
                credits: decimal,
                reason: { type: "string" },
              },
            },
          },
          busy: { type: "boolean" },
        },
      },
    },
  },
};
