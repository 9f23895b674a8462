import type { Hex } from "viem";
import type { ReasoningPolicy } from "./chat/usage.js";
import { runVerification } from "./health-verification.js";
import { normalizeHex } from "./hex.js";
import type { OfferFeature } from "./offer-features.js";

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
  "usage_diverged",
] as const;
export type VerificationCheck = (typeof verificationChecks)[number];

/**
 * What the prober concluded. `message` is safe to show: it never contains the URL or token.
 * `transport` tells a failure to get an answer (timeout, refused or reset connection, HTTP 408,
 * 429 or 5xx) from a wrong answer; only the latter says the endpoint does not conform.
 */
export type EndpointVerification = ({ readonly ok: true } & VerifiedFeatures) | VerificationFailure;

/** What a passed verification proved of the optional features. */
interface VerifiedFeatures {
  /** Optional features proven (`provider.require_parameters`); absent: none. */
  readonly features?: readonly OfferFeature[] | undefined;
  /** Features whose check got no answer: their standing value is kept. */
  readonly unanswered?: readonly OfferFeature[] | undefined;
}

/** A failed verification: the check that failed, and whether it got no answer at all. */
interface VerificationFailure {
  readonly ok: false;
  readonly check: VerificationCheck;
  readonly message: string;
  readonly transport: boolean;
}

/** How a verification run ended: passed, answered wrongly, or could not get an answer. */
export type VerificationRunOutcome = "verified" | "rejected" | "unreachable";

/**
 * What a verification counts the probes' usage with: the offer's model (its token counter, by
 * repository and revision as the chain names them) and the offer's declared hidden reasoning.
 */
export interface VerificationSubject {
  readonly model: { readonly repository: string; readonly revision: string };
  readonly reasoning: ReasoningPolicy;
}

/** Talks to provider endpoints (the upstream adapter). Neither method throws. */
export interface EndpointProber {
  /**
   * Whether the endpoint answers `GET /v1/models` with a 2xx within the prober's timeout;
   * false at once when `signal` aborts (the monitor stops: shutdown does not wait for a probe).
   */
  probeLiveness(endpoint: EndpointSecret, signal?: AbortSignal): Promise<boolean>;
  /**
   * Runs the conformance checks in order and reports the first that fails; the probes' usage
   * claims are counted with `subject`'s token counter (without one, the byte bound).
   */
  verifyEndpoint(
    endpoint: EndpointSecret,
    modelNames: readonly string[],
    subject?: VerificationSubject,
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

/**
 * A run's outcome as stored: `verified` sets the verification (and `ranAt` = `verifiedAt`),
 * `rejected` clears it, `unreachable` leaves it as it stands.
 */
export type VerificationRecord =
  | ({
      readonly ok: true;
      readonly verifiedAt: number;
      readonly expiresAt: number;
    } & VerifiedFeatures)
  | (VerificationFailure & { readonly ranAt: number });

/** The last verification run of an endpoint, as stored. */
export interface LastVerificationRun {
  /** Unix seconds the run ended. */
  readonly ranAt: number;
  readonly outcome: VerificationRunOutcome;
  readonly check: VerificationCheck | undefined;
  readonly message: string | undefined;
}

/** Whether this caller may run a verification now, and what stands either way. */
export interface VerificationClaim {
  readonly claimed: boolean;
  /** Unix seconds of the claim that holds the bound: this one, or the last run's elsewhere. */
  readonly claimedAt: number;
  readonly last: LastVerificationRun | undefined;
  readonly verifiedAt: number | undefined;
  readonly verificationExpiresAt: number | undefined;
}

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
  /**
   * Claims a verification run of the endpoint sealed as `sealed` at `now`, unless a run was
   * claimed less than `minIntervalSeconds` ago (by any process sharing the store). Undefined
   * when no endpoint, or another one, is registered.
   */
  claimVerification(
    offerId: Hex,
    sealed: Buffer,
    now: number,
    minIntervalSeconds: number,
  ): Promise<VerificationClaim | undefined>;
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
  /**
   * The least time between two verification runs of one offer, fleet-wide
   * (VERIFY_MIN_INTERVAL_SECONDS); 0: runs are only shared, never refused.
   */
  readonly verifyMinIntervalSeconds: number;
  /** Unix seconds. */
  readonly clock: () => number;
  readonly logger: HealthLogger;
}

/**
 * What a verify call answers: a run's outcome, with when it ran and whether this call got a
 * stored outcome instead of a run (`replayed`, inside the bound). `verifiedAt` and `expiresAt`
 * are the verification standing after the run (undefined: none).
 */
export type VerificationOutcome = {
  readonly outcome: VerificationRunOutcome;
  /** Unix seconds the run ended. */
  readonly ranAt: number;
  readonly replayed: boolean;
  /** Unix seconds from which a new run may start. */
  readonly nextRunAt: number;
  readonly verifiedAt: number | undefined;
  readonly expiresAt: number | undefined;
} & (
  | { readonly ok: true }
  | { readonly ok: false; readonly check: VerificationCheck; readonly message: string }
);

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
   * success `verified_at` = now and `verification_expires_at` = now + `ttlSeconds`; on a wrong
   * answer both are cleared and the failed check is kept; on a transport failure both stay as
   * they are. Concurrent calls for one offer share one run; a call less than
   * `verifyMinIntervalSeconds` after the last run was claimed (by any gateway sharing the
   * store) gets that run's outcome (`replayed`), or `rate_limited` while the first run of the
   * endpoint is still under way elsewhere. `modelNames` are the names the provider may know
   * the offer's model by (public id, ModelID, aliases); `subject` what its usage claims are
   * counted with. A run that passes also clears a standing usage exclusion (the store's
   * `recordVerification`; docs/decisions/metering-and-tokens.md "Usage divergence"). Throws `offer_not_found` when
   * no endpoint is registered.
   */
  verify(
    offerId: Hex,
    modelNames: readonly string[],
    ttlSeconds: number,
    subject?: VerificationSubject,
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

  // One verification run per offer at a time in this process; the store bounds the fleet.
  const verifying = new Map<Hex, Promise<VerificationOutcome>>();

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
