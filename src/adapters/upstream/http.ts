import { isIP } from "node:net";
import { Agent, buildConnector } from "undici";
import type { UpstreamFlow } from "../../domain/chat/ports.js";
import { GatewayError } from "../../domain/errors.js";
import {
  canonicalEndpointUrl,
  resolveHost,
  sanitizedCause,
  type LookupAll,
} from "./endpoint-guard.js";

/**
 * The gateway's only way to talk to provider endpoints: an HTTP/1.1 client (undici) whose
 * connections are pinned to addresses checked by the endpoint guard.
 *
 * Every new connection resolves the endpoint's host, refuses it when any address is not public
 * (`endpoint_not_allowed`, unless `allowPrivate`), and connects to the checked address itself,
 * with the original host name kept for the `Host` header, TLS SNI and certificate checks. So a
 * DNS answer that changes after registration, or between check and connect, cannot send the
 * gateway somewhere else. Redirects are never followed: a 3xx is returned like any status.
 * Idle connections are kept alive and reused per origin.
 *
 * Errors never carry the endpoint URL, host, address or token (the endpoint is the provider's
 * secret): network failures become `upstream_unavailable` with a sanitised cause that keeps
 * only the error code (ECONNREFUSED, UND_ERR_CONNECT_TIMEOUT, ...).
 */

/** A registered provider endpoint, as opened from its sealed storage. */
export interface UpstreamEndpoint {
  /** Canonical endpoint URL (the server root: `/v1/...` paths are appended to it). */
  readonly url: string;
  /** Bearer token the gateway presents upstream, if the provider set one. */
  readonly token?: string | undefined;
}

export interface UpstreamRequestInit {
  readonly method: string;
  /**
   * Extra request headers; only those named in {@link upstreamRequestHeaders} are sent (the
   * endpoint's token is the only credential ever sent upstream: a client's gateway API key,
   * cookies or permit must never leak there).
   */
  readonly headers?: Readonly<Record<string, string>> | undefined;
  readonly body?: string | Uint8Array | undefined;
  /**
   * Aborts the request and, after the headers, the body (the connection is closed, so the
   * provider sees the cancellation). The rejection or body error is then `signal.reason`.
   */
  readonly signal?: AbortSignal | undefined;
  /** Deadline for resolving, connecting and receiving the response headers. Default 30 s. */
  readonly timeoutMs?: number | undefined;
  /** Longest silence allowed between two body chunks. Default 5 min. */
  readonly idleTimeoutMs?: number | undefined;
}

export interface UpstreamResponse {
  readonly status: number;
  /**
   * Response headers, names in lower case: only those named in {@link upstreamResponseHeaders}
   * (a provider's cookies, framing or `x-gateway-*` headers are never exposed).
   */
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  /**
   * The body as it arrives. Iterate it once, or call `text`/`json`/`dump`: a body left
   * unread holds its connection. Breaking out of the iteration stops reading: up to 64 KiB
   * of the rest is then read and dropped in the background so the connection can be reused, and
   * a longer rest closes it (an abort through `signal` closes it at once). Errors
   * while reading are `upstream_error` (or the caller's abort reason).
   */
  readonly body: AsyncIterable<Uint8Array>;
  /**
   * The body pushed to `into` chunk by chunk as it arrives, instead of iterated (no promise or
   * iterator result per chunk): use one of `body` and `flow`, once. `into` returning false pauses
   * the body until {@link UpstreamFlow.resume}; `into` throwing stops it with that error. Stopping
   * early ({@link UpstreamFlow.stop}) drops the rest as breaking out of `body` does.
   */
  flow(into: (chunk: Uint8Array) => boolean): UpstreamFlow;
  /** Reads the whole body as UTF-8; `upstream_error` when it exceeds `maxBytes` (default 8 MiB). */
  text(maxBytes?: number): Promise<string>;
  /** `text()` parsed as JSON; `upstream_error` when it does not parse. */
  json(maxBytes?: number): Promise<unknown>;
  /** Discards the body so the connection can be reused (or closes it if the body is large). */
  dump(): Promise<void>;
}

export interface UpstreamClient {
  /**
   * Sends one request to `path` under the endpoint URL: endpoint `https://h/base` and path
   * `/v1/models` give `https://h/base/v1/models` (an endpoint query string is kept).
   * Resolves when the response headers arrive, whatever the status (3xx included).
   * Rejects with `endpoint_not_allowed`, `upstream_unavailable` (DNS, connect, timeout,
   * reset before the headers), `invalid_request` (the stored URL is not a valid endpoint),
   * or the caller's `signal.reason`.
   */
  request(
    endpoint: UpstreamEndpoint,
    path: string,
    init: UpstreamRequestInit,
  ): Promise<UpstreamResponse>;
  /** Closes idle connections and waits for the running requests. */
  close(): Promise<void>;
}

export interface UpstreamClientOptions {
  /** Let endpoints on loopback and private networks through: development and tests only. */
  readonly allowPrivate: boolean;
  /** TCP (and TLS) connect timeout. Default 10 s. */
  readonly connectTimeoutMs?: number | undefined;
  /** Replaces the system resolver (tests). */
  readonly lookup?: LookupAll | undefined;
  /** Trusted CA certificates (PEM), replacing the system roots: a private PKI, or tests. */
  readonly ca?: string | Buffer | readonly (string | Buffer)[] | undefined;
}

/**
 * The request headers a caller may send to a provider, besides the `authorization` the
 * gateway makes from the endpoint's token: the body's media type and what is accepted back.
 * Everything else is dropped, so nothing a client sent the gateway (its API key, cookies,
 * `x-gateway-permit`, forwarding headers) can reach a provider even if a caller passed it on.
 */
export const upstreamRequestHeaders: ReadonlySet<string> = new Set(["content-type", "accept"]);

/**
 * The provider response headers the gateway reads: the media type (probes check it),
 * `retry-after`, and `location` (a redirect is reported, never followed). Nothing else a provider sends is exposed; the chat answer's headers are the
 * gateway's own (src/rest/chat.ts), so no provider header reaches a client at all.
 */
export const upstreamResponseHeaders: ReadonlySet<string> = new Set([
  "content-type",
  "retry-after",
  "location",
]);

/** The headers of `headers` whose (lower-cased) names are in `allowed`. */
export function allowedHeaders<T>(
  headers: Readonly<Record<string, T>>,
  allowed: ReadonlySet<string>,
): Record<string, T> {
  const out: Record<string, T> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    if (allowed.has(lower)) out[lower] = value;
  }
  return out;
}

const defaultTimeoutMs = 30_000;
const defaultIdleTimeoutMs = 300_000;
const defaultMaxBytes = 8 * 1024 * 1024;

export function createUpstreamClient(opts: UpstreamClientOptions): UpstreamClient {
  const connect = buildConnector({
    timeout: opts.connectTimeoutMs ?? 10_000,
    ...(opts.ca === undefined ? {} : { ca: opts.ca as string | Buffer | (string | Buffer)[] }),
  });
  const agent = new Agent({
    connect(connectOpts, callback) {
      // undici hands over the URL's host (IPv6 without brackets); connect to the checked
      // address instead, keeping the name for SNI (undici derives the `Host` header from
      // the origin, not from the socket).
      resolveHost(connectOpts.hostname, { allowPrivate: opts.allowPrivate, lookup: opts.lookup })
        .then(({ address }) => {
          const name = connectOpts.hostname;
          connect(
            {
              ...connectOpts,
              hostname: address,
              servername: connectOpts.servername || (isIP(name) === 0 ? name : undefined),
            },
            callback,
          );
        })
        .catch((err: unknown) => callback(asError(err), null));
    },
  });

  const targets = new Map<string, { origin: string; path: string }>();
  return {
    async request(endpoint, path, init) {
      const target = targetOf(endpoint.url, path);
      const headers = allowedHeaders(init.headers ?? {}, upstreamRequestHeaders);
      if (endpoint.token !== undefined && endpoint.token !== "") {
        headers.authorization = `Bearer ${endpoint.token}`;
      }

      const timeoutMs = init.timeoutMs ?? defaultTimeoutMs;
      const deadline = new AbortController();
      const timer = setTimeout(
        () =>
          deadline.abort(
            new GatewayError(
              "upstream_unavailable",
              `upstream did not answer within ${timeoutMs} ms`,
            ),
          ),
        timeoutMs,
      );
      // The caller's signal feeds the deadline's controller (AbortSignal.any costs more, per
      // request, for the same effect).
      const caller = init.signal;
      if (caller !== undefined) {
        if (caller.aborted) deadline.abort(caller.reason);
        else caller.addEventListener("abort", () => deadline.abort(caller.reason), { once: true });
      }
      const signal = deadline.signal;

      let data: Awaited<ReturnType<Agent["request"]>>;
      try {
        data = await agent.request({
          origin: target.origin,
          path: target.path,
          method: init.method,
          headers,
          body: init.body,
          signal,
          // The deadline above covers the headers; undici's own would only start after connect.
          headersTimeout: 0,
          bodyTimeout: init.idleTimeoutMs ?? defaultIdleTimeoutMs,
        });
      } catch (err) {
        throw upstreamFailure(err, signal, "upstream_unavailable", "upstream request failed");
      } finally {
        clearTimeout(timer);
      }

      return responseOf(data, signal);
    },
    close: () => agent.close(),
  };

  /**
   * {@link endpointTarget}, remembered per endpoint URL and path: two URL parses a request
   * otherwise. Bounded (emptied when full); the endpoint guard still checks every connection.
   */
  function targetOf(endpointUrl: string, path: string): { origin: string; path: string } {
    const key = `${endpointUrl}\n${path}`;
    let target = targets.get(key);
    if (target === undefined) {
      const url = endpointTarget(endpointUrl, path);
      target = { origin: url.origin, path: url.pathname + url.search };
      if (targets.size >= maxTargets) targets.clear();
      targets.set(key, target);
    }
    return target;
  }
}

/**
 * The response handed to the caller: the body read once, as it arrives ({@link
 * UpstreamResponse.body}), whole, or pushed ({@link PushedBody}); errors while reading are
 * `upstream_error` or the caller's abort reason.
 */
function responseOf(data: Dispatched, signal: AbortSignal): UpstreamResponse {
  const raw = data.body;
  const body = (async function* () {
    let read = 0;
    let ended = false;
    try {
      // Not destroyed when the reader stops early: a stream's reader stops at `[DONE]`,
      // usually with only the body's end still to come, and destroying the body then costs
      // an AbortError (a stack trace) per request and may cost the connection.
      for await (const chunk of raw.iterator({ destroyOnReturn: false })) {
        read += (chunk as Uint8Array).byteLength;
        yield chunk as Uint8Array;
      }
      ended = true;
    } catch (err) {
      ended = true;
      throw upstreamFailure(err, signal, "upstream_error", "upstream response failed");
    } finally {
      // What is left is read in the background and dropped, so the connection can be
      // reused; a body with more than `drainBytes` left is cut (and its connection closed).
      if (!ended) raw.dump({ limit: read + drainBytes }).catch(() => {});
    }
  })();
  const text = async (maxBytes = defaultMaxBytes): Promise<string> => {
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of body) {
      size += chunk.byteLength;
      if (size > maxBytes) {
        raw.destroy();
        throw new GatewayError("upstream_error", `upstream response exceeds ${maxBytes} bytes`);
      }
      chunks.push(chunk);
    }
    return Buffer.concat(chunks).toString("utf8");
  };
  return {
    status: data.statusCode,
    headers: allowedHeaders(data.headers, upstreamResponseHeaders),
    body,
    text,
    async json(maxBytes) {
      const content = await text(maxBytes);
      try {
        return JSON.parse(content) as unknown;
      } catch {
        throw new GatewayError("upstream_error", "upstream response is not valid JSON");
      }
    },
    async dump() {
      await raw.dump().catch(() => {});
    },
    flow: (into) => new PushedBody(raw, signal, into),
  };
}

/**
 * A body pushed to its reader from the stream's own `data` events: the per-chunk path of a
 * streamed answer allocates nothing of its own (see {@link UpstreamResponse.flow}).
 */
class PushedBody implements UpstreamFlow {
  readonly done: Promise<void>;
  private settle!: (error?: unknown) => void;
  private read = 0;
  private over = false;

  constructor(
    private readonly raw: Dispatched["body"],
    private readonly signal: AbortSignal,
    private readonly into: (chunk: Uint8Array) => boolean,
  ) {
    this.done = new Promise<void>((resolve, reject) => {
      this.settle = (error) => (error === undefined ? resolve() : reject(error));
    });
    this.onData = this.onData.bind(this);
    this.onEnd = this.onEnd.bind(this);
    this.onError = this.onError.bind(this);
    this.onClose = this.onClose.bind(this);
    raw.on("data", this.onData);
    raw.on("end", this.onEnd);
    raw.on("error", this.onError);
    raw.on("close", this.onClose);
  }

  private onData(chunk: Uint8Array): void {
    if (this.over) return;
    this.read += chunk.byteLength;
    let more: boolean;
    try {
      more = this.into(chunk);
    } catch (error) {
      this.fail(error);
      return;
    }
    if (!more && !this.over) this.raw.pause();
  }

  private onEnd(): void {
    this.finish(false, undefined);
  }

  private onError(error: unknown): void {
    this.finish(
      false,
      upstreamFailure(error, this.signal, "upstream_error", "upstream response failed"),
    );
  }

  private onClose(): void {
    // Closed without its end or an error: destroyed under it (an abort).
    if (this.over) return;
    this.finish(
      false,
      this.signal.aborted
        ? this.signal.reason
        : new GatewayError("upstream_error", "upstream response ended early"),
    );
  }

  resume(): void {
    if (!this.over) this.raw.resume();
  }

  stop(): void {
    this.finish(true, undefined);
  }

  fail(error: unknown): void {
    this.finish(true, error);
  }

  /** Ends the flow once; a reader that stopped early leaves the rest to be dropped. */
  private finish(early: boolean, error: unknown): void {
    if (this.over) return;
    this.over = true;
    const raw = this.raw;
    raw.off("data", this.onData);
    raw.off("end", this.onEnd);
    raw.off("error", this.onError);
    raw.off("close", this.onClose);
    raw.on("error", ignore); // a later error of the dropped rest has no reader to reach
    // What is left is read in the background and dropped, so the connection can be reused; a
    // body with more than `drainBytes` left is cut (and its connection closed).
    if (early) raw.dump({ limit: this.read + drainBytes }).catch(() => {});
    this.settle(error === undefined ? undefined : error);
  }
}

function ignore(): void {}

/** What undici's `request` resolves to. */
type Dispatched = Awaited<ReturnType<Agent["request"]>>;

/** Endpoint URL and path -> the origin and path a request goes to (see `targetOf`). */
const maxTargets = 4096;

/**
 * How much of a body's rest is read (and dropped) after its reader stopped early, so that its
 * connection can be reused: a stream's `[DONE]` usually leaves only the chunked encoding's end.
 */
const drainBytes = 64 * 1024;

/**
 * The URL of `path` under an endpoint: the endpoint's path, then `path`, then the endpoint's
 * query merged with the path's. The endpoint URL is checked again here, so a row that was
 * written without going through registration cannot smuggle in user info or a new scheme.
 */
export function endpointTarget(endpointUrl: string, path: string): URL {
  if (!path.startsWith("/")) throw new Error("upstream path must start with '/'");
  const url = new URL(canonicalEndpointUrl(endpointUrl));
  const queryAt = path.indexOf("?");
  const pathname = queryAt === -1 ? path : path.slice(0, queryAt);
  const query = queryAt === -1 ? "" : path.slice(queryAt + 1);
  url.pathname = (url.pathname === "/" ? "" : url.pathname) + pathname;
  if (query !== "") url.search = url.search === "" ? query : `${url.search.slice(1)}&${query}`;
  return url;
}

function upstreamFailure(
  err: unknown,
  signal: AbortSignal,
  code: "upstream_unavailable" | "upstream_error",
  message: string,
): unknown {
  // The caller's own abort (client gone, request cancelled) and our deadline pass through.
  if (signal.aborted && err === signal.reason) return err;
  if (signal.aborted) return signal.reason;
  if (err instanceof GatewayError) return err;
  return new GatewayError(code, message, { cause: sanitizedCause(err) });
}

function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
