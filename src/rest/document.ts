import type { TSchema } from "@sinclair/typebox";
import { wireOf } from "../connect/error-codes.js";
import type { ErrorCode } from "../domain/errors.js";
import { componentSchemas, Hex32 } from "../schema/common.js";
import { ErrorBody } from "./views/resources.js";
import type {
  Codes,
  Header,
  JsonSchema,
  Parameter,
  Ref,
  Response,
  RouteSpec,
} from "./route-spec.js";

/**
 * The OpenAPI 3.1 document of the REST facade, generated: every path and operation from the
 * route declarations (src/rest/routes/: method, path, summary, body schema, answer schema and
 * the route's own error codes), every body schema from its one TypeBox declaration
 * (src/schema), every named shape (`x-component`) hoisted once to `components.schemas`. Nothing
 * here describes a body by hand; what is written here is what is not a body: the parameters and
 * headers the routes share, and the error answers' shape per status.
 */

// ---------------------------------------------------------------- shared codes

/** What any route can answer. */
const anyRoute: Codes = { 500: ["internal_error"], 503: ["shutting_down"] };
/**
 * Routes behind the API key (checked before the body is read; an address out of its budget of
 * failed authentications is refused before its credentials are examined, unless they are a key
 * the gateway issued).
 */
const apiKeyed: Codes = {
  401: ["missing_api_key", "invalid_api_key"],
  429: ["rate_limited", "address_rate_limited"],
  503: ["database_unavailable"],
};
/** Routes with a JSON body (read and size-checked after the credentials). */
const withBody: Codes = {
  400: ["invalid_request", "invalid_json"],
  408: ["request_timeout"],
  413: ["request_too_large"],
  415: ["unsupported_media_type"],
};
/** Routes with a `{id}` path parameter (malformed percent-encoding). */
const withPathId: Codes = { 400: ["invalid_request"] };
/** The operator's routes (their failed authentications count for the address too). */
const operatorKeyed: Codes = { 401: ["invalid_operator_token"], 429: ["address_rate_limited"] };

/** Routes a payer's `ReadPayerRequests` token opens (its checks, before any signature's). */
const payerSigned: Codes = {
  400: ["invalid_request"],
  401: ["invalid_signature", "signature_expired"],
  403: ["wrong_deployment"],
};

/** Codes whose answer always carries Retry-After. */
const retryAfterCodes: readonly ErrorCode[] = ["rate_limited", "address_rate_limited"];

/** Merges code lists by status (later lists add codes, never drop them). */
export function mergeCodes(...lists: Codes[]): Record<number, ErrorCode[]> {
  const merged: Record<number, ErrorCode[]> = {};
  for (const list of lists) {
    for (const [status, cs] of Object.entries(list)) {
      const into = (merged[Number(status)] ??= []);
      for (const c of cs ?? []) if (!into.includes(c)) into.push(c);
    }
  }
  return merged;
}

/** Every error code a route may answer, by status. */
export function routeCodes(route: RouteSpec): Record<number, ErrorCode[]> {
  if (route.onlyOwnErrors === true) return mergeCodes(route.errors ?? {});
  const auth = route.auth ?? "apiKey";
  return mergeCodes(
    anyRoute,
    auth === "apiKey" || auth === "apiKeyOrOperator" || auth === "apiKeyOrPayer" ? apiKeyed : {},
    auth === "apiKeyOrPayer" ? payerSigned : {},
    auth === "operator" ? operatorKeyed : {},
    route.body === undefined ? {} : withBody,
    route.pathId === undefined ? {} : withPathId,
    route.errors ?? {},
  );
}

// ---------------------------------------------------------------- errors

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

const ref = (kind: "responses" | "parameters" | "headers" | "schemas", name: string): Ref => ({
  $ref: `#/components/${kind}/${name}`,
});

/** The `type` of an error body: a function of its code's status (src/domain/errors.ts). */
function typeOf(status: number, codes: readonly ErrorCode[]): string {
  const types = new Set(codes.map((c) => wireOf(c).type));
  if (types.size !== 1) throw new Error(`codes of status ${status} have several types`);
  return [...types][0] as string;
}

const oneOf = (codes: readonly string[]): JsonSchema =>
  codes.length === 1 ? { const: codes[0] } : { enum: [...codes] };

/**
 * An error answer whose body's `code` is one of `codes` (and `type` the status's), in the
 * spec's shape or a dialect's. 503s may come before the request id is assigned (a request
 * refused while shutting down).
 */
function errorResponse(
  status: number,
  codes: readonly ErrorCode[],
  options: { body?: boolean; note?: string; errorSchema?: TSchema } = {},
): Response {
  const headers: Record<string, Header | Ref> = {
    "X-Request-Id": ref("headers", status === 503 ? "X-Request-Id-Optional" : "X-Request-Id"),
  };
  if (status === 401) headers["WWW-Authenticate"] = ref("headers", "WWW-Authenticate");
  if (status === 429) {
    headers["Retry-After"] = ref(
      "headers",
      codes.every((c) => retryAfterCodes.includes(c)) ? "Retry-After" : "Retry-After-Optional",
    );
  }
  if (status === 503 && codes.includes("offer_cooling_down"))
    headers["Retry-After"] = ref("headers", "Retry-After-Cooldown");
  let note = options.note ?? "";
  if (status === 400 && options.body === true)
    note +=
      " (`invalid_request` also for a JSON body nested deeper than MAX_JSON_DEPTH or with an array longer than MAX_JSON_ARRAY_ITEMS, refused before anything is reserved)";
  const narrowed: JsonSchema =
    options.errorSchema === undefined
      ? { code: oneOf(codes), type: { const: typeOf(status, codes) } }
      : { code: oneOf(codes) };
  return {
    description: `${reasons[status] ?? "Error"}: ${codes.map((c) => `\`${c}\``).join(", ")}${note}`,
    headers,
    content: {
      "application/json": {
        schema: {
          allOf: [options.errorSchema ?? ErrorBody],
          properties: { error: { properties: narrowed } },
        },
      },
    },
  };
}

// ---------------------------------------------------------------- parameters and headers

const requestIdShape = { type: "string", pattern: "^[A-Za-z0-9._-]{1,128}$" };
const positiveSeconds = { type: "string", pattern: "^[1-9][0-9]*$" };

const parameters: Record<string, Parameter> = {
  "X-Gateway-Permit": {
    name: "X-Gateway-Permit",
    in: "header",
    required: true,
    description: "The on-chain permit paying for the request (missing: 402 `permit_missing`).",
    schema: Hex32,
  },
  "X-Gateway-Quote": {
    name: "X-Gateway-Quote",
    in: "header",
    required: false,
    description: "A quote from POST /v1/quotes for this exact request (single use).",
    schema: Hex32,
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
    schema: requestIdShape,
  },
};

const headers: Record<string, Header> = {
  "X-Request-Id": {
    description: "The request's id (the caller's X-Request-Id, else generated)",
    required: true,
    schema: requestIdShape,
  },
  "X-Request-Id-Optional": {
    description: "The request's id; absent on a request refused while the gateway shuts down",
    required: false,
    schema: requestIdShape,
  },
  "WWW-Authenticate": { description: "`Bearer`", required: true, schema: { const: "Bearer" } },
  "Retry-After": {
    description:
      "Seconds until the API key may send again (`rate_limited`), or the address may fail to authenticate again (`address_rate_limited`)",
    required: true,
    schema: positiveSeconds,
  },
  "Retry-After-Optional": {
    description:
      "With `rate_limited` or `address_rate_limited`: seconds until the API key may send again, or the address may fail to authenticate again",
    required: false,
    schema: positiveSeconds,
  },
  "Retry-After-Cooldown": {
    description:
      "With `offer_cooling_down`: seconds until the soonest cooldown of the offers the request may use ends",
    required: false,
    schema: positiveSeconds,
  },
  "X-Gateway-Request-Id": {
    description: "The request record's id (GET /v1/requests/{id})",
    required: true,
    schema: Hex32,
  },
  "X-Gateway-Quote-Id": {
    description: "The quote the request was admitted under (the client's, or an internal one)",
    required: true,
    schema: Hex32,
  },
  "X-Gateway-Offer-Id": {
    description: "The offer that served the request",
    required: true,
    schema: Hex32,
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
    schema: { type: "string", pattern: "^(0|[1-9][0-9]*)$" },
  },
  "X-Gateway-Budget-Warning": {
    description:
      "A chat completion's JSON answer (which carries no `x_gateway`) admitted at or over its payer's soft threshold: `x_gateway.budget_warning` as compact JSON (the BudgetWarning schema). The dialects' JSON answers and every stream carry it in `x_gateway` instead",
    required: false,
    schema: { type: "string" },
  },
  Trailer: {
    description: "`X-Gateway-Credits-Charged` (streams: the charge arrives as a trailer)",
    required: false,
    schema: { const: "X-Gateway-Credits-Charged" },
  },
};

/** A shared parameter or header, by name (for route declarations). */
export const parameter = (name: keyof typeof parameters): Ref => ref("parameters", name);
export const header = (name: keyof typeof headers): Ref => ref("headers", name);

/** `?status=` of a list route. */
export function statusFilter(values: readonly string[]): Parameter {
  return {
    name: "status",
    in: "query",
    required: false,
    description: "Only entries with this status (an unknown value is 400 `invalid_request`).",
    schema: { type: "string", enum: [...values] },
  };
}

// ---------------------------------------------------------------- the document

const info = {
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
    "`rate_limited` with `Retry-After` (whole seconds). Credentials are checked before the",
    "request body is read; failed authentications are limited per client address: once an",
    "address has used up its budget (ADDRESS_RATE_LIMIT_RPS, ADDRESS_RATE_LIMIT_BURST), its",
    "requests are refused 429 `address_rate_limited` with `Retry-After` before their",
    "credentials are examined, unless they carry a key the gateway issued (or the operator's",
    "token). A request body that does not arrive within the body timeout is 408",
    "`request_timeout`.",
    "",
    "Generated from the gateway's route table and body schemas (src/rest/document.ts).",
  ].join("\n"),
};

const tags = [
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
  { name: "audits", description: "the audits' evidence per offer (operator token)" },
];

const securityOf = {
  none: [],
  operator: [{ operatorToken: [] }],
  apiKeyOrOperator: [{ apiKey: [] }, { operatorToken: [] }],
  apiKeyOrPayer: [{ apiKey: [] }, { payerSignature: [] }],
} as const;

function operation(route: RouteSpec): Record<string, unknown> {
  const auth = route.auth ?? "apiKey";
  const params: (Parameter | Ref)[] = [];
  if (route.pathId !== undefined)
    params.push({
      name: "id",
      in: "path",
      required: true,
      description: route.pathId.description,
      schema: route.pathId.schema ?? { type: "string" },
    });
  params.push(...(route.pathParams ?? []), ...(route.parameters ?? []), parameter("X-Request-Id"));
  const answer: Response =
    "schema" in route.answer
      ? {
          description: route.answer.description,
          headers: { "X-Request-Id": header("X-Request-Id") },
          content: { "application/json": { schema: route.answer.schema as TSchema } },
        }
      : route.answer;
  const responses: Record<string, Response> = { "200": answer };
  for (const [status, response] of Object.entries(route.otherAnswers ?? {}))
    responses[status] = response;
  for (const [status, codes] of Object.entries(routeCodes(route))) {
    if (responses[status] !== undefined) continue;
    responses[status] = errorResponse(Number(status), codes, {
      body: route.body !== undefined,
      ...(route.errorSchema === undefined ? {} : { errorSchema: route.errorSchema }),
    });
  }
  return {
    operationId: route.operationId,
    summary: route.summary,
    ...(route.description === undefined ? {} : { description: route.description }),
    tags: [route.tag],
    ...(auth === "apiKey" ? {} : { security: securityOf[auth] }),
    parameters: params,
    ...(route.body === undefined
      ? {}
      : {
          requestBody: {
            required: route.body.optional !== true,
            content: { "application/json": { schema: route.body.schema } },
          },
        }),
    responses,
  };
}

/** Builds the document of `routes` (the schemas hoisted, as plain JSON). */
export function buildOpenApiDocument(routes: readonly RouteSpec[]): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    (paths[route.path] ??= {})[route.method.toLowerCase()] = operation(route);
  }
  const draft = {
    openapi: "3.1.0",
    info,
    jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
    servers: [{ url: "http://127.0.0.1:8080", description: "a local gateway (`npm start`)" }],
    tags,
    security: [{ apiKey: [] }],
    paths,
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
        payerSignature: {
          type: "http",
          scheme: "Payer",
          description: [
            "`Authorization: Payer payer=<address>, deployment=<GET /v1/gateway deployment>, expires_at=<Unix seconds>, signature=<signature>`:",
            "the payer's EIP-712 `ReadPayerRequests {payer address, deployment string, expiresAt uint64}` in the gateway's domain",
            "(as `ListAuthorizations`; at most 600 s ahead), reading the records of the requests it paid with x402 (docs/agents.md)",
          ].join(" "),
        },
      },
      parameters,
      headers,
      responses: {
        RouteNotFound: errorResponse(404, ["route_not_found"]),
        MethodNotAllowed: errorResponse(405, ["method_not_allowed"]),
      },
    },
  };
  const schemas: Record<string, unknown> = {};
  const hoisted = hoist(draft, schemas) as { components: Record<string, unknown> };
  hoisted.components.schemas = Object.fromEntries(
    Object.entries(schemas).sort(([a], [b]) => a.localeCompare(b)),
  );
  return hoisted;
}

/**
 * A JSON copy of `node` in which every schema marked `x-component` is a `$ref` to
 * `components.schemas[name]` (added to `schemas` once, itself hoisted); members a use adds to
 * the named shape (a description, an error code) stay beside the `$ref`. Gateway annotations
 * that mean nothing to a reader (`x-error-code`) are kept: they say which code a value gets.
 */
function hoist(node: unknown, schemas: Record<string, unknown>): unknown {
  if (Array.isArray(node)) return node.map((n) => hoist(n, schemas));
  if (typeof node !== "object" || node === null) return node;
  const object = node as Record<string, unknown>;
  const name = object["x-component"];
  if (typeof name === "string") {
    const canonical = componentSchemas.get(name);
    if (canonical === undefined) throw new Error(`x-component ${name} was never declared`);
    if (!(name in schemas)) {
      schemas[name] = null; // reserved: a shape that contains itself refers to itself
      schemas[name] = hoistBody(canonical, schemas);
    }
    const extra: Record<string, unknown> = { $ref: `#/components/schemas/${name}` };
    for (const [key, value] of Object.entries(object)) {
      if (key === "x-component") continue;
      const own = (canonical as Record<string, unknown>)[key];
      if (JSON.stringify(own) !== JSON.stringify(value)) extra[key] = hoist(value, schemas);
    }
    return extra;
  }
  return hoistBody(object, schemas);
}

function hoistBody(object: object, schemas: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(object)) {
    if (key === "x-component") continue;
    out[key] = hoist(value, schemas);
  }
  return out;
}
