import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import { normalizeHex } from "./hex.js";

/**
 * Liveness and verification of registered provider endpoints.
 *
 * A background loop probes every registered endpoint (`running`), on-demand probes refresh a
 * stale verdict when someone asks for an offer's health, and `verify` runs the full
 * conformance check (model listed, one-token completion, stream with usage) whose success
 * makes an offer eligible for chat until `verification_expires_at`. A failed verification
 * clears `verified_at`, so the offer stays ineligible until it passes again.
 *
 * This module knows neither HTTP nor SQL: the prober and the store are ports, implemented by
 * `adapters/upstream/probe.ts` and `adapters/pg/endpoint-health.ts`.
 */

/** A provider endpoint as opened from its sealed storage. Both fields are secrets. */
export interface EndpointSecret {
  readonly url: string;
  readonly token?: string | undefined;
}

/** The conformance check that failed; also the error code a failed verification reports. */
export const verificationChecks = [
  "endpoint_unreachable",
  "model_not_listed",
  "completion_failed",
  "stream_failed",
  "usage_missing",
] as const;
export type VerificationCheck = (typeof verificationChecks)[number];

/** What the prober concluded. `message` is safe to show: it never contains the URL or token. */
export type EndpointVerification =
  | { readonly ok: true }
  | { readonly ok: false; readonly check: VerificationCheck; readonly message: string };

/** Talks to provider endpoints (the upstream adapter). Neither method throws. */
export interface EndpointProber {
  /**
   * Whether the endpoint answers `GET /v1/models` with a 2xx within the prober's timeout;
   * false at once when `signal` aborts (the monitor stops: shutdown does not wait for a probe).
   */
  probeLiveness(endpoint: EndpointSecret, signal?: AbortSignal): Promise<boolean>;
  /** Runs the conformance checks in order and reports the first that fails. */
  verifyEndpoint(
    endpoint: EndpointSecret,
    modelNames: readonly string[],
  ): Promise<EndpointVerification>;
}

/** A registered endpoint, still sealed. */
export interface RegisteredEndpoint {
  readonly offerId: Hex;
  readonly sealed: Buffer;
  /** Unix seconds of the last probe; undefined when never probed. */
  readonly checkedAt: number | undefined;
}

/** The gateway's view of one registered endpoint (all times in Unix seconds). */
export interface EndpointHealth {
  readonly offerId: Hex;
  readonly registeredAt: number;
  /** The last probe's verdict; undefined when never probed. */
  readonly running: boolean | undefined;
  readonly checkedAt: number | undefined;
  /** Set by a successful verification, cleared by a failed one or a re-registration. */
  readonly verifiedAt: number | undefined;
  readonly verificationExpiresAt: number | undefined;
  /** The check that failed last; undefined after a success. */
  readonly verificationError: VerificationCheck | undefined;
}

export type VerificationRecord =
  | { readonly ok: true; readonly verifiedAt: number; readonly expiresAt: number }
  | { readonly ok: false; readonly check: VerificationCheck };

/** Persistence of endpoint health (PostgreSQL in production). */
export interface EndpointHealthStore {
  listRegisteredEndpoints(): Promise<RegisteredEndpoint[]>;
  getRegisteredEndpoint(offerId: Hex): Promise<RegisteredEndpoint | undefined>;
  getEndpointHealth(offerId: Hex): Promise<EndpointHealth | undefined>;
  /** Records a probe verdict unless a later one is already recorded. */
  recordProbe(offerId: Hex, running: boolean, at: number): Promise<void>;
  /**
   * Records a verification outcome for the endpoint that was sealed as `sealed` (a
   * re-registration in the meantime makes this a no-op). Returns whether it was recorded.
   */
  recordVerification(offerId: Hex, result: VerificationRecord, sealed: Buffer): Promise<boolean>;
}

/** The minimal logger the monitor needs; a pino logger fits. Never given a URL or token. */
export interface HealthLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

export interface HealthMonitorDeps {
  readonly store: EndpointHealthStore;
  /** Opens a sealed endpoint (AES-GCM in production). May throw on a damaged or foreign seal. */
  readonly open: (offerId: Hex, sealed: Buffer) => EndpointSecret;
  readonly prober: EndpointProber;
  /** Time between two rounds of the background prober. */
  readonly intervalMs: number;
  /** Probes running at once. */
  readonly concurrency: number;
  /** A verdict older than this is refreshed by `probeIfStale`. */
  readonly staleMs: number;
  /** Unix seconds. */
  readonly clock: () => number;
  readonly logger: HealthLogger;
}

export type VerificationOutcome =
  | { readonly ok: true; readonly verifiedAt: number; readonly expiresAt: number }
  | { readonly ok: false; readonly check: VerificationCheck; readonly message: string };

export interface HealthMonitor {
  /** Starts the background loop (a first round at once, then one every `intervalMs`). */
  start(): void;
  /** Stops the loop and waits for the round in progress. */
  stop(): Promise<void>;
  /**
   * Probes every registered endpoint, `concurrency` at a time, skipping those probed less
   * than `minAgeSeconds` ago (default 0: probe all). Resolves when all are recorded.
   */
  probeAll(opts?: { minAgeSeconds?: number }): Promise<{ probed: number; running: number }>;
  /**
   * The endpoint's health, probed first when the last verdict is missing or older than
   * `staleMs`. Undefined when the offer has no registered endpoint.
   */
  probeIfStale(offerId: Hex): Promise<EndpointHealth | undefined>;
  /**
   * Runs the conformance checks against the offer's endpoint and records the outcome: on
   * success `verified_at` = now and `verification_expires_at` = now + `ttlSeconds`; on failure
   * both are cleared and the failed check is kept. `modelNames` are the names the provider may
   * know the offer's model by (public id, ModelID, aliases). Throws `offer_not_found` when no
   * endpoint is registered.
   */
  verify(
    offerId: Hex,
    modelNames: readonly string[],
    ttlSeconds: number,
  ): Promise<VerificationOutcome>;
}

export function createHealthMonitor(deps: HealthMonitorDeps): HealthMonitor {
  const { store, open, prober, clock, logger } = deps;
  // One probe per endpoint at a time, whoever asks (the loop or an on-demand refresh).
  const inflight = new Map<Hex, Promise<boolean>>();
  const refreshing = new Map<Hex, Promise<EndpointHealth | undefined>>();
  let timer: NodeJS.Timeout | undefined;
  let round: Promise<unknown> | undefined;
  let started = false;
  // Aborted by stop(): probes under way end at once and record nothing.
  let stopping = new AbortController();

  const openSafely = (endpoint: RegisteredEndpoint): EndpointSecret | undefined => {
    try {
      return open(endpoint.offerId, endpoint.sealed);
    } catch (err) {
      // The error of a failed open says nothing about the secret, but keep only its name.
      logger.warn(
        { offerId: endpoint.offerId, error: err instanceof Error ? err.name : "Error" },
        "cannot open the sealed provider endpoint",
      );
      return undefined;
    }
  };

  const probe = (endpoint: RegisteredEndpoint): Promise<boolean> => {
    const running = inflight.get(endpoint.offerId);
    if (running !== undefined) return running;
    const { signal } = stopping;
    const task = (async () => {
      const secret = openSafely(endpoint);
      let up = false;
      if (secret !== undefined) up = await prober.probeLiveness(secret, signal).catch(() => false);
      // A probe cut by stop() says nothing about the endpoint.
      if (signal.aborted) return false;
      await store.recordProbe(endpoint.offerId, up, clock());
      return up;
    })().finally(() => inflight.delete(endpoint.offerId));
    inflight.set(endpoint.offerId, task);
    return task;
  };

  const probeAll: HealthMonitor["probeAll"] = async (opts = {}) => {
    const minAge = opts.minAgeSeconds ?? 0;
    const now = clock();
    const endpoints = (await store.listRegisteredEndpoints()).filter(
      (e) => minAge <= 0 || e.checkedAt === undefined || now - e.checkedAt >= minAge,
    );
    let running = 0;
    await forEachLimited(endpoints, deps.concurrency, async (endpoint) => {
      try {
        if (await probe(endpoint)) running++;
      } catch (err) {
        logger.warn(
          { offerId: endpoint.offerId, error: err instanceof Error ? err.message : String(err) },
          "recording a probe failed",
        );
      }
    });
    return { probed: endpoints.length, running };
  };

  const loop = (): void => {
    // In a fleet of gateways sharing one database, an endpoint another process probed in the
    // last half interval is skipped.
    const minAgeSeconds = Math.floor(deps.intervalMs / 2000);
    round = probeAll({ minAgeSeconds })
      .then(({ probed, running }) => {
        if (probed > 0) logger.info({ probed, running }, "probed provider endpoints");
      })
      .catch((err: unknown) => {
        logger.warn(
          { error: err instanceof Error ? err.message : String(err) },
          "probing provider endpoints failed",
        );
      })
      .finally(() => {
        if (started) {
          timer = setTimeout(loop, deps.intervalMs);
          timer.unref();
        }
      });
  };

  return {
    start() {
      if (started) return;
      started = true;
      if (stopping.signal.aborted) stopping = new AbortController();
      loop();
    },
    async stop() {
      started = false;
      stopping.abort();
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
      await round;
      await Promise.allSettled(inflight.values());
    },
    probeAll,
    probeIfStale(offerId) {
      const id = normalizeHex(offerId);
      // Concurrent callers share the whole read-probe-read: sharing only the probe left a
      // window where a caller whose read predated another's recorded probe probed again.
      const shared = refreshing.get(id);
      if (shared !== undefined) return shared;
      const task = (async () => {
        const endpoint = await store.getRegisteredEndpoint(id);
        if (endpoint === undefined) return undefined;
        const staleSeconds = deps.staleMs / 1000;
        if (endpoint.checkedAt === undefined || clock() - endpoint.checkedAt >= staleSeconds) {
          await probe(endpoint);
        }
        return store.getEndpointHealth(id);
      })().finally(() => refreshing.delete(id));
      refreshing.set(id, task);
      return task;
    },
    async verify(offerId, modelNames, ttlSeconds) {
      const id = normalizeHex(offerId);
      const endpoint = await store.getRegisteredEndpoint(id);
      if (endpoint === undefined) {
        throw new GatewayError("offer_not_found", "the offer has no registered endpoint");
      }
      let secret: EndpointSecret;
      try {
        secret = open(endpoint.offerId, endpoint.sealed);
      } catch (err) {
        throw new GatewayError("internal_error", "the registered endpoint cannot be opened", {
          cause: err instanceof Error ? new Error(err.name) : undefined,
        });
      }
      const result = await prober.verifyEndpoint(secret, modelNames);
      const now = clock();
      const record: VerificationRecord = result.ok
        ? { ok: true, verifiedAt: now, expiresAt: now + ttlSeconds }
        : { ok: false, check: result.check };
      if (!(await store.recordVerification(id, record, endpoint.sealed))) {
        throw new GatewayError(
          "upstream_unavailable",
          "the endpoint was registered again during verification; verify again",
        );
      }
      // Anything but an unreachable endpoint answered, so it is running.
      const running = result.ok || result.check !== "endpoint_unreachable";
      await store.recordProbe(id, running, now);
      logger.info(
        { offerId: id, ok: result.ok, check: result.ok ? undefined : result.check },
        "verified provider endpoint",
      );
      return result.ok ? { ok: true, verifiedAt: now, expiresAt: now + ttlSeconds } : result;
    },
  };
}

/** Runs `fn` over `items`, at most `limit` at a time. */
async function forEachLimited<T>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const item = items[next++] as T;
      await fn(item);
    }
  };
  const workers = Math.max(1, Math.min(Math.floor(limit), items.length));
  await Promise.all(Array.from({ length: workers }, worker));
}
