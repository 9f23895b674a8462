import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import {
  authenticatedKey,
  rpcAuthNeed,
  type AuthNeed,
  type AuthOptions,
  type Authenticated,
} from "./connect/authenticate.js";
import { createCallGuard, requestIdOf } from "./connect/call-guard.js";
import { HeaderView } from "./connect/header-view.js";
import { guardInterceptor } from "./connect/interceptors.js";
import { writeRpcRefusal } from "./connect/refusal.js";
import { createRoutes, serviceBindings, type Services } from "./connect/routes.js";
import type { JsonBounds } from "./domain/chat/request/index.js";
import type { NodeRequest } from "./rest/body.js";
import type { NodeResponse } from "./rest/body.js";
import { createRestFacade } from "./rest/facade.js";
import type { Readiness } from "./rest/route-kit.js";
import { routes as restRoutes } from "./rest/routes/index.js";
import { isMetricsPath, type GatewayMetrics } from "./runtime/metrics.js";
import { budgetAddress } from "./domain/failure-budget.js";

export interface GatewayHandlerDeps extends AuthOptions {
  readonly services: Services;
  readonly logger: Logger;
  readonly bodyLimitBytes: number;
  /** Chat requests without credentials may pay with x402 (issue 37). */
  readonly x402?: boolean | undefined;
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

/** The signal of a call refused before it began: nobody aborts it. */
const notAborted = new AbortController().signal;

const rpcPath = /^\/([A-Za-z0-9_.]+)\/([A-Za-z0-9_]+)(?:\?|$)/;

/**
 * One request handler for everything, which only dispatches: Connect, gRPC and gRPC-Web for the
 * RPC paths (connect-node, its one interceptor over the call guard), and the REST facade
 * (connect-node's fallback) for the rest, which calls the same implementations directly through
 * the same call guard (src/connect/call-guard.ts): the request id, authentication, rate limits,
 * logging and error mapping exist once.
 *
 * Credentials are checked before a request's body is read (docs/decisions/authority-and-signing.md
 * "Unknown keys cost nothing"): here for the RPC paths, by the facade for its routes, with the
 * caller's address for the failed-authentication budget. A refused RPC is answered in its own
 * protocol's form without connect-node reading its body; one admitted carries what was found to
 * the interceptor, which does not check again.
 */
export function createGatewayHandler(
  deps: GatewayHandlerDeps,
): (req: NodeRequest, res: NodeResponse) => void {
  const { metrics } = deps;
  const guard = createCallGuard({ ...deps, observer: metrics?.rpc });
  const bindings = serviceBindings(deps.services);
  const routes = createRoutes(deps.services);
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
    services: deps.services,
    guard,
    bodyLimitBytes: deps.bodyLimitBytes,
    x402: deps.x402,
    jsonBounds: deps.jsonBounds,
    readiness: deps.readiness,
    logger: deps.logger,
    ...(metrics === undefined ? {} : { observer: metrics.rest }),
    ...(deps.shutdown === undefined ? {} : { shutdown: deps.shutdown }),
  });
  const connect = connectNodeAdapter({
    routes,
    interceptors: [guardInterceptor(guard)],
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
    const requestId = requestIdOf(typeof incoming === "string" ? incoming : undefined);
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
    guard
      .authenticate(need, req.headers.authorization, budgetAddress(req.socket?.remoteAddress))
      .then(
        (auth) => {
          checked.set(req, auth);
          connect(req, res);
        },
        (error: unknown) => {
          // Logged and counted as the RPC's outcome, from when the request came.
          const call = guard.open(procedure!, {
            requestId,
            signal: notAborted,
            header: new HeaderView(req.headers),
            counted: { method: req.method ?? "" },
            started,
          });
          const refusal = call.outcome(error)!;
          if (!res.headersSent && !res.destroyed) writeRpcRefusal(req, res, refusal);
        },
      );
  };
}
