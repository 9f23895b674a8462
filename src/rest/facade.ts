import { ConnectError } from "@connectrpc/connect";
import type { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { Dialect, InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { ModelStatusSchema, OfferStatusSchema } from "../../gen/gateway/v1/market_pb.js";
import { PermitAuthorizationStatusSchema, PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import type { InProcessCallOptions, InProcessCaller } from "../connect/in-process-transport.js";
import type { JsonBounds } from "../domain/chat-request.js";
import { dialects } from "../domain/dialects/index.js";
import type { Dialect as DialectTranslator } from "../domain/dialects/types.js";
import { GatewayError, type ErrorCode } from "../domain/errors.js";
import { readJson, readJsonBytes, type NodeRequest } from "./body.js";
import { relayChat } from "./chat.js";
import { toHttpError, type ErrorBody } from "./errors.js";
import { openApiDocument } from "./openapi.js";
import {
  flushView,
  modelView,
  offerHealthView,
  verificationRunView,
  offerView,
  parseStatusFilter,
  authorizeKeyTypedDataView,
  permitAuthorizationView,
  revokeTypedDataView,
  permitBalanceView,
  quoteView,
  requestView,
  typedDataView,
} from "./views.js";

/** The response type connect-node's handlers take (HTTP/1.1 or HTTP/2). */
export type NodeResponse = Parameters<ReturnType<typeof connectNodeAdapter>>[1];

export interface Readiness {
  readonly ok: boolean;
  /** The process is stopping (SIGTERM): `GET /ready` answers 503 `shutting_down` without checks. */
  readonly shuttingDown?: boolean;
  readonly checks: Record<string, { ok: boolean; error?: string }>;
}

export interface FacadeDeps {
  /** Reaches the RPC services in process, through the same interceptors as the network. */
  readonly rpc: InProcessCaller;
  readonly bodyLimitBytes: number;
  /** MAX_JSON_DEPTH / MAX_JSON_ARRAY_ITEMS of every JSON body; absent: the defaults. */
  readonly jsonBounds?: JsonBounds | undefined;
  readonly readiness: () => Promise<Readiness>;
  readonly logger: Logger;
  /** Metrics hooks; absent: nothing is observed. */
  readonly observer?: RestObserver;
  /**
   * Aborted when the shutdown grace is over: requests still in flight are cut, with the
   * signal's reason (`shutting_down`) as their answer or a stream's last event.
   */
  readonly shutdown?: AbortSignal;
}

/** Hooks for metrics (the facade never imports a metrics library); they must not throw. */
export interface RestObserver {
  /**
   * A REST request ended: its route template (`/v1/models/{id}`; `unmatched` when no route
   * matched), method, HTTP status (499 when the client left before an answer) and duration.
   */
  request(route: string, method: string, status: number, seconds: number): void;
  /** An error answered outside any RPC (the RPC layer reports its own): its error code. */
  rejected(code: ErrorCode, route: string): void;
}

interface Call {
  readonly req: NodeRequest;
  readonly res: NodeResponse;
  /** The query string, without its `?` ("" when there is none). */
  readonly query: string;
  readonly params: readonly string[];
  /** What carries the caller's credentials, request id and cancellation to the RPC. */
  readonly options: InProcessCallOptions;
  readonly rpc: InProcessCaller;
  readonly deps: FacadeDeps;
}

interface Reply {
  readonly status?: number;
  readonly body: unknown;
  readonly headers?: Record<string, string>;
}

interface Route {
  readonly method: string;
  /** The path itself, or a pattern whose groups are the path parameters. */
  readonly path: string | RegExp;
  readonly handle: (call: Call) => Promise<Reply | undefined>;
  /** The route's own error body (a dialect's shape); default the spec's `{error: {...}}`. */
  readonly errorBody?: (error: ErrorBody["error"]) => unknown;
}

/** A dialect's error body, carrying the gateway's code. */
const dialectError =
  (dialect: DialectTranslator) =>
  (error: ErrorBody["error"]): unknown =>
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

const id = "([^/]+)";

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

/**
 * The OpenAI-compatible REST surface. Each route translates HTTP into one RPC
 * call and its answer back into the spec's JSON; no business rule lives here.
 */
const routes: Route[] = [
  {
    method: "GET",
    path: "/health",
    handle: async () => ({ body: { status: "ok" } }),
  },
  {
    method: "GET",
    path: "/ready",
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
    handle: async () => ({ body: openApiDocument }),
  },
  {
    method: "GET",
    path: "/v1/models",
    handle: async ({ rpc, options, query }) => {
      const { models } = await rpc.unary(
        CatalogService.method.listModels,
        { status: statusOf(ModelStatusSchema, query) },
        options,
      );
      return { body: { object: "list", data: models.map(modelView) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/models/${id}$`),
    handle: async ({ rpc, options, params }) => {
      const { model, offers } = await rpc.unary(
        CatalogService.method.getModel,
        { id: params[0] },
        options,
      );
      if (model === undefined) throw new Error("GetModel answered without a model");
      return { body: { ...modelView(model), offers: offers.map(offerView) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/models/${id}/offers$`),
    handle: async ({ rpc, options, params, query }) => {
      const { offers } = await rpc.unary(
        CatalogService.method.listOffers,
        { model: params[0], status: statusOf(OfferStatusSchema, query) },
        options,
      );
      return { body: { object: "list", data: offers.map(offerView) } };
    },
  },
  {
    method: "POST",
    path: "/v1/quotes",
    handle: async ({ rpc, options, req, deps, query }) => {
      const dialect = quoteDialect(query);
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      const { quote } = await rpc.unary(
        QuoteService.method.createQuote,
        { body, dialect },
        options,
      );
      if (quote === undefined) throw new Error("CreateQuote answered without a quote");
      return { body: quoteView(quote) };
    },
  },
  {
    method: "POST",
    path: "/v1/chat/completions",
    handle: async ({ rpc, options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      await relayChat(rpc, req, res, body, options);
      return undefined;
    },
  },
  {
    method: "POST",
    path: "/v1/responses",
    errorBody: dialectError(dialects.responses),
    handle: async ({ rpc, options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      await relayChat(rpc, req, res, body, options, {
        id: Dialect.RESPONSES,
        translator: dialects.responses,
      });
      return undefined;
    },
  },
  {
    method: "POST",
    path: "/v1/messages",
    errorBody: dialectError(dialects.messages),
    handle: async ({ rpc, options, req, res, deps }) => {
      const body = await readJsonBytes(req, deps.bodyLimitBytes);
      await relayChat(rpc, req, res, body, withApiKeyHeader(options, req), {
        id: Dialect.MESSAGES,
        translator: dialects.messages,
      });
      return undefined;
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/requests/${id}$`),
    handle: async ({ rpc, options, params }) => {
      const { request } = await rpc.unary(
        InferenceService.method.getRequest,
        { id: params[0] },
        options,
      );
      if (request === undefined) throw new Error("GetRequest answered without a record");
      return { body: requestView(request) };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/permits/${id}$`),
    handle: async ({ rpc, options, params }) => {
      const { permit } = await rpc.unary(
        InferenceService.method.getPermit,
        { permitId: params[0] },
        options,
      );
      if (permit === undefined) throw new Error("GetPermit answered without a permit");
      return { body: permitBalanceView(permit) };
    },
  },
  {
    method: "POST",
    path: "/v1/permit-authorizations/challenge",
    handle: async ({ rpc, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes, deps.jsonBounds));
      const { typedData } = await rpc.unary(
        PermitService.method.createAuthorizationChallenge,
        {
          payer: stringField(body, "payer", true),
          permitId: stringField(body, "permitId", false),
          expiresAt: integerField(body, "expiresAt", false),
        },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: authorizeKeyTypedDataView(typedData) };
    },
  },
  {
    method: "POST",
    path: "/v1/permit-authorizations",
    handle: async ({ rpc, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes, deps.jsonBounds));
      const { authorization } = await rpc.unary(
        PermitService.method.authorizeKey,
        {
          payer: stringField(body, "payer", true),
          permitId: stringField(body, "permitId", true),
          expiresAt: integerField(body, "expiresAt", true),
          nonce: stringField(body, "nonce", true),
          signature: stringField(body, "signature", true),
        },
        options,
      );
      if (authorization === undefined) throw new Error("AuthorizeKey answered without one");
      return { body: { authorization: permitAuthorizationView(authorization) } };
    },
  },
  {
    method: "GET",
    path: "/v1/permit-authorizations",
    handle: async ({ rpc, options, query }) => {
      const { authorizations } = await rpc.unary(
        PermitService.method.listAuthorizations,
        { status: statusOf(PermitAuthorizationStatusSchema, query) },
        options,
      );
      return { body: { object: "list", data: authorizations.map(permitAuthorizationView) } };
    },
  },
  {
    method: "DELETE",
    path: new RegExp(`^/v1/permit-authorizations/${id}$`),
    handle: async ({ rpc, options, params, req }) => {
      req.resume(); // a DELETE takes no body
      const { authorization } = await rpc.unary(
        PermitService.method.revokeAuthorization,
        { id: params[0] },
        options,
      );
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationView(authorization) } };
    },
  },
  {
    method: "POST",
    path: new RegExp(`^/v1/permit-authorizations/${id}/revocation-challenge$`),
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
  {
    method: "POST",
    path: new RegExp(`^/v1/permit-authorizations/${id}/revoke$`),
    handle: async ({ rpc, options, params, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes, deps.jsonBounds));
      const { authorization } = await rpc.unary(
        PermitService.method.revokeAuthorizationBySignature,
        { id: params[0], signature: stringField(body, "signature", true) },
        options,
      );
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationView(authorization) } };
    },
  },
  {
    method: "POST",
    path: "/v1/provider-offers/challenge",
    handle: async ({ rpc, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes, deps.jsonBounds));
      const { typedData } = await rpc.unary(
        ProviderService.method.createRegistrationChallenge,
        {
          offerId: stringField(body, "offerId", true),
          endpointUrl: stringField(body, "endpointUrl", true),
          nonce: stringField(body, "nonce", false),
          expiresAt: integerField(body, "expiresAt", false),
          endpointToken: stringField(body, "endpointToken", false),
        },
        options,
      );
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: typedDataView(typedData) };
    },
  },
  {
    method: "POST",
    path: "/v1/provider-offers/register",
    handle: async ({ rpc, options, req, deps }) => {
      const body = objectBody(await readJson(req, deps.bodyLimitBytes, deps.jsonBounds));
      const { offer } = await rpc.unary(
        ProviderService.method.registerEndpoint,
        {
          offerId: stringField(body, "offerId", true),
          endpointUrl: stringField(body, "endpointUrl", true),
          nonce: stringField(body, "nonce", true),
          expiresAt: integerField(body, "expiresAt", true),
          signature: stringField(body, "signature", true),
          endpointToken: stringField(body, "endpointToken", false),
        },
        options,
      );
      if (offer === undefined) throw new Error("registration answered without an offer");
      return { body: { offer: offerView(offer) } };
    },
  },
  {
    method: "GET",
    path: new RegExp(`^/v1/provider-offers/${id}/health$`),
    handle: async ({ rpc, options, params }) => {
      const { health } = await rpc.unary(
        ProviderService.method.getOfferHealth,
        { offerId: params[0] },
        options,
      );
      if (health === undefined) throw new Error("health answered without a health record");
      return { body: offerHealthView(health) };
    },
  },
  {
    method: "POST",
    path: new RegExp(`^/v1/provider-offers/${id}/verify$`),
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
          offer: offerView(offer),
          ...(verification === undefined
            ? {}
            : { verification: verificationRunView(verification) }),
        },
      };
    },
  },
  {
    method: "POST",
    path: "/settlements/flush",
    handle: async ({ rpc, options, req, deps }) => {
      const parsed = await readJson(req, deps.bodyLimitBytes, deps.jsonBounds);
      const body = parsed.value === undefined ? {} : objectBody(parsed);
      const maxRequests = body.maxRequests ?? body.max_requests;
      if (
        maxRequests !== undefined &&
        maxRequests !== null &&
        (typeof maxRequests !== "number" ||
          !Number.isSafeInteger(maxRequests) ||
          maxRequests < 1 ||
          maxRequests > 0xffffffff)
      ) {
        throw new GatewayError("invalid_request", "'maxRequests' must be a positive integer");
      }
      const dryRun = body.dryRun ?? body.dry_run;
      if (dryRun !== undefined && dryRun !== null && typeof dryRun !== "boolean") {
        throw new GatewayError("invalid_request", "'dryRun' must be a boolean");
      }
      const response = await rpc.unary(
        SettlementService.method.flush,
        {
          ...(typeof maxRequests === "number" ? { maxRequests } : {}),
          dryRun: dryRun === true,
        },
        options,
      );
      return { body: flushView(response) };
    },
  },
];

/** The JSON body as an object (400 for anything else). */
function objectBody(parsed: { value: unknown }): Record<string, unknown> {
  const value = parsed.value;
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new GatewayError("invalid_request", "the request body must be a JSON object");
  }
  return value as Record<string, unknown>;
}

function stringField(body: Record<string, unknown>, name: string, required: boolean): string {
  const value = body[name];
  if (value === undefined || value === null) {
    if (required) throw new GatewayError("invalid_request", `'${name}' is required`);
    return "";
  }
  if (typeof value !== "string")
    throw new GatewayError("invalid_request", `'${name}' must be a string`);
  return value;
}

function integerField(body: Record<string, unknown>, name: string, required: true): bigint;
function integerField(
  body: Record<string, unknown>,
  name: string,
  required: false,
): bigint | undefined;
function integerField(
  body: Record<string, unknown>,
  name: string,
  required: boolean,
): bigint | undefined {
  const value = body[name];
  if (value === undefined || value === null) {
    if (required) throw new GatewayError("invalid_request", `'${name}' is required`);
    return undefined;
  }
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new GatewayError("invalid_request", `'${name}' must be an integer (Unix seconds)`);
  }
  return BigInt(value);
}

function decodePathParam(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new GatewayError("invalid_request", "malformed percent-encoding in the path");
  }
}

function sendJson(
  res: NodeResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
    ...headers,
  });
  res.end(payload);
}

/** A route's path as a metric label: `/v1/models/{id}`, never a raw path. */
const templates = new Map<Route, string>(
  routes.map((r) => [
    r,
    typeof r.path === "string"
      ? r.path
      : r.path.source.slice(1, -1).replaceAll("\\/", "/").replaceAll(id, "{id}"),
  ]),
);

/** Every route the facade serves, as `{method, path}` with `{id}` templates (for the OpenAPI test). */
export function restRoutes(): { method: string; path: string }[] {
  return routes.map((r) => ({ method: r.method, path: templates.get(r) ?? "" }));
}

/** Routes with a fixed path, by path; the others are tried in order by their patterns. */
const fixedRoutes = new Map<string, Route[]>();
const patternRoutes: Route[] = [];
for (const route of routes) {
  if (typeof route.path === "string") {
    const list = fixedRoutes.get(route.path) ?? [];
    list.push(route);
    fixedRoutes.set(route.path, list);
  } else patternRoutes.push(route);
}

function findRoute(
  method: string | undefined,
  pathname: string,
): { route: Route; params: string[] } | "method_not_allowed" | undefined {
  let pathKnown = false;
  const fixed = fixedRoutes.get(pathname);
  if (fixed !== undefined) {
    pathKnown = true;
    for (const route of fixed) if (route.method === method) return { route, params: [] };
  }
  for (const route of patternRoutes) {
    const m = (route.path as RegExp).exec(pathname);
    if (m === null) continue;
    pathKnown = true;
    if (route.method === method) return { route, params: m.slice(1).map(decodePathParam) };
  }
  return pathKnown ? "method_not_allowed" : undefined;
}

// A request target whose path WHATWG URL parsing leaves as it is: no query or fragment, no
// backslash, no leading "//", only characters a path keeps unencoded, and no dot segment.
const plainTarget = /^\/(?!\/)[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*$/;
const dotSegment = /(?:^|\/)(?:\.|%2e){1,2}(?:\/|$)/i;

/** The path and query of a request target, as `new URL(target, base)` reads them. */
function targetOf(target: string): { pathname: string; query: string } {
  // The common target needs no parse (a URL costs about a microsecond).
  if (plainTarget.test(target) && !dotSegment.test(target)) return { pathname: target, query: "" };
  const url = new URL(target, "http://gateway.invalid");
  return { pathname: url.pathname, query: url.search.slice(1) };
}

/**
 * The error body a request to `target` gets: a dialect route's own shape (DESIGN.md section 9),
 * else the spec's. For answers given before a route runs (shutdown's 503).
 */
export function errorBodyFor(target: string | undefined, body: ErrorBody): unknown {
  const match = findRoute("POST", targetOf(target ?? "/").pathname);
  if (match === undefined || match === "method_not_allowed") return body;
  return match.route.errorBody?.(body.error) ?? body;
}

export function createRestFacade(deps: FacadeDeps): (req: NodeRequest, res: NodeResponse) => void {
  const { rpc, logger } = deps;

  return (req, res) => {
    const { pathname, query } = targetOf(req.url ?? "/");
    const abort = new AbortController();
    const { observer, shutdown } = deps;
    // Set when shutdown cut this request (not its client): it still gets an answer.
    let cut = false;
    const onShutdown = (): void => {
      cut = true;
      abort.abort(shutdown?.reason);
    };
    shutdown?.addEventListener("abort", onShutdown, { once: true });
    const started = observer === undefined ? 0 : performance.now();
    let route = "unmatched";
    // Only a client that left before the answer ended cancels the call (an abort builds an
    // AbortError with a stack trace: not something to pay for on every finished request).
    res.once("close", () => {
      shutdown?.removeEventListener("abort", onShutdown);
      if (!res.writableFinished) abort.abort();
      const status = res.headersSent ? res.statusCode : 499;
      observer?.request(route, req.method ?? "", status, (performance.now() - started) / 1000);
    });
    const options: InProcessCallOptions = { headers: req.headers, signal: abort.signal };

    let matched: Route | undefined;
    const handled = (async (): Promise<void> => {
      const match = findRoute(req.method, pathname);
      if (match === undefined || match === "method_not_allowed") {
        req.resume();
        throw match === "method_not_allowed"
          ? new GatewayError("method_not_allowed", `${req.method} is not allowed on ${pathname}`)
          : new GatewayError(
              "route_not_found",
              `no route for ${req.method} ${pathname.slice(0, 200)}`,
            );
      }
      route = templates.get(match.route) ?? route;
      matched = match.route;
      const reply = await match.route.handle({
        req,
        res,
        query,
        params: match.params,
        options,
        rpc,
        deps,
      });
      if (reply !== undefined && !res.headersSent)
        sendJson(res, reply.status ?? 200, reply.body, reply.headers);
    })();

    handled.catch((failure: unknown) => {
      const error: unknown = cut ? shutdown?.reason : failure;
      // A ConnectError is an RPC's outcome, which the observability interceptor has logged; what
      // failed outside an RPC (the route, the body, this facade) is logged here, once.
      const left = abort.signal.aborted && !cut;
      if (!(error instanceof ConnectError)) {
        logOutcome(logger, req, pathname, error, left);
        if (!left) observer?.rejected(toHttpError(error).body.error.code, route);
      }
      if (left || res.destroyed) return; // nobody to answer
      if (res.headersSent) {
        res.end();
        return;
      }
      const { status, body, headers } = toHttpError(error);
      sendJson(res, status, matched?.errorBody?.(body.error) ?? body, headers);
    });
  };
}

/** The outcome of a request that failed before or after its RPC, not in it. */
function logOutcome(
  logger: Logger,
  req: NodeRequest,
  path: string,
  error: unknown,
  clientLeft: boolean,
): void {
  const reqId = req.headers["x-request-id"];
  if (clientLeft) {
    logger.info({ reqId, path, code: "cancelled" }, "client disconnected");
    return;
  }
  const { status, body } = toHttpError(error);
  if (status >= 500 && body.error.code === "internal_error")
    logger.error({ reqId, path, err: error }, "request failed");
  else logger.info({ reqId, path, code: body.error.code }, "request rejected");
}
