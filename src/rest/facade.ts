import { ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { Authenticated } from "../connect/authenticate.js";
import { authorizationOf, requestIdOf, type CallGuard } from "../connect/call-guard.js";
import { HeaderView } from "../connect/header-view.js";
import type { Services } from "../connect/routes.js";
import { createServiceCalls } from "../connect/service-call.js";
import type { JsonBounds } from "../domain/chat/request/index.js";
import { GatewayError, type ErrorCode } from "../domain/errors.js";
import { budgetAddress } from "../domain/failure-budget.js";
import { readJson, type NodeRequest, type NodeResponse } from "./body.js";
import { consolePath, createConsoleAssets, type ConsoleAssets } from "./console.js";
import { toHttpError } from "./errors.js";
import type { Route, RouteDeps } from "./route-kit.js";
import { createRouter, targetOf } from "./router.js";

export interface FacadeDeps extends RouteDeps {
  /** The routes it serves (src/rest/routes/index.ts; src/server.ts hands them over). */
  readonly routes: readonly Route[];
  /** The service implementations the routes call directly, through `guard`. */
  readonly services: Services;
  /** The call guard (src/connect/call-guard.ts): each route's call passes it once. */
  readonly guard: CallGuard;
  /** MAX_JSON_DEPTH / MAX_JSON_ARRAY_ITEMS of every JSON body; absent: the defaults. */
  readonly jsonBounds?: JsonBounds | undefined;
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

/**
 * The abort reason of every call whose client left before its answer ended: one object, built
 * once, so that a storm of clients leaving costs no stack trace each. Never mutated.
 */
const clientLeft = new DOMException("the client closed the connection", "AbortError");

export function createRestFacade(deps: FacadeDeps): (req: NodeRequest, res: NodeResponse) => void {
  const { logger, guard, services } = deps;
  const unaryFor = createServiceCalls(services, guard);
  const consoleAssets = deps.console ?? createConsoleAssets();
  const router = createRouter(deps.routes);

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
    let matched: Route | undefined;
    const handled = (async (): Promise<void> => {
      if (pathname.startsWith(consolePath)) {
        // One metrics label for every console file: the paths are the console's, not the caller's.
        route = consolePath;
        if (consoleAssets.serve(req, res, pathname)) return;
        route = "unmatched";
      }
      const match = router.find(req.method, pathname);
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
      // The credentials before the body, with the caller's address: a refused request's body
      // is never read, and an unknown key costs its address from the failed-auth budget.
      const header = new HeaderView(req.headers);
      const apiKeyHeader = match.route.apiKeyHeader === true;
      const need = match.route.auth ?? "apiKey";
      let checked: Authenticated | undefined;
      // No credentials on a payable route: the route prices the request or takes its x402
      // payment (rest/chat.ts); the rest of the routes refuse it here.
      // A request naming a permit or a quote meant a key's spending: 401 without the key.
      const paying =
        match.route.payable === true &&
        deps.x402 === true &&
        authorizationOf(header, apiKeyHeader) === null &&
        header.get("x-gateway-permit") === null &&
        header.get("x-gateway-quote") === null;
      if (need !== "none" && !paying) {
        try {
          checked = await guard.authenticate(
            need,
            authorizationOf(header, apiKeyHeader),
            budgetAddress(req.socket?.remoteAddress),
          );
        } catch (error) {
          req.resume();
          throw error;
        }
      }
      const request = {
        requestId: requestIdOf(header.get("x-request-id")),
        signal: abort.signal,
        header,
        checked,
        apiKeyHeader,
        ...(paying ? { address: budgetAddress(req.socket?.remoteAddress) ?? "unknown" } : {}),
      };
      const body = await bodyOf(match.route, req, deps);
      const reply = await match.route.handle({
        req,
        res,
        query,
        params: match.params,
        request,
        guard,
        services,
        unary: unaryFor(request),
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
