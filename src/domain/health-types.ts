/** The ports and records of endpoint health (health.ts), apart so that health-verification.ts reads them. */
import type { Hex } from "viem";
import type { ReasoningPolicy } from "./chat/usage.js";
import type { OfferFeature } from "./offer-features.js";

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
