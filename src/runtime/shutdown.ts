import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import { GatewayError } from "../domain/errors.js";
import type { Listener } from "./listen.js";
import type { NodeRequest } from "../rest/body.js";
import { toHttpError } from "../rest/errors.js";
import type { NodeResponse } from "../rest/body.js";
import { errorBodyFor } from "../rest/routes/index.js";
import { withTimeout } from "./readiness.js";

/**
 * Shutdown: after SHUTDOWN_GRACE_MS the requests still in flight are cut (a stream ends with
 * its `shutting_down` event); connections still open this much later are destroyed.
 */
export const cutMs = 500;
/** Shutdown: the longest wait for the closes of the requests in flight to be written. */
const drainMs = 2000;

/** What the shutdown sequence stops, in its order. */
export interface ShutdownParts {
  /** Stops what starts work of its own (probes, indexing, housekeeping, settlement...). */
  readonly stopBackground: () => Promise<unknown>;
  readonly listener: Listener;
  readonly metricsListener: Listener | undefined;
  /** Resolves when every request's close is written. */
  readonly drainRequests: () => Promise<void>;
  /** After the closes: leases, settlement, upstream connections, the database. */
  readonly release: readonly (readonly [string, () => Promise<unknown>])[];
}

/**
 * The process's shutdown state: `draining` first (GET /ready answers 503 shutting_down, new
 * requests are refused), `cut` when the grace is over (what is still in flight ends with
 * shutting_down).
 */
export function createShutdown(options: { readonly graceMs: number; readonly logger: Logger }) {
  let draining = false;
  const cut = new AbortController();
  // Every request in flight listens on `cut.signal` (one listener each, removed when it ends):
  // thousands at once is the design, not a leak, so Node's default of 10 would only print
  // MaxListenersExceededWarning under load.
  setMaxListeners(0, cut.signal);
  const { logger, graceMs } = options;
  let closing: Promise<void> | undefined;

  return {
    draining: (): boolean => draining,
    /** Aborted when the grace is over: requests still in flight are cut. */
    signal: cut.signal,
    /**
     * While draining, a request that still reaches us (on a kept-alive connection) is refused,
     * except GET /ready, which says why.
     */
    guard(
      handler: (req: NodeRequest, res: NodeResponse) => void,
    ): (req: NodeRequest, res: NodeResponse) => void {
      return (req, res) => {
        if (!draining || isReadyTarget(req.url)) handler(req, res);
        else refuseShuttingDown(req, res);
      };
    },
    /** Runs the shutdown once (later calls share it). */
    close(parts: ShutdownParts): Promise<void> {
      closing ??= (async () => {
        const began = performance.now();
        const step = (name: string) =>
          logger.debug({ step: name, ms: Math.round(performance.now() - began) }, "shutdown");
        // First, before anything stops: readiness goes 503 and new requests are refused.
        draining = true;
        // Then nothing new starts: no probe, index pass, housekeeping round or settlement.
        const background = parts.stopBackground();
        // The listener stops accepting at once; what is in flight has the grace to finish.
        const closed = parts.listener.close(graceMs + cutMs);
        let graceTimer: NodeJS.Timeout | undefined;
        const drained = await Promise.race([
          closed.then(() => true),
          new Promise<false>((resolve) => (graceTimer = setTimeout(resolve, graceMs, false))),
        ]);
        clearTimeout(graceTimer);
        if (!drained) {
          logger.warn({ grace_ms: graceMs }, "shutdown grace over: cutting requests in flight");
          cut.abort(new GatewayError("shutting_down", "the gateway is shutting down"));
        }
        await closed;
        step("listener closed");
        await parts.metricsListener?.close(0);
        await background;
        step("background tasks stopped");
        // Every request's close is written (those cut above included) before the leases go back.
        try {
          await withTimeout(parts.drainRequests(), drainMs);
        } catch {
          logger.error({ ms: drainMs }, "request closes still unwritten at shutdown");
        }
        for (const [name, release] of parts.release) {
          await release();
          step(name);
        }
      })();
      return closing;
    },
  };
}

function isReadyTarget(url: string | undefined): boolean {
  return url === "/ready" || url?.startsWith("/ready?") === true;
}

/** 503 shutting_down for a request that arrives while the gateway drains; the connection closes. */
function refuseShuttingDown(req: NodeRequest, res: NodeResponse): void {
  req.resume();
  const { status, body } = toHttpError(
    new GatewayError("shutting_down", "the gateway is shutting down; retry on another instance"),
  );
  const payload = JSON.stringify(errorBodyFor(req.url, body));
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
  };
  if (req.httpVersionMajor === 1) headers.connection = "close";
  res.writeHead(status, headers);
  res.end(payload);
}
