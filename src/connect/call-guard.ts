import { Code, ConnectError, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import type { DescMethod } from "@bufbuild/protobuf";
import type { Logger } from "pino";
import type { ErrorCode } from "../domain/errors.js";
import { GatewayError } from "../domain/errors.js";
import { randomHex } from "../domain/random-id.js";
import {
  createAuthenticator,
  type Authenticate,
  noAuthority,
  type AuthNeed,
  type AuthOptions,
  type Authenticated,
} from "./authenticate.js";
import { callerKey, settlementOperatorKey } from "./context.js";
import { errorCodeOf, toConnectError } from "./errors.js";

/**
 * The call guard: the one door every call passes, whatever its transport (connect-node's
 * interceptor, src/connect/interceptors.ts; the REST facade, once per route). It reads or makes
 * the request id, checks the credentials (before the body when it can, with the caller's address
 * for the failed-authentication budget; else when the call runs), takes the key's request rate,
 * and gives the call one `outcome(error?)` that logs and counts it once.
 */

const requestIdPattern = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * The request id of a call: the client's `X-Request-Id` when it is a sane token, else a new one.
 * The one place a request id is made.
 */
export function requestIdOf(header: string | null | undefined): string {
  return typeof header === "string" && requestIdPattern.test(header) ? header : randomHex(12);
}

/**
 * The `Authorization` a call presents: its header, or, where the route takes it (the Messages
 * dialect, as Anthropic's clients send it), its `x-api-key` as a bearer token.
 */
export function authorizationOf(header: Headers, apiKeyHeader: boolean): string | null {
  const authorization = header.get("authorization");
  if (authorization !== null || !apiKeyHeader) return authorization;
  const key = header.get("x-api-key");
  return key === null ? null : `Bearer ${key}`;
}

/** Hooks for metrics (the connect layer never imports a metrics library); they must not throw. */
export interface RpcObserver {
  /**
   * A network RPC ended (the REST facade's calls are counted as REST requests): its procedure
   * (`gateway.v1.XService/Method`), HTTP method, outcome (`ok` or the Connect code, e.g.
   * `resource_exhausted`, `canceled`) and duration in seconds.
   */
  call(procedure: string, method: string, status: string, seconds: number): void;
  /** An error answer of an RPC, network or REST: its gateway error code. */
  rejected(code: ErrorCode, procedure: string): void;
}

export interface CallGuardOptions extends AuthOptions {
  readonly logger: Logger;
  readonly observer?: RpcObserver | undefined;
}

/** What the guard knows of one call when it opens it. */
export interface CallRequest {
  readonly requestId: string;
  /** The call's signal: aborted when its caller went away (or its deadline passed). */
  readonly signal: AbortSignal;
  readonly header: Headers;
  /** Credentials checked before the body was read, for the need they were checked against. */
  readonly checked?: Authenticated | undefined;
  /** The key may come as `x-api-key` (the Messages dialect). */
  readonly apiKeyHeader?: boolean;
  /**
   * Set when the call came without credentials to a payable route (x402): the caller's address,
   * the rate-limit key of a request still to be priced.
   */
  readonly address?: string | undefined;
  /** A network RPC, counted under its procedure with this HTTP method; absent: a REST route's call. */
  readonly counted?: { readonly method: string } | undefined;
  /** `performance.now()` when the call began; default: when it is opened. */
  readonly started?: number;
}

export interface CallGuard {
  /**
   * Checks credentials before a body is read, with the caller's `address` for the
   * failed-authentication budget (docs/decisions/authority-and-signing.md "Unknown keys cost
   * nothing"): an unknown key is refused before anything else is read.
   */
  readonly authenticate: Authenticate;
  /** Opens one call of `rpc` (`gateway.v1.XService/Method`, the name it is logged and counted under). */
  open(rpc: string, request: CallRequest): GuardedCall;
}

export function createCallGuard(options: CallGuardOptions): CallGuard {
  const authenticate = createAuthenticator(options);
  return {
    authenticate,
    open: (rpc, request) => new GuardedCall(options, authenticate, rpc, request),
  };
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
 * One call through the guard. Its outcome is logged once: an internal error at error level with
 * its cause, a refusal at info, a caller that went away at info as `cancelled` (an ordinary
 * outcome, not a failure of the gateway), and with debug enabled a success; nothing is built
 * for the log on a success unless debug is on.
 */
export class GuardedCall {
  readonly requestId: string;
  readonly signal: AbortSignal;
  readonly started: number;
  private counted = false;
  private failure: ConnectError | undefined;
  private ended = false;

  constructor(
    private readonly options: CallGuardOptions,
    private readonly authenticate: Authenticate,
    readonly rpc: string,
    private readonly request: CallRequest,
  ) {
    this.requestId = request.requestId;
    this.signal = request.signal;
    this.started = request.started ?? performance.now();
  }

  /**
   * Admits the caller for `need`: credentials checked before the body for the same need are
   * taken as they are, else checked now; a key's request rate is then taken (429
   * `rate_limited`; the settlement operator is not rate limited). What was found goes into
   * `values` for the service method (`callerKey`, `settlementOperatorKey`).
   */
  async admit(need: Exclude<AuthNeed, "none">, values: ContextValues): Promise<Authenticated> {
    const { checked, header, apiKeyHeader } = this.request;
    const auth =
      checked === undefined || checked.need !== need
        ? await this.authenticate(need, authorizationOf(header, apiKeyHeader === true))
        : checked;
    if (auth.operator) {
      if (need === "apiKeyOrOperator") values.set(settlementOperatorKey, true);
    } else {
      await this.options.rateLimiter?.take(auth.caller.apiKeyId);
      values.set(callerKey, auth.caller);
    }
    return auth;
  }

  /**
   * Admits a caller without credentials who pays per request with x402 (issue 37): as `id`
   * (`x402:<payer>` for a signed payment, `x402-address:<address>` for a request still to be
   * priced), rate limited as a key is, with an authority that covers no permit.
   */
  async admitPaying(id: string, values: ContextValues, withPayment = false): Promise<void> {
    // A payment's checks cost a signature's recovery and a chain call: an address whose
    // payments were refused as often as its failure budget allows sends no more for a while.
    const { address } = this.request;
    const budget = this.options.failedAuthentications;
    const wait = withPayment && address !== undefined ? budget?.exhausted(address) : undefined;
    if (wait !== undefined)
      throw new GatewayError(
        "address_rate_limited",
        "too many refused payments from this address; retry after the Retry-After delay",
        { retryAfterSeconds: wait },
      );
    await this.options.rateLimiter?.take(id);
    values.set(callerKey, { apiKeyId: id, authority: noAuthority });
  }

  /**
   * A payment this caller sent was refused (it did not check out, or the chain or the payment
   * store refused it): one failure from its address's budget, as a bad key's.
   */
  paymentRefused(): void {
    const { address } = this.request;
    if (address !== undefined) this.options.failedAuthentications?.failed(address);
  }

  /**
   * The call ended: well (no `error`; `message` is the debug line), or with `error`, mapped to
   * the ConnectError its caller gets. Logged and counted once; a later call only maps.
   */
  outcome(error?: unknown, message = "rpc ok"): ConnectError | undefined {
    if (error === undefined) {
      if (this.ended) return undefined;
      this.ended = true;
      const { logger } = this.options;
      if (logger.isLevelEnabled("debug"))
        logger.debug(
          {
            reqId: this.requestId,
            rpc: this.rpc,
            ms: Math.round(performance.now() - this.started),
          },
          message,
        );
      this.count("ok");
      return undefined;
    }
    if (this.failure !== undefined) return this.failure;
    this.ended = true;
    this.failure = this.failed(error);
    return this.failure;
  }

  /** The caller stopped reading a stream before its end (it went away): counted, not logged. */
  stopped(): void {
    this.count("canceled");
  }

  private count(status: string): void {
    const { observer } = this.options;
    const counted = this.request.counted;
    if (observer === undefined || counted === undefined || this.counted) return;
    this.counted = true;
    observer.call(this.rpc, counted.method, status, (performance.now() - this.started) / 1000);
  }

  private failed(error: unknown): ConnectError {
    const { logger, observer } = this.options;
    const connectError = toConnectError(error);
    const code = errorCodeOf(connectError);
    const fields = {
      reqId: this.requestId,
      rpc: this.rpc,
      ms: Math.round(performance.now() - this.started),
    };
    if (callerLeft(this.signal, code, error)) {
      logger.info({ ...fields, code: "cancelled" }, "client disconnected");
      this.count("canceled");
      return new ConnectError("the caller went away", Code.Canceled, undefined, undefined, error);
    }
    this.count(codeLabels.get(connectError.code) ?? "unknown");
    observer?.rejected(code, fields.rpc);
    if (code === "internal_error")
      logger.error({ ...fields, code, err: connectError.cause ?? error }, "rpc failed");
    else logger.info({ ...fields, code }, "rpc rejected");
    return connectError;
  }
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

const noTimeout = (): undefined => undefined;

/**
 * The HandlerContext a service method gets when the REST facade calls it directly: the call's
 * signal, headers and the values the guard admitted it with. A plain object: connect's
 * createHandlerContext links a new AbortController (and a deadline) to the caller's signal on
 * every call, which costs more than the rest of such a call together.
 */
export function handlerContext(
  method: DescMethod,
  call: GuardedCall,
  header: Headers,
  values: ContextValues,
): HandlerContext {
  return {
    method,
    service: method.parent,
    signal: call.signal,
    timeoutMs: noTimeout,
    requestMethod: "POST",
    requestHeader: header,
    responseHeader: new Headers(),
    responseTrailer: new Headers(),
    protocolName: "rest",
    values,
    url: `rest:///${method.parent.typeName}/${method.name}`,
  };
}
