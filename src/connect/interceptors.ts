import {
  Code,
  ConnectError,
  type Interceptor,
  type StreamRequest,
  type StreamResponse,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ErrorCode } from "../domain/errors.js";
import { randomHex } from "../domain/random-id.js";
import {
  authenticatedKey,
  createAuthenticator,
  rpcAuthNeed,
  type AuthNeed,
  type AuthOptions,
  type Authenticated,
} from "./authenticate.js";
import { callerKey, requestIdKey, settlementOperatorKey } from "./context.js";
import { errorCodeOf, toConnectError } from "./errors.js";

const requestIdPattern = /^[A-Za-z0-9._-]{1,128}$/;

export function newRequestId(): string {
  return randomHex(12);
}

/** Hooks for metrics (the connect layer never imports a metrics library); they must not throw. */
export interface RpcObserver {
  /**
   * A network RPC ended (the REST facade's in-process calls are counted as REST requests):
   * its procedure (`gateway.v1.XService/Method`), HTTP method, outcome (`ok` or the Connect
   * code, e.g. `resource_exhausted`, `canceled`) and duration in seconds.
   */
  call(procedure: string, method: string, status: string, seconds: number): void;
  /** An error answer of an RPC, network or in process: its gateway error code. */
  rejected(code: ErrorCode, procedure: string): void;
}

/** Connect codes as metric label values: `resource_exhausted`, ... */
const codeLabels = new Map<Code, string>(
  Object.entries(Code)
    .filter((entry): entry is [string, Code] => typeof entry[1] === "number")
    .map(([name, code]) => [
      code,
      name.replace(/[A-Z]/g, (c, i: number) => (i === 0 ? "" : "_") + c.toLowerCase()),
    ]),
);

/**
 * Outermost interceptor: gives the call a request id, logs the outcome with it, and turns every
 * failure, unary or mid-stream, into a ConnectError through {@link toConnectError}. It is the one
 * place a call's outcome is logged, for network RPCs and the REST facade's in-process calls
 * alike: an internal error at error level with its cause, a refusal at info, a caller that went
 * away at info as `cancelled` (an ordinary outcome, not a failure of the gateway), and with
 * debug enabled every success. Nothing is built for the log on a success unless debug is on.
 */
export function observabilityInterceptor(logger: Logger, observer?: RpcObserver): Interceptor {
  return (next) => async (req) => {
    let requestId = req.contextValues.get(requestIdKey);
    if (requestId === "") {
      const header = req.header.get("x-request-id");
      requestId = header !== null && requestIdPattern.test(header) ? header : newRequestId();
      req.contextValues.set(requestIdKey, requestId);
    }
    const started = performance.now();
    // Network calls only: a REST request is counted once, by the facade, under its route.
    const ended =
      observer === undefined || req.url.startsWith("in-process:")
        ? undefined
        : once((status: string) =>
            observer.call(
              rpcName(req),
              req.requestMethod,
              status,
              (performance.now() - started) / 1000,
            ),
          );
    let res: UnaryResponse | StreamResponse;
    try {
      res = await next(req);
    } catch (error) {
      throw callFailed(logger, callOf(req, requestId, started), error, observer, ended);
    }
    if (!res.stream) {
      if (logger.isLevelEnabled("debug")) callOk(logger, callOf(req, requestId, started), "rpc ok");
      ended?.("ok");
      return res;
    }
    return {
      ...res,
      message: observed(res.message, logger, req, requestId, started, observer, ended),
    };
  };
}

function once(record: (status: string) => void): (status: string) => void {
  let done = false;
  return (status) => {
    if (done) return;
    done = true;
    record(status);
  };
}

/** A stream's messages as they come, its end logged (debug) and its failure mapped and logged. */
function observed<T>(
  messages: AsyncIterable<T>,
  logger: Logger,
  req: UnaryRequest | StreamRequest,
  requestId: string,
  started: number,
  observer: RpcObserver | undefined,
  ended: ((status: string) => void) | undefined,
): AsyncIterable<T> {
  // An iterator rather than an async generator around the stream: one promise per message
  // instead of a generator's several.
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const inner = messages[Symbol.asyncIterator]();
      const on = {
        result(result: IteratorResult<T>): IteratorResult<T> {
          if (result.done === true) {
            if (logger.isLevelEnabled("debug"))
              callOk(logger, callOf(req, requestId, started), "rpc stream ok");
            ended?.("ok");
          }
          return result;
        },
        error(error: unknown): never {
          throw callFailed(logger, callOf(req, requestId, started), error, observer, ended);
        },
      };
      return {
        next() {
          return inner.next().then(on.result, on.error);
        },
        return(value?: unknown) {
          // The caller stopped reading before the end (it went away).
          ended?.("canceled");
          if (inner.return === undefined) return Promise.resolve({ done: true, value: value as T });
          return inner.return(value).then(undefined, on.error);
        },
        throw(error?: unknown) {
          if (inner.throw === undefined) return Promise.reject(error);
          return inner.throw(error).then(undefined, on.error);
        },
      };
    },
  };
}

function rpcName(req: UnaryRequest | StreamRequest): string {
  return `${req.service.typeName}/${req.method.name}`;
}

/** One call as its outcome is logged: the RPC's name, its request id, signal and start. */
export interface ObservedCall {
  /** `gateway.v1.XService/Method`. */
  readonly rpc: string;
  readonly requestId: string;
  readonly signal: AbortSignal;
  /** `performance.now()` when the call began. */
  readonly started: number;
}

function callOf(req: UnaryRequest | StreamRequest, requestId: string, started: number) {
  return { rpc: rpcName(req), requestId, signal: req.signal, started };
}

/** Logs a call that ended well (debug level; the caller checks the level first). */
export function callOk(logger: Logger, call: ObservedCall, message: string): void {
  logger.debug(
    { reqId: call.requestId, rpc: call.rpc, ms: Math.round(performance.now() - call.started) },
    message,
  );
}

/**
 * An RPC refused before connect-node saw it (src/server.ts: credentials checked before the body),
 * logged and observed as {@link observabilityInterceptor} would have.
 */
export function observeRefusal(
  logger: Logger,
  observer: RpcObserver | undefined,
  call: {
    readonly rpc: string;
    readonly method: string;
    readonly reqId: string;
    readonly started: number;
  },
  error: ConnectError,
): void {
  const code = errorCodeOf(error);
  const ms = performance.now() - call.started;
  observer?.call(call.rpc, call.method, codeLabels.get(error.code) ?? "unknown", ms / 1000);
  observer?.rejected(code, call.rpc);
  logger.info({ reqId: call.reqId, rpc: call.rpc, ms: Math.round(ms), code }, "rpc rejected");
}

/**
 * Maps a failure to the ConnectError the caller gets, and logs it once: the one place a call's
 * failure is logged and counted, for the interceptors and the REST facade's chat calls alike.
 */
export function callFailed(
  logger: Logger,
  call: ObservedCall,
  error: unknown,
  observer?: RpcObserver,
  ended?: (status: string) => void,
): ConnectError {
  const connectError = toConnectError(error);
  const code = errorCodeOf(connectError);
  const fields = {
    reqId: call.requestId,
    rpc: call.rpc,
    ms: Math.round(performance.now() - call.started),
  };
  if (callerLeft(call.signal, code, error)) {
    logger.info({ ...fields, code: "cancelled" }, "client disconnected");
    ended?.("canceled");
    return new ConnectError("the caller went away", Code.Canceled, undefined, undefined, error);
  }
  ended?.(codeLabels.get(connectError.code) ?? "unknown");
  observer?.rejected(code, fields.rpc);
  if (code === "internal_error")
    logger.error({ ...fields, code, err: connectError.cause ?? error }, "rpc failed");
  else logger.info({ ...fields, code }, "rpc rejected");
  return connectError;
}

/**
 * Whether a call failed because its caller went away: the call's signal was aborted, not by its
 * deadline. What the implementation made of that (the abort itself, or an upstream read it cut
 * short) is its consequence; an internal error that is not the abort stays a failure.
 */
function callerLeft(signal: AbortSignal, code: ErrorCode, error: unknown): boolean {
  if (!signal.aborted) return false;
  const reason: unknown = signal.reason;
  if (reason instanceof ConnectError && reason.code === Code.DeadlineExceeded) return false;
  if (code !== "internal_error") return true;
  let cause = error;
  for (let depth = 0; depth < 8 && cause instanceof Error; depth++) {
    if (cause === reason || cause.name === "AbortError") return true;
    cause = cause.cause;
  }
  return cause === reason;
}

export type { AuthOptions } from "./authenticate.js";

/**
 * Every RPC needs credentials but GatewayService's ({@link rpcAuthNeed}); a key's request rate
 * is then checked (429 `rate_limited` with Retry-After). Credentials already checked before the
 * body was read (src/server.ts, the REST facade: {@link authenticatedKey}) for the same need are
 * applied as they are; otherwise they are checked here. The settlement operator is not rate
 * limited.
 */
export function authInterceptor(options: AuthOptions): Interceptor {
  const admit = createAdmission(options);
  return (next) => async (req) => {
    const need = rpcAuthNeed(req.service.typeName, req.method.name);
    // Whatever credentials come with it: a public answer needs none, and checks none.
    if (need === "none") return next(req);
    const auth = await admit(
      need,
      req.contextValues.get(authenticatedKey),
      req.header.get("authorization"),
    );
    if (auth.operator) {
      if (need === "apiKeyOrOperator") req.contextValues.set(settlementOperatorKey, true);
    } else req.contextValues.set(callerKey, auth.caller);
    return next(req);
  };
}

/**
 * The call guard's admission, one for both transports (the interceptor above, and the REST
 * facade's chat calls): credentials already checked before the body for the same need are
 * taken as they are, else checked now; a key's request rate is then taken (429 `rate_limited`).
 * The settlement operator is not rate limited.
 */
export function createAdmission(
  options: AuthOptions,
): (
  need: Exclude<AuthNeed, "none">,
  checked: Authenticated | undefined,
  authorization: string | null | undefined,
) => Promise<Authenticated> {
  const authenticate = createAuthenticator(options);
  return async (need, checked, authorization) => {
    const auth =
      checked === undefined || checked.need !== need
        ? await authenticate(need, authorization ?? null)
        : checked;
    if (!auth.operator) await options.rateLimiter?.take(auth.caller.apiKeyId);
    return auth;
  };
}
