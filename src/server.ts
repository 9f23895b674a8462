import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import {
  authInterceptor,
  newRequestId,
  observabilityInterceptor,
  type AuthOptions,
} from "./connect/interceptors.js";
import { createInProcessCaller } from "./connect/in-process-transport.js";
import { createRoutes, serviceBindings, type Services } from "./connect/routes.js";
import type { JsonBounds } from "./domain/chat-request.js";
import type { NodeRequest } from "./rest/body.js";
import { createRestFacade, type NodeResponse, type Readiness } from "./rest/facade.js";
import { isMetricsPath, type GatewayMetrics } from "./metrics.js";

export interface GatewayHandlerDeps extends AuthOptions {
  readonly services: Services;
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

/**
 * One request handler for everything: Connect, gRPC and gRPC-Web for the RPC
 * paths, and the REST facade (connect-node's fallback) for the rest. The
 * facade reaches the same implementations in process (no serialisation) through
 * the same interceptors, so authentication, logging and error mapping exist once.
 */
export function createGatewayHandler(
  deps: GatewayHandlerDeps,
): (req: NodeRequest, res: NodeResponse) => void {
  const { metrics } = deps;
  const interceptors = [observabilityInterceptor(deps.logger, metrics?.rpc), authInterceptor(deps)];
  const routes = createRoutes(deps.services);
  const rpc = createInProcessCaller(serviceBindings(deps.services), interceptors);
  const facade = createRestFacade({
    rpc,
    bodyLimitBytes: deps.bodyLimitBytes,
    jsonBounds: deps.jsonBounds,
    readiness: deps.readiness,
    logger: deps.logger,
    ...(metrics === undefined ? {} : { observer: metrics.rest }),
    ...(deps.shutdown === undefined ? {} : { shutdown: deps.shutdown }),
  });
  const connect = connectNodeAdapter({
    routes,
    interceptors,
    readMaxBytes: deps.bodyLimitBytes + 1024,
    fallback: facade,
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
    connect(req, res);
  };
}
