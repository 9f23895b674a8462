import type { Hex } from "viem";
import { isExclusionDue } from "../divergence.js";

/**
 * What the gateway measured of each offer's requests over a sliding window (the offer
 * reputation, src/domain/reputation.ts, and the keys `provider.sort` orders by, DESIGN.md
 * section 9): how many requests the provider served and how many it failed, and the time to
 * first token (latency) and output tokens per second (throughput) of the served ones, as
 * histograms whose medians routing and the catalog read. One source for both, so the latency
 * the catalog shows is the latency routing sorts by. Also how many of its answers carried a
 * usage claim and how many of those claims diverged from the gateway's count (the usage
 * divergence, src/domain/divergence.ts), and whether the offer stands excluded for it.
 *
 * Kept in memory per process in time buckets (nothing is written per request); shared across
 * the processes of one database on an interval (`createMeasurementSync`): each process writes
 * its own window's summary and reads the others', which are merged with its own.
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
   * Unix seconds of the exclusion clearing the two counts above follow (0: none): counts from
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

/** An exclusion the window calls for (`OfferMeasurements.exclusionsDue`). */
export interface DueExclusion {
  readonly offerId: Hex;
  readonly claimed: number;
  readonly diverged: number;
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
   * answer, on the offer that served it: never another offer of a failover), and whether the
   * claim diverged (`judgeUsage(...).diverged`, usage.ts).
   */
  claimed(offerId: Hex, diverged: boolean): void;
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
}

/** Default window: long enough to hold a provider's recent record, short enough to follow it. */
export const defaultWindowSeconds = 900;
/** Buckets per window: the window slides by a fifteenth of itself. */
const bucketsPerWindow = 15;

const binsPerDoubling = 8;
/** Values down to 2^-8 have bins of their own (slow throughputs); smaller ones share bin 0. */
const binOffset = 8 * binsPerDoubling;
const maxBin = 40 * binsPerDoubling;

/** The histogram bin of a value (0 and below: bin 0). */
export function binOf(value: number): number {
  if (!(value > 0)) return 0;
  const bin = Math.floor(Math.log2(value) * binsPerDoubling) + binOffset;
  return Math.min(maxBin, Math.max(0, bin));
}

type Bins = Map<number, [count: number, sum: number]>;

function addTo(bins: Bins, bin: number, count: number, sum: number): void {
  const cell = bins.get(bin);
  if (cell === undefined) bins.set(bin, [count, sum]);
  else {
    cell[0] += count;
    cell[1] += sum;
  }
}

function toHistogram(bins: Bins): Histogram {
  return [...bins]
    .sort(([a], [b]) => a - b)
    .map(([bin, [count, sum]]) => [bin, count, sum] as const);
}

/** The median (the lower one of an even count): the mean of the values in its bin. */
export function median(histogram: Histogram): number | undefined {
  const total = histogram.reduce((n, [, count]) => n + count, 0);
  if (total === 0) return undefined;
  const rank = Math.ceil(total / 2);
  let seen = 0;
  for (const [, count, sum] of histogram) {
    seen += count;
    if (seen >= rank) return sum / count;
  }
  return undefined;
}

interface Bucket {
  /** Which bucket of time it holds (`floor(now / bucketMs)`). */
  epoch: number;
  served: number;
  failed: number;
  claimed: number;
  diverged: number;
  latency: Bins;
  throughput: Bins;
}

export function createOfferMeasurements(
  opts: { instanceId?: string; windowSeconds?: number; now?: () => number } = {},
): OfferMeasurements {
  const windowSeconds = opts.windowSeconds ?? defaultWindowSeconds;
  const bucketMs = (windowSeconds * 1000) / bucketsPerWindow;
  const now = opts.now ?? Date.now;
  const own = new Map<Hex, Bucket[]>();
  let others = new Map<Hex, SharedMeasurement[]>();
  let excluded = new Set<Hex>();
  /** Per offer, the exclusion clearing its divergence counts follow (absent: 0). */
  const since = new Map<Hex, number>();
  // `get` is read by routing for every candidate of every request: computed once per offer
  // until it records again, the others' rows change, or the window slides.
  const memo = new Map<Hex, OfferMeasurement | undefined>();
  let memoEpoch = -1;

  const epochNow = () => Math.floor(now() / bucketMs);
  const bucketFor = (offerId: Hex): Bucket => {
    const epoch = epochNow();
    let ring = own.get(offerId);
    if (ring === undefined) {
      ring = [];
      own.set(offerId, ring);
    }
    const slot = epoch % bucketsPerWindow;
    let bucket = ring[slot];
    if (bucket === undefined || bucket.epoch !== epoch) {
      bucket = {
        epoch,
        served: 0,
        failed: 0,
        claimed: 0,
        diverged: 0,
        latency: new Map(),
        throughput: new Map(),
      };
      ring[slot] = bucket;
    }
    memo.delete(offerId);
    return bucket;
  };
  /** The buckets of `offerId` still inside the window. */
  const live = (ring: readonly (Bucket | undefined)[], epoch: number): Bucket[] =>
    ring.filter((b): b is Bucket => b !== undefined && b.epoch > epoch - bucketsPerWindow);

  const summarize = (ring: readonly (Bucket | undefined)[], epoch: number) => {
    const buckets = live(ring, epoch);
    if (buckets.length === 0) return undefined;
    const latency: Bins = new Map();
    const throughput: Bins = new Map();
    let served = 0;
    let failed = 0;
    let claimed = 0;
    let diverged = 0;
    for (const b of buckets) {
      served += b.served;
      failed += b.failed;
      claimed += b.claimed;
      diverged += b.diverged;
      for (const [bin, [count, sum]] of b.latency) addTo(latency, bin, count, sum);
      for (const [bin, [count, sum]] of b.throughput) addTo(throughput, bin, count, sum);
    }
    return { served, failed, claimed, diverged, latency, throughput };
  };

  const compute = (offerId: Hex, epoch: number): OfferMeasurement | undefined => {
    const ring = own.get(offerId);
    const mine = ring === undefined ? undefined : summarize(ring, epoch);
    const theirs = others.get(offerId) ?? [];
    const isExcluded = excluded.has(offerId);
    if (mine === undefined && theirs.length === 0 && !isExcluded) return undefined;
    const latency: Bins = new Map(mine?.latency ?? []);
    const throughput: Bins = new Map(mine?.throughput ?? []);
    // Copies: the merge must not add into this process's own buckets.
    for (const [bin, cell] of latency) latency.set(bin, [cell[0], cell[1]]);
    for (const [bin, cell] of throughput) throughput.set(bin, [cell[0], cell[1]]);
    let served = mine?.served ?? 0;
    let failed = mine?.failed ?? 0;
    let claimed = mine?.claimed ?? 0;
    let diverged = mine?.diverged ?? 0;
    const following = since.get(offerId) ?? 0;
    for (const row of theirs) {
      served += row.served;
      failed += row.failed;
      // A process that has not yet followed the offer's last clearing counts from before it.
      if (row.divergenceSince >= following) {
        claimed += row.claimed;
        diverged += row.diverged;
      }
      for (const [bin, count, sum] of row.latency) addTo(latency, bin, count, sum);
      for (const [bin, count, sum] of row.throughput) addTo(throughput, bin, count, sum);
    }
    const latencyHistogram = toHistogram(latency);
    return {
      latencyMs: median(latencyHistogram),
      throughput: median(toHistogram(throughput)),
      served,
      failed,
      samples: latencyHistogram.reduce((n, [, count]) => n + count, 0),
      claimed,
      diverged,
      excluded: isExcluded,
    };
  };

  const get = (offerId: Hex): OfferMeasurement | undefined => {
    const epoch = epochNow();
    if (epoch !== memoEpoch) {
      memo.clear();
      memoEpoch = epoch;
    }
    if (memo.has(offerId)) return memo.get(offerId);
    const m = compute(offerId, epoch);
    memo.set(offerId, m);
    return m;
  };

  return {
    windowSeconds,
    served(offerId, timing) {
      const bucket = bucketFor(offerId);
      bucket.served++;
      if (timing === undefined) return;
      const { latencyMs, outputTokens, generationMs } = timing;
      if (Number.isFinite(latencyMs) && latencyMs >= 0)
        addTo(bucket.latency, binOf(latencyMs), 1, latencyMs);
      // Throughput needs output over a measurable time; a one-event answer says nothing of it.
      if (outputTokens > 0n && generationMs >= 1) {
        const perSecond = (Number(outputTokens) * 1000) / generationMs;
        addTo(bucket.throughput, binOf(perSecond), 1, perSecond);
      }
    },
    failed(offerId) {
      bucketFor(offerId).failed++;
    },
    claimed(offerId, diverged) {
      const bucket = bucketFor(offerId);
      bucket.claimed++;
      if (diverged) bucket.diverged++;
    },
    get,
    local() {
      const epoch = epochNow();
      const out = new Map<Hex, WindowSummary>();
      for (const [offerId, ring] of own) {
        const s = summarize(ring, epoch);
        // An offer not served for a whole window is forgotten here (and its row deleted).
        if (s === undefined) {
          own.delete(offerId);
          continue;
        }
        out.set(offerId, {
          served: s.served,
          failed: s.failed,
          latency: toHistogram(s.latency),
          throughput: toHistogram(s.throughput),
          claimed: s.claimed,
          diverged: s.diverged,
          divergenceSince: since.get(offerId) ?? 0,
        });
      }
      return out;
    },
    absorb(rows) {
      const next = new Map<Hex, SharedMeasurement[]>();
      for (const row of rows) {
        if (row.instanceId === opts.instanceId) continue;
        next.set(row.offerId, [...(next.get(row.offerId) ?? []), row]);
      }
      others = next;
      memo.clear();
    },
    setExclusions(rows) {
      const standing = new Set<Hex>();
      for (const row of rows) {
        if (row.clearedAt === undefined) {
          standing.add(row.offerId);
          continue;
        }
        if (row.clearedAt <= (since.get(row.offerId) ?? 0)) continue;
        // Verified again after an exclusion: its divergence counts start afresh.
        since.set(row.offerId, row.clearedAt);
        for (const bucket of own.get(row.offerId) ?? []) {
          if (bucket === undefined) continue;
          bucket.claimed = 0;
          bucket.diverged = 0;
        }
      }
      excluded = standing;
      memo.clear();
    },
    exclusionsDue() {
      const due: DueExclusion[] = [];
      for (const offerId of new Set([...own.keys(), ...others.keys()])) {
        const m = get(offerId);
        if (m === undefined || !isExclusionDue(m)) continue;
        due.push({
          offerId,
          claimed: m.claimed,
          diverged: m.diverged,
          since: since.get(offerId) ?? 0,
        });
      }
      return due;
    },
  };
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

/**
 * Shares measurements through the database every `intervalMs` (one write and three reads per
 * round, never one per request), and reads what the catalog shows from records (verification
 * runs, flags) in the same round, so the catalog answers from memory. A process's window not
 * written for `maxAgeSeconds` (a stopped process) is left out. A failed round changes nothing:
 * routing and the catalog keep what they had.
 *
 * Usage exclusions (src/domain/divergence.ts) go through the same round: read first (a
 * clearing restarts the counts before they are written), then, once the others' windows are
 * merged, the offers whose share calls for it are excluded in the database, for every process.
 * A process reads them before it serves (`readExclusions`), so a restart routes nothing to an
 * excluded offer.
 */
export function createMeasurementSync(deps: {
  measurements: OfferMeasurements;
  store: MeasurementStore;
  instanceId: string;
  intervalMs: number;
  /** Unix seconds (the clock `offer_flags` and verification runs are written with). */
  clock: () => number;
  maxAgeSeconds?: number;
  onError?: (error: unknown) => void;
}): MeasurementSync {
  let timer: NodeJS.Timeout | undefined;
  let round: Promise<void> | undefined;
  let counts = new Map<Hex, OfferRecordCounts>();
  const runOnce = async () => {
    deps.measurements.setExclusions(await deps.store.readExclusions());
    // Every window of this process, also unchanged ones: the write keeps them from ageing
    // out while the process runs. One row per offer it served, so the write stays small.
    await deps.store.write(deps.instanceId, deps.measurements.local());
    deps.measurements.absorb(await deps.store.read(deps.maxAgeSeconds ?? 60));
    const due = deps.measurements.exclusionsDue();
    if (due.length > 0) {
      const at = deps.clock();
      for (const exclusion of due) await deps.store.exclude(exclusion, at);
      deps.measurements.setExclusions(await deps.store.readExclusions());
    }
    counts = await deps.store.readCounts(deps.clock() - deps.measurements.windowSeconds);
  };
  const loop = () => {
    round = runOnce()
      .catch((error: unknown) => deps.onError?.(error))
      .finally(() => {
        if (timer !== undefined) {
          timer = setTimeout(loop, deps.intervalMs);
          timer.unref();
        }
      });
  };
  return {
    runOnce,
    start() {
      if (timer !== undefined) return;
      timer = setTimeout(loop, deps.intervalMs);
      timer.unref();
    },
    async readExclusions() {
      deps.measurements.setExclusions(await deps.store.readExclusions());
    },
    async stop() {
      const t = timer;
      timer = undefined;
      if (t !== undefined) clearTimeout(t);
      await round;
    },
    counts: (offerId) => counts.get(offerId),
  };
}
