import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import {
  authenticatedKey,
  createAuthenticator,
  rpcAuthNeed,
  type AuthNeed,
  type Authenticated,
} from "./connect/authenticate.js";
import { toConnectError } from "./connect/errors.js";
import { chatInputOf } from "./connect/inference-messages.js";
import {
  authInterceptor,
  callFailed,
  callOk,
  createAdmission,
  newRequestId,
  observabilityInterceptor,
  observeRefusal,
  type AuthOptions,
} from "./connect/interceptors.js";
import { createInProcessCaller } from "./connect/in-process-transport.js";
import { writeRpcRefusal } from "./connect/refusal.js";
import { createRoutes, serviceBindings, type Services } from "./connect/routes.js";
import type { JsonBounds } from "./domain/chat-request.js";
import type { Inference } from "./domain/chat/ports.js";
import type { ChatSink } from "./domain/chat/types.js";
import type { RestChat } from "./rest/chat.js";
import type { NodeRequest } from "./rest/body.js";
import { createRestFacade, type NodeResponse, type Readiness } from "./rest/facade.js";
import { routes as restRoutes } from "./rest/routes/index.js";
import { isMetricsPath, type GatewayMetrics } from "./runtime/metrics.js";
import { budgetAddress } from "./domain/rate-limit.js";

export interface GatewayHandlerDeps extends AuthOptions {
  readonly services: Services;
  /** The chat handler (the domain's push entry): the REST chat routes call it directly. */
  readonly chat: Inference["chatInto"];
  readonly logger: Logger;
  readonly bodyLimitBytes: number;
  /** MAX_JSON_DEPTH / MAX_JSON_ARRAY_ITEMS of the REST facade's JSON bodies. */
  readonly jsonBounds?: JsonBounds | undefined;
  readonly readiness: () => Promise<Readiness>;
  /** Metrics: observed when given; `GET /metrics` served here too when `serveMetrics`. */
  readonly metrics?: GatewayMetrics;
  /** False when the metrics have their own listener (METRICS_PORT): /metrics is then a 404 here. */
  readonly serveMetrics?: boolean;
  /** Aborted when the shutdown grace is over: REST requests in flight are cut (`shutting_down`). */
  readonly shutdown?: AbortSignal;
}

const requestIdPattern = /^[A-Za-z0-9._-]{1,128}$/;
const rpcPath = /^\/([A-Za-z0-9_.]+)\/([A-Za-z0-9_]+)(?:\?|$)/;

/** The `Authorization` a request presents: its header, or a dialect's `x-api-key` as a bearer. */
function authorizationOf(req: NodeRequest, apiKeyHeader: boolean): string | undefined {
  const header = req.headers.authorization;
  if (header !== undefined || !apiKeyHeader) return header;
  const key = req.headers["x-api-key"];
  return typeof key === "string" ? `Bearer ${key}` : undefined;
}

/**
 * One request handler for everything: Connect, gRPC and gRPC-Web for the RPC
 * paths, and the REST facade (connect-node's fallback) for the rest. The
 * facade reaches the same implementations in process (no serialisation) through
 * the same interceptors, so authentication, logging and error mapping exist once.
 *
 * Credentials are checked before a request's body is read (docs/decisions/authority-and-signing.md "Unknown keys cost
 * nothing"): here for the RPC paths, by the facade for its routes, with the caller's address
 * for the failed-authentication budget. A refused RPC is answered in its own protocol's form
 * without connect-node reading its body; one admitted carries what was found to the auth
 * interceptor, which does not check again.
 */
export function createGatewayHandler(
  deps: GatewayHandlerDeps,
): (req: NodeRequest, res: NodeResponse) => void {
  const { metrics } = deps;
  const authenticate = createAuthenticator(deps);
  const interceptors = [observabilityInterceptor(deps.logger, metrics?.rpc), authInterceptor(deps)];
  const bindings = serviceBindings(deps.services);
  const routes = createRoutes(deps.services);
  const rpc = createInProcessCaller(bindings, interceptors);
  const chat = restChat(deps);
  // The need of each RPC path this gateway serves, by `service/method`.
  const rpcNeeds = new Map<string, AuthNeed>();
  for (const { service } of bindings) {
    for (const method of service.methods) {
      rpcNeeds.set(
        `${service.typeName}/${method.name}`,
        rpcAuthNeed(service.typeName, method.name),
      );
    }
  }
  const checked = new WeakMap<NodeRequest, Authenticated>();
  const facade = createRestFacade({
    routes: restRoutes,
    rpc,
    chat,
    bodyLimitBytes: deps.bodyLimitBytes,
    jsonBounds: deps.jsonBounds,
    readiness: deps.readiness,
    logger: deps.logger,
    authenticate: (need, req, apiKeyHeader) =>
      authenticate(
        need,
        authorizationOf(req, apiKeyHeader),
        budgetAddress(req.socket?.remoteAddress),
      ),
    ...(metrics === undefined ? {} : { observer: metrics.rest }),
    ...(deps.shutdown === undefined ? {} : { shutdown: deps.shutdown }),
  });
  const connect = connectNodeAdapter({
    routes,
    interceptors,
    readMaxBytes: deps.bodyLimitBytes + 1024,
    fallback: facade,
    contextValues: (req) => {
      const values = createContextValues();
      const auth = checked.get(req);
      if (auth !== undefined) values.set(authenticatedKey, auth);
      return values;
    },
  });
  // Before the REST facade and without credentials, as scrapers expect.
  const scrapeHere = metrics !== undefined && deps.serveMetrics !== false ? metrics : undefined;
  return (req, res) => {
    if (scrapeHere !== undefined && isMetricsPath(req.url)) {
      scrapeHere.handle(req, res);
      return;
    }
    const incoming = req.headers["x-request-id"];
    const requestId =
      typeof incoming === "string" && requestIdPattern.test(incoming) ? incoming : newRequestId();
    req.headers["x-request-id"] = requestId;
    res.setHeader("x-request-id", requestId);
    const path = rpcPath.exec(req.url ?? "");
    const procedure = path === null ? undefined : `${path[1]}/${path[2]}`;
    const need = procedure === undefined ? undefined : rpcNeeds.get(procedure);
    if (need === undefined || need === "none") {
      connect(req, res);
      return;
    }
    const started = performance.now();
    authenticate(need, req.headers.authorization, budgetAddress(req.socket?.remoteAddress)).then(
      (auth) => {
        checked.set(req, auth);
        connect(req, res);
      },
      (error: unknown) => {
        const refusal = toConnectError(error);
        observeRefusal(
          deps.logger,
          metrics?.rpc,
          { rpc: procedure!, method: req.method ?? "", reqId: requestId, started },
          refusal,
        );
        if (!res.headersSent && !res.destroyed) writeRpcRefusal(req, res, refusal);
      },
    );
  };
}

/** The chat RPC, by name: how the REST chat routes' calls are logged and counted. */
const chatRpc = "gateway.v1.InferenceService/StreamChatCompletion";

/**
 * The REST chat routes' way to the chat handler: the call guard the interceptors also run (the
 * caller admitted as `createAdmission` does; the outcome logged and counted as
 * `observabilityInterceptor` does, under the chat RPC's name), then `chatInto` with the route's
 * sink. The sink's `failed`/`cancelled` get the ConnectError the guard mapped and logged, so
 * the facade does not log it again.
 */
function restChat(deps: GatewayHandlerDeps): RestChat {
  const admit = createAdmission(deps);
  const { logger, metrics } = deps;
  const observer = metrics?.rpc;
  return async (fields, options, sink) => {
    const header = options.headers["x-request-id"];
    const call = {
      rpc: chatRpc,
      requestId: typeof header === "string" ? header : newRequestId(),
      signal: options.signal,
      started: performance.now(),
    };
    let caller;
    try {
      const auth = await admit(
        "apiKey",
        options.contextValues?.get(authenticatedKey),
        headerValue(options.headers.authorization),
      );
      if (auth.operator) throw new Error("the settlement operator is not an API key");
      caller = auth.caller;
    } catch (error) {
      sink.failed(callFailed(logger, call, error, observer));
      return;
    }
    const guarded: ChatSink = {
      started: (event) => sink.started(event),
      chunk: (event, parsed) => sink.chunk(event, parsed),
      drained: () => sink.drained(),
      completed: (event) => sink.completed(event),
      failed: (error) => sink.failed(callFailed(logger, call, error, observer)),
      cancelled: (reason) => sink.cancelled(callFailed(logger, call, reason, observer)),
    };
    try {
      await deps.chat(
        chatInputOf(caller, fields, options.signal, headerGetter(options.headers)),
        guarded,
      );
      if (logger.isLevelEnabled("debug")) callOk(logger, call, "rpc stream ok");
    } catch (error) {
      // After the answer (its charge's record): the service's to log, not the client's.
      callFailed(logger, call, error, observer);
    }
  };
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return typeof value === "string" ? value : value?.join(", ");
}

/** Node's request headers read as `Headers.get` reads (a tracer's `traceparent`). */
function headerGetter(headers: Readonly<Record<string, string | string[] | undefined>>): {
  get(name: string): string | null;
} {
  return { get: (name) => headerValue(headers[name.toLowerCase()]) ?? null };
}
