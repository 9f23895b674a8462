import type { Hex } from "viem";

/**
 * What the gateway measured of each offer's requests over a sliding window (the offer
 * reputation, src/domain/reputation.ts, and the keys `provider.sort` orders by, DESIGN.md
 * section 9): how many requests the provider served and how many it failed, and the time to
 * first token (latency) and output tokens per second (throughput) of the served ones, as
 * histograms whose medians routing and the catalog read. One source for both, so the latency
 * the catalog shows is the latency routing sorts by.
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
   * 429, nor anything the gateway itself failed (the caller decides; relay.ts).
   */
  failed(offerId: Hex): void;
  /**
   * A completed answer of the offer carried a usage claim; `diverged`: above the gateway's
   * count plus tolerance (usage.ts `judgeUsage`).
   */
  claimed?(offerId: Hex, diverged: boolean): void;
  /** The offer's measurement: this process's window merged with the other processes'. */
  get(offerId: Hex): OfferMeasurement | undefined;
  /** This process's own windows, for the database. */
  local(): Map<Hex, WindowSummary>;
  /** Replaces what the other processes measured (rows of this process are ignored). */
  absorb(rows: readonly SharedMeasurement[]): void;
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
      bucket = { epoch, served: 0, failed: 0, latency: new Map(), throughput: new Map() };
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
    for (const b of buckets) {
      served += b.served;
      failed += b.failed;
      for (const [bin, [count, sum]] of b.latency) addTo(latency, bin, count, sum);
      for (const [bin, [count, sum]] of b.throughput) addTo(throughput, bin, count, sum);
    }
    return { served, failed, latency, throughput };
  };

  const compute = (offerId: Hex, epoch: number): OfferMeasurement | undefined => {
    const ring = own.get(offerId);
    const mine = ring === undefined ? undefined : summarize(ring, epoch);
    const theirs = others.get(offerId) ?? [];
    if (mine === undefined && theirs.length === 0) return undefined;
    const latency: Bins = new Map(mine?.latency ?? []);
    const throughput: Bins = new Map(mine?.throughput ?? []);
    // Copies: the merge must not add into this process's own buckets.
    for (const [bin, cell] of latency) latency.set(bin, [cell[0], cell[1]]);
    for (const [bin, cell] of throughput) throughput.set(bin, [cell[0], cell[1]]);
    let served = mine?.served ?? 0;
    let failed = mine?.failed ?? 0;
    for (const row of theirs) {
      served += row.served;
      failed += row.failed;
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
    };
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
    get(offerId) {
      const epoch = epochNow();
      if (epoch !== memoEpoch) {
        memo.clear();
        memoEpoch = epoch;
      }
      if (memo.has(offerId)) return memo.get(offerId);
      const m = compute(offerId, epoch);
      memo.set(offerId, m);
      return m;
    },
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
}

export interface MeasurementSync {
  /** Writes this process's windows, reads the others' and the record counts. */
  runOnce(): Promise<void>;
  start(): void;
  stop(): Promise<void>;
  /** The record counts of an offer as last read (undefined: none in the window). */
  counts(offerId: Hex): OfferRecordCounts | undefined;
}

/**
 * Shares measurements through the database every `intervalMs` (one write and two reads per
 * round, never one per request), and reads what the catalog shows from records (verification
 * runs, flags) in the same round, so the catalog answers from memory. A process's window not
 * written for `maxAgeSeconds` (a stopped process) is left out. A failed round changes nothing:
 * routing and the catalog keep what they had.
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
    // Every window of this process, also unchanged ones: the write keeps them from ageing
    // out while the process runs. One row per offer it served, so the write stays small.
    await deps.store.write(deps.instanceId, deps.measurements.local());
    deps.measurements.absorb(await deps.store.read(deps.maxAgeSeconds ?? 60));
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
    async stop() {
      const t = timer;
      timer = undefined;
      if (t !== undefined) clearTimeout(t);
      await round;
    },
    counts: (offerId) => counts.get(offerId),
  };
}
