import { Type } from "@sinclair/typebox";
import { Health, Readiness } from "../views/resources.js";
import { header } from "../document.js";
import type { Route } from "../route-kit.js";
import type { RouteSpec } from "../route-spec.js";

/** The operations routes: liveness, readiness, the OpenAPI document (and /metrics, declared). */

/**
 * `/metrics` is served before the facade (src/server.ts: on the main port, or only on
 * METRICS_PORT); it is declared here for the document.
 */
export const metricsRoute: RouteSpec = {
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

/** `GET /health` and `GET /ready`. */
export const healthRoutes: readonly Route[] = [
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
    summary: "Readiness: the database and the chain answer, the tokenizers are loaded",
    description:
      "503 `unavailable` with the failing check, or `shutting_down` from SIGTERM on (before anything else stops). `checks.tokenizers` names the tokenizers loading (`loading`) and those whose last load failed (`failed`): not ready while a tokenizer a model with an active offer needs is loading.",
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
];

/** `GET /openapi.json`, answering `document()` (the document is built from every route). */
export function openApiRoute(document: () => Record<string, unknown>): Route {
  return {
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
    handle: async () => ({ body: document() }),
  };
}
