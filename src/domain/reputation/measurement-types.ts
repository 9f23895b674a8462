import type { Hex } from "viem";

/**
 * What is measured of offers (measurements.ts) and how it is shared (measurement-sync.ts): the
 * measurements, the window each process shares, the usage exclusions, and the ports.
 */

/**
 * A histogram of positive values in geometric bins (8 per doubling, so a bin spans ~9 %), each
 * bin keeping its count and the sum of its values: the median is the mean of the values in the
 * bin that holds it, exact when they are alike. `[bin, count, sum]`, bins ascending.
 */
export type Histogram = readonly (readonly [bin: number, count: number, sum: number])[];

/** One process's window of one offer, as it is shared. */
export interface WindowSummary {
  /** Requests the provider answered completely. */
  readonly served: number;
  /** Requests the provider failed (see `OfferMeasurements.failed`). */
  readonly failed: number;
  /** Time to first token of served answers, milliseconds. */
  readonly latency: Histogram;
  /** Output tokens per second after the first token of served answers. */
  readonly throughput: Histogram;
  /** Answers that carried a provider usage claim (see `OfferMeasurements.claimed`). */
  readonly claimed: number;
  /** Of those, claims above the gateway's count plus tolerance. */
  readonly diverged: number;
  /**
   * The distinct payers (permit payer addresses, lower case) of the diverged answers, at most
   * {@link keptDivergedPayers} of them: divergence counts only across independent payers
   * (src/domain/reputation/divergence.ts). Shared, so processes merge them as a union.
   */
  readonly divergedPayers: readonly Hex[];
  /**
   * Unix seconds of the exclusion clearing the counts above follow (0: none): counts from
   * before an offer was verified again after an exclusion are not added to counts after it.
   */
  readonly divergenceSince: number;
}

/** Another process's window of an offer, as the database holds it. */
export interface SharedMeasurement extends WindowSummary {
  readonly offerId: Hex;
  readonly instanceId: string;
}

/** An offer's measurement over the window, every process's merged. */
export interface OfferMeasurement {
  /** Median time to first token, milliseconds (undefined: no served answer timed). */
  readonly latencyMs: number | undefined;
  /** Median output tokens per second (undefined: no answer long enough to time). */
  readonly throughput: number | undefined;
  readonly served: number;
  readonly failed: number;
  /** Served answers whose time to first token was measured. */
  readonly samples: number;
  /** Answers that carried a usage claim, since the offer's last exclusion was cleared. */
  readonly claimed: number;
  /** Of those, claims above the gateway's count plus tolerance. */
  readonly diverged: number;
  /**
   * The distinct payers of the diverged answers, every process's together (counted up to
   * {@link keptDivergedPayers}; absent: 0).
   */
  readonly divergedPayers?: number | undefined;
  /** Out of routing for diverging claims until a verification passes (from the database). */
  readonly excluded: boolean;
}

/**
 * An offer's exclusion for diverging usage claims, as the database holds it (one row per offer
 * ever excluded): standing while `clearedAt` is undefined.
 */
export interface UsageExclusion {
  readonly offerId: Hex;
  /** Unix seconds it left routing. */
  readonly excludedAt: number;
  /** Unix seconds a successful verification cleared it; undefined: it stands. */
  readonly clearedAt: number | undefined;
}

/**
 * Distinct payers of diverged answers kept per offer (per time bucket and per process's shared
 * window): more than any threshold needs, so a union of kept sets counts at least
 * min(this, the true number) and never more than the true number.
 */
export const keptDivergedPayers = 16;

/** An exclusion the window calls for (`OfferMeasurements.exclusionsDue`). */
export interface DueExclusion {
  readonly offerId: Hex;
  readonly claimed: number;
  readonly diverged: number;
  /** The distinct payers of the diverged answers (absent: not counted, as before issue 35). */
  readonly payers?: number | undefined;
  /** The clearing the counts follow (`WindowSummary.divergenceSince`). */
  readonly since: number;
}

/** The timing of one served answer. */
export interface AnswerTiming {
  /** From the provider call to the first token. */
  readonly latencyMs: number;
  readonly outputTokens: bigint;
  /** From the first token to the end of the answer. */
  readonly generationMs: number;
}

export interface OfferMeasurements {
  /** The window, seconds. */
  readonly windowSeconds: number;
  /** A request the provider answered completely; `timing` when its first token was seen. */
  served(offerId: Hex, timing?: AnswerTiming): void;
  /**
   * A request the provider failed: no answer (connection error, timeout, 5xx; also when the
   * request then failed over to another offer), an unreadable or invalid answer, or a stream
   * broken off by the provider. Never a client's cancel, a 4xx for the client's own input or a
   * 429, nor anything the gateway itself failed (the caller decides; call.ts).
   */
  failed(offerId: Hex): void;
  /**
   * A completed answer of the offer that carried a provider usage claim (call-state.ts, once per
   * answer, on the offer that served it: never another offer of a failover), whether the claim
   * diverged (`judgeUsage(...).diverged`, usage.ts), and who paid for the request (the permit's
   * `payer`): a diverged answer counts toward a flag or an exclusion only with diverged answers
   * of other payers (src/domain/reputation/divergence.ts). Without `payer`, a diverged answer counts in the
   * share but adds no payer.
   */
  claimed(offerId: Hex, diverged: boolean, payer?: Hex): void;
  /** The offer's measurement: this process's window merged with the other processes'. */
  get(offerId: Hex): OfferMeasurement | undefined;
  /** This process's own windows, for the database. */
  local(): Map<Hex, WindowSummary>;
  /** Replaces what the other processes measured (rows of this process are ignored). */
  absorb(rows: readonly SharedMeasurement[]): void;
  /**
   * Replaces the exclusions (every row the database holds). An exclusion cleared since the
   * last call restarts the offer's divergence counts: this process's are dropped, and the
   * others' rows count again once they follow the same clearing.
   */
  setExclusions(rows: readonly UsageExclusion[]): void;
  /** The offers whose merged window calls for an exclusion that does not stand yet. */
  exclusionsDue(): DueExclusion[];
  /**
   * The offers whose merged window would call for an exclusion but for too few independent
   * payers: the gateway's own probe should confirm it (a verification, whose counting step
   * fails `usage_diverged` for a provider that overclaims, which takes the offer out of routing).
   */
  confirmationsDue(): Hex[];
}

/** What the catalog shows besides the measurements: counted from records, fleet-wide. */
export interface OfferRecordCounts {
  /** Verification runs in the window that passed. */
  readonly verificationsPassed: number;
  /** Verification runs in the window whose answer was wrong (not those that got none). */
  readonly verificationsRejected: number;
  /** Requests flagged in the window (the provider reported more usage than it could have). */
  readonly flags: number;
}

/** The database side of the sharing (adapters/pg/offer-measurements.ts). */
export interface MeasurementStore {
  /** Upserts this process's windows (and deletes its rows of offers no longer in them). */
  write(instanceId: string, rows: ReadonlyMap<Hex, WindowSummary>): Promise<void>;
  /** Every process's windows written in the last `maxAgeSeconds` (database clock). */
  read(maxAgeSeconds: number): Promise<SharedMeasurement[]>;
  /** Verification runs and flags per offer since `since` (Unix seconds). */
  readCounts(since: number): Promise<Map<Hex, OfferRecordCounts>>;
  /** Every offer's usage exclusion, standing or cleared (migration 024). */
  readExclusions(): Promise<UsageExclusion[]>;
  /**
   * Excludes the offer at `at` (Unix seconds) unless an exclusion stands, or was cleared after
   * `due.since` (the counts that called for it are from before that clearing). Returns whether
   * it was written.
   */
  exclude(due: DueExclusion, at: number): Promise<boolean>;
}

export interface MeasurementSync {
  /** Writes this process's windows, reads the others' and the record counts. */
  runOnce(): Promise<void>;
  start(): void;
  stop(): Promise<void>;
  /** Reads the usage exclusions now (before serving: a round only comes after `intervalMs`). */
  readExclusions(): Promise<void>;
  /** The record counts of an offer as last read (undefined: none in the window). */
  counts(offerId: Hex): OfferRecordCounts | undefined;
}
