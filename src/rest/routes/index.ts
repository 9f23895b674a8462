import { buildOpenApiDocument } from "../document.js";
import type { ErrorBody } from "../errors.js";
import type { Route } from "../route-kit.js";
import { createRouter, targetOf } from "../router.js";
import { catalogRoutes } from "./catalog.js";
import { chatRoutes } from "./chat.js";
import { gatewayRoutes } from "./gateway.js";
import { inferenceRoutes } from "./inference.js";
import { healthRoutes, metricsRoute, openApiRoute } from "./operations.js";
import { permitRoutes } from "./permit.js";
import { providerRoutes } from "./provider.js";
import { quoteRoutes } from "./quote.js";
import { settlementRoutes } from "./settlement.js";
import { auditRoutes } from "./audit.js";

/**
 * The REST surface, one entry per route: what the OpenAPI document says of it (src/rest/
 * document.ts generates the document from these entries: the path, the body's and the answer's
 * schemas, the route's own error codes) and the handler that turns the HTTP request into one
 * RPC call and its answer back into the spec's JSON. No business rule lives here. One file per
 * service (as src/connect/*-service.ts); this one assembles the table src/server.ts hands the
 * facade, in the order the facade tries its patterns and the document lists the paths.
 */
export const routes: readonly Route[] = [
  ...healthRoutes,
  openApiRoute(openApiDocument),
  ...gatewayRoutes,
  ...catalogRoutes,
  ...quoteRoutes,
  ...chatRoutes,
  ...inferenceRoutes,
  ...permitRoutes,
  ...providerRoutes,
  ...settlementRoutes,
  ...auditRoutes,
];

let document: Record<string, unknown> | undefined;

/** The OpenAPI 3.1 document of these routes (generated once; src/rest/document.ts). */
export function openApiDocument(): Record<string, unknown> {
  document ??= buildOpenApiDocument([...routes.slice(0, 2), metricsRoute, ...routes.slice(2)]);
  return document;
}

/** Every route the facade serves, as `{method, path}` with `{id}` templates (for the OpenAPI test). */
export function restRoutes(): { method: string; path: string }[] {
  return routes.map((r) => ({ method: r.method, path: r.path }));
}

const router = createRouter(routes);

/**
 * The error body a request to `target` gets: a dialect route's own shape (DESIGN.md section 9),
 * else the spec's. For answers given before a route runs (shutdown's 503).
 */
export function errorBodyFor(target: string | undefined, body: ErrorBody): unknown {
  const match = router.find("POST", targetOf(target ?? "/").pathname);
  if (match === undefined || match === "method_not_allowed") return body;
  return match.route.errorBody?.(body.error) ?? body;
}
