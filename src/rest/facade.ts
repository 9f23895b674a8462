import { ConnectError, createContextValues } from "@connectrpc/connect";
import type { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { authenticatedKey, type AuthNeed, type Authenticated } from "../connect/authenticate.js";
import type { InProcessCallOptions, InProcessCaller } from "../connect/in-process-transport.js";
import type { JsonBounds } from "../domain/chat-request.js";
import { GatewayError, type ErrorCode } from "../domain/errors.js";
import { readJson, type NodeRequest } from "./body.js";
import type { RestChat } from "./chat.js";
import { consolePath, createConsoleAssets, type ConsoleAssets } from "./console.js";
import { toHttpError, type ErrorBody } from "./errors.js";
import { routes, type Route } from "./routes.js";

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
  /** The chat handler, called directly by the chat routes (chat.ts): no RPC in process. */
  readonly chat: RestChat;
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
  /** The market console's files (GET /console); absent: read from src/console beside the build. */
  readonly console?: ConsoleAssets;
  /**
   * Checks a route's credentials before its body is read (src/server.ts); what it finds goes
   * to the RPC's auth interceptor, which then does not check again. Absent: the RPC checks.
   * `apiKeyHeader`: the route takes the key as `x-api-key` too (the Messages dialect).
   */
  readonly authenticate?: (
    need: Exclude<AuthNeed, "none">,
    req: NodeRequest,
    apiKeyHeader: boolean,
  ) => Promise<Authenticated>;
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

/**
 * The JSON body of a route whose facade validates it (`checkBody`): parsed within the JSON
 * bounds, then checked against the route's schema (400 naming the field). An optional body
 * left empty is `{}`. Other routes read their bytes themselves.
 */
async function bodyOf(route: Route, req: NodeRequest, deps: FacadeDeps): Promise<unknown> {
  if (route.checkBody === undefined) return undefined;
  const limit = Math.min(route.bodyLimitBytes ?? deps.bodyLimitBytes, deps.bodyLimitBytes);
  const { value } = await readJson(req, limit, deps.jsonBounds);
  if (value === undefined && route.body?.optional === true) return route.checkBody({});
  return route.checkBody(value);
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

/** A route's path template as a pattern whose groups are its parameters. */
function patternOf(template: string): RegExp {
  const source = template.replaceAll(/\{[^}]+\}/g, "([^/]+)");
  return new RegExp(`^${source}$`);
}

/** Every route the facade serves, as `{method, path}` with `{id}` templates (for the OpenAPI test). */
export function restRoutes(): { method: string; path: string }[] {
  return routes.map((r) => ({ method: r.method, path: r.path }));
}

/** Routes with a fixed path, by path; the others are tried in order by their patterns. */
const fixedRoutes = new Map<string, Route[]>();
const patternRoutes: { route: Route; pattern: RegExp }[] = [];
for (const route of routes) {
  if (!route.path.includes("{")) {
    const list = fixedRoutes.get(route.path) ?? [];
    list.push(route);
    fixedRoutes.set(route.path, list);
  } else patternRoutes.push({ route, pattern: patternOf(route.path) });
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
  for (const { route, pattern } of patternRoutes) {
    const m = pattern.exec(pathname);
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

/**
 * The abort reason of every call whose client left before its answer ended: one object, built
 * once, so that a storm of clients leaving costs no stack trace each. Never mutated.
 */
const clientLeft = new DOMException("the client closed the connection", "AbortError");

export function createRestFacade(deps: FacadeDeps): (req: NodeRequest, res: NodeResponse) => void {
  const { rpc, logger } = deps;
  const consoleAssets = deps.console ?? createConsoleAssets();

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
    // Only a client that left before the answer ended cancels the call, with one shared reason
    // (`abort()` alone builds an AbortError with a stack trace per call).
    res.once("close", () => {
      shutdown?.removeEventListener("abort", onShutdown);
      if (!res.writableFinished) abort.abort(clientLeft);
      const status = res.headersSent ? res.statusCode : 499;
      observer?.request(route, req.method ?? "", status, (performance.now() - started) / 1000);
    });
    let options: InProcessCallOptions = { headers: req.headers, signal: abort.signal };

    let matched: Route | undefined;
    const handled = (async (): Promise<void> => {
      if (pathname.startsWith(consolePath)) {
        // One metrics label for every console file: the paths are the console's, not the caller's.
        route = consolePath;
        if (consoleAssets.serve(req, res, pathname)) return;
        route = "unmatched";
      }
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
      route = match.route.path;
      matched = match.route;
      // The credentials before the body: a refused request's body is never read.
      const need = match.route.auth ?? "apiKey";
      if (need !== "none" && deps.authenticate !== undefined) {
        let auth: Authenticated;
        try {
          auth = await deps.authenticate(need, req, match.route.apiKeyHeader === true);
        } catch (error) {
          req.resume();
          throw error;
        }
        const contextValues = createContextValues();
        contextValues.set(authenticatedKey, auth);
        options = { ...options, contextValues };
      }
      const body = await bodyOf(match.route, req, deps);
      const reply = await match.route.handle({
        req,
        res,
        query,
        params: match.params,
        options,
        rpc,
        deps,
        body,
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
