import type { Hex } from "viem";
import type {
  EndpointHealth,
  EndpointSecret,
  HealthMonitor,
  HealthMonitorDeps,
  RegisteredEndpoint,
  VerificationOutcome,
} from "./health-types.js";
import { runVerification } from "./health-verification.js";
import { normalizeHex } from "./hex.js";
import { createPeriodic } from "./periodic.js";

/**
 * Liveness and verification of registered provider endpoints.
 *
 * A background loop probes every registered endpoint (`running`), on-demand probes refresh a
 * stale verdict when someone asks for an offer's health, and `verify` runs the full
 * conformance check (model listed, one-token completion, stream with usage, usage claims the
 * gateway's own count does not contradict) whose success
 * makes an offer eligible for chat until `verification_expires_at`.
 *
 * Verification is open to any API key, so it must not be a lever against the offer (DESIGN.md
 * section 8): runs of one offer are shared (concurrent callers in a process get one run's
 * result) and bounded (one run per `verifyMinIntervalSeconds` across every gateway sharing the
 * database, claimed on the endpoint's row; callers inside the bound get the last run's outcome
 * and when it ran). Only a wrong answer (`rejected`: model not listed, invalid completion, stream
 * without usage, a usage claim above the gateway's count) clears `verified_at`; a run that failed in transport (`unreachable`: timeout,
 * refused connection, 429, 5xx) leaves a standing verification in place, so neither a flood of
 * verifications nor a provider's passing overload knocks the offer out of routing.
 *
 * This module knows neither HTTP nor SQL: the prober and the store are ports, implemented by
 * `adapters/upstream/probe.ts` and `adapters/pg/endpoint-health.ts`.
 */

export function createHealthMonitor(deps: HealthMonitorDeps): HealthMonitor {
  const { store, open, prober, clock, logger } = deps;
  // One probe per endpoint at a time, whoever asks (the loop or an on-demand refresh).
  const inflight = new Map<Hex, Promise<boolean>>();
  const refreshing = new Map<Hex, Promise<EndpointHealth | undefined>>();
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

  const rounds = createPeriodic({
    run: async () => {
      // In a fleet of gateways sharing one database, an endpoint another process probed in the
      // last half interval is skipped.
      const minAgeSeconds = Math.floor(deps.intervalMs / 2000);
      const { probed, running } = await probeAll({ minAgeSeconds });
      if (probed > 0) logger.info({ probed, running }, "probed provider endpoints");
    },
    intervalMs: deps.intervalMs,
    onError: (err) =>
      logger.warn(
        { error: err instanceof Error ? err.message : String(err) },
        "probing provider endpoints failed",
      ),
    immediate: true,
  });

  // One verification run per offer at a time in this process; the store bounds the fleet.
  const verifying = new Map<Hex, Promise<VerificationOutcome>>();

  return {
    start() {
      // Aborted only by a stop(): a start() while running keeps the probes under way.
      if (stopping.signal.aborted) stopping = new AbortController();
      rounds.start();
    },
    async stop() {
      stopping.abort();
      await rounds.stop();
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
    verify(offerId, modelNames, ttlSeconds, subject) {
      const id = normalizeHex(offerId);
      // Keyed by offer alone: the names and TTL of one offer are the same for every caller.
      const shared = verifying.get(id);
      if (shared !== undefined) return shared;
      const task = runVerification(deps, id, modelNames, ttlSeconds, subject).finally(() =>
        verifying.delete(id),
      );
      verifying.set(id, task);
      return task;
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
