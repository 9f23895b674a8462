import type { Hex } from "viem";
import { isConfirmationDue, isExclusionDue } from "./divergence.js";
import {
  keptDivergedPayers,
  type DueExclusion,
  type Histogram,
  type OfferMeasurement,
  type OfferMeasurements,
  type SharedMeasurement,
  type WindowSummary,
} from "./measurement-types.js";

/**
 * What the gateway measured of each offer's requests over a sliding window (the offer
 * reputation, src/domain/reputation/reputation.ts, and the keys `provider.sort` orders by, DESIGN.md
 * section 9): how many requests the provider served and how many it failed, and the time to
 * first token (latency) and output tokens per second (throughput) of the served ones, as
 * histograms whose medians routing and the catalog read. One source for both, so the latency
 * the catalog shows is the latency routing sorts by. Also how many of its answers carried a
 * usage claim and how many of those claims diverged from the gateway's count (the usage
 * divergence, src/domain/reputation/divergence.ts), and whether the offer stands excluded for it.
 *
 * Kept in memory per process in time buckets (nothing is written per request); shared across
 * the processes of one database on an interval (`createMeasurementSync`, measurement-sync.ts):
 * each process writes its own window's summary and reads the others', which are merged with its
 * own. The types, and the ports of the sharing, are in measurement-types.ts.
 */

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
  /** Distinct payers of the diverged answers, at most `keptDivergedPayers`. */
  divergedPayers: Set<Hex>;
  latency: Bins;
  throughput: Bins;
}

/** The sums of an offer's live buckets. */
type Summary = Omit<Bucket, "epoch">;

function newBucket(epoch: number): Bucket {
  return {
    epoch,
    served: 0,
    failed: 0,
    claimed: 0,
    diverged: 0,
    divergedPayers: new Set(),
    latency: new Map(),
    throughput: new Map(),
  };
}

/** Adds payers to a kept set, up to `keptDivergedPayers` (enough for every threshold). */
function addPayers(to: Set<Hex>, payers: Iterable<Hex>): void {
  for (const payer of payers) {
    if (to.size >= keptDivergedPayers) return;
    to.add(payer);
  }
}

/** The buckets of `offerId` still inside the window. */
function live(ring: readonly (Bucket | undefined)[], epoch: number): Bucket[] {
  return ring.filter((b): b is Bucket => b !== undefined && b.epoch > epoch - bucketsPerWindow);
}

/** This process's buckets of an offer still inside the window, summed; undefined: none. */
function summarize(ring: readonly (Bucket | undefined)[], epoch: number): Summary | undefined {
  const buckets = live(ring, epoch);
  if (buckets.length === 0) return undefined;
  const latency: Bins = new Map();
  const throughput: Bins = new Map();
  let served = 0;
  let failed = 0;
  let claimed = 0;
  let diverged = 0;
  const divergedPayers = new Set<Hex>();
  for (const b of buckets) {
    served += b.served;
    failed += b.failed;
    claimed += b.claimed;
    diverged += b.diverged;
    addPayers(divergedPayers, b.divergedPayers);
    for (const [bin, [count, sum]] of b.latency) addTo(latency, bin, count, sum);
    for (const [bin, [count, sum]] of b.throughput) addTo(throughput, bin, count, sum);
  }
  return { served, failed, claimed, diverged, divergedPayers, latency, throughput };
}

/**
 * An offer's measurement: this process's summary (`mine`) merged with the other processes' rows
 * (`theirs`), their divergence counts only from the clearing this process follows (`following`).
 */
function merge(
  mine: Summary | undefined,
  theirs: readonly SharedMeasurement[],
  isExcluded: boolean,
  following: number,
): OfferMeasurement | undefined {
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
  const divergedPayers = new Set<Hex>(mine?.divergedPayers ?? []);
  for (const row of theirs) {
    served += row.served;
    failed += row.failed;
    // A process that has not yet followed the offer's last clearing counts from before it.
    if (row.divergenceSince >= following) {
      claimed += row.claimed;
      diverged += row.diverged;
      addPayers(divergedPayers, row.divergedPayers);
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
    divergedPayers: divergedPayers.size,
    excluded: isExcluded,
  };
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
      bucket = newBucket(epoch);
      ring[slot] = bucket;
    }
    memo.delete(offerId);
    return bucket;
  };
  const compute = (offerId: Hex, epoch: number): OfferMeasurement | undefined => {
    const ring = own.get(offerId);
    return merge(
      ring === undefined ? undefined : summarize(ring, epoch),
      others.get(offerId) ?? [],
      excluded.has(offerId),
      since.get(offerId) ?? 0,
    );
  };

  /** Every offer measured here or by another process. */
  const known = (): Hex[] => [...new Set([...own.keys(), ...others.keys()])];

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
    claimed(offerId, diverged, payer) {
      const bucket = bucketFor(offerId);
      bucket.claimed++;
      if (!diverged) return;
      bucket.diverged++;
      if (payer !== undefined) addPayers(bucket.divergedPayers, [payer.toLowerCase() as Hex]);
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
          divergedPayers: [...s.divergedPayers],
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
          bucket.divergedPayers.clear();
        }
      }
      excluded = standing;
      memo.clear();
    },
    exclusionsDue: () =>
      known().flatMap((offerId): DueExclusion[] => {
        const m = get(offerId);
        if (m === undefined || !isExclusionDue(m)) return [];
        const { claimed, diverged } = m;
        const payers = m.divergedPayers ?? 0;
        return [{ offerId, claimed, diverged, payers, since: since.get(offerId) ?? 0 }];
      }),
    confirmationsDue: () => known().filter((offerId) => isConfirmationDue(get(offerId))),
  };
}
