import type { Hex } from "viem";

/**
 * What the gateway measured of each offer's served requests: time to first token (latency) and
 * output tokens per second (throughput), the keys `provider.sort` orders by (DESIGN.md section
 * 9). Kept in memory per process as exponentially weighted moving averages, so routing reads
 * them without a database round trip; shared across the processes of one database on an
 * interval (`createMeasurementSync`): each process writes its own averages, and reads the
 * others', which routing blends with its own by their sample counts.
 */

/** One offer's averages (milliseconds; tokens per second) and how many samples made them. */
export interface OfferMeasurement {
  readonly latencyMs: number | undefined;
  readonly throughput: number | undefined;
  readonly samples: number;
}

/** Another process's averages of an offer, as the database holds them. */
export interface SharedMeasurement extends OfferMeasurement {
  readonly offerId: Hex;
  readonly instanceId: string;
}

export interface OfferMeasurements {
  /**
   * One served answer: `latencyMs` from the provider call to the first token, and the output
   * tokens produced over `generationMs` (from the first token to the end of the answer).
   */
  record(
    offerId: Hex,
    sample: { latencyMs: number; outputTokens: bigint; generationMs: number },
  ): void;
  /** The offer's measurement: this process's averages blended with the other processes'. */
  get(offerId: Hex): OfferMeasurement | undefined;
  /** This process's own averages, for the database. */
  local(): Map<Hex, OfferMeasurement>;
  /** Replaces what the other processes measured (rows of this process are ignored). */
  absorb(rows: readonly SharedMeasurement[]): void;
}

/** Weight of a new sample in the moving averages. */
export const measurementAlpha = 0.3;
/** Samples counted at most per process when blending (old measurements fade, as in the EWMA). */
const maxWeight = 100;

function ewma(previous: number | undefined, sample: number, alpha: number): number {
  return previous === undefined ? sample : previous + alpha * (sample - previous);
}

export function createOfferMeasurements(
  opts: { instanceId?: string; alpha?: number } = {},
): OfferMeasurements {
  const alpha = opts.alpha ?? measurementAlpha;
  const own = new Map<Hex, OfferMeasurement>();
  let others = new Map<Hex, SharedMeasurement[]>();
  return {
    record(offerId, { latencyMs, outputTokens, generationMs }) {
      if (!Number.isFinite(latencyMs) || latencyMs < 0) return;
      const m = own.get(offerId);
      // Throughput needs output over a measurable time; a one-event answer says nothing of it.
      const throughput =
        outputTokens > 0n && generationMs >= 1
          ? (Number(outputTokens) * 1000) / generationMs
          : undefined;
      own.set(offerId, {
        latencyMs: ewma(m?.latencyMs, latencyMs, alpha),
        throughput:
          throughput === undefined ? m?.throughput : ewma(m?.throughput, throughput, alpha),
        samples: (m?.samples ?? 0) + 1,
      });
    },
    get(offerId) {
      const parts = [...(others.get(offerId) ?? []), own.get(offerId)].filter(
        (m): m is OfferMeasurement => m !== undefined,
      );
      if (parts.length === 0) return undefined;
      const blend = (key: "latencyMs" | "throughput"): number | undefined => {
        let sum = 0;
        let weight = 0;
        for (const m of parts) {
          const value = m[key];
          if (value === undefined) continue;
          const w = Math.min(maxWeight, Math.max(1, m.samples));
          sum += value * w;
          weight += w;
        }
        return weight === 0 ? undefined : sum / weight;
      };
      return {
        latencyMs: blend("latencyMs"),
        throughput: blend("throughput"),
        samples: parts.reduce((n, m) => n + m.samples, 0),
      };
    },
    local: () => new Map(own),
    absorb(rows) {
      const next = new Map<Hex, SharedMeasurement[]>();
      for (const row of rows) {
        if (row.instanceId === opts.instanceId) continue;
        next.set(row.offerId, [...(next.get(row.offerId) ?? []), row]);
      }
      others = next;
    },
  };
}

/** The database side of the sharing (adapters/pg/offer-measurements.ts). */
export interface MeasurementStore {
  /** Upserts this process's averages. */
  write(instanceId: string, rows: ReadonlyMap<Hex, OfferMeasurement>): Promise<void>;
  /** Every process's averages written in the last `maxAgeSeconds` (database clock). */
  read(maxAgeSeconds: number): Promise<SharedMeasurement[]>;
}

export interface MeasurementSync {
  /** Writes this process's averages and reads the others'. */
  runOnce(): Promise<void>;
  start(): void;
  stop(): Promise<void>;
}

/**
 * Shares measurements through the database every `intervalMs` (one write and one read per
 * round, never one per request). Averages not written for `maxAgeSeconds` (a stopped process)
 * are left out. A failed round changes nothing: routing keeps what it had.
 */
export function createMeasurementSync(deps: {
  measurements: OfferMeasurements;
  store: MeasurementStore;
  instanceId: string;
  intervalMs: number;
  maxAgeSeconds?: number;
  onError?: (error: unknown) => void;
}): MeasurementSync {
  let timer: NodeJS.Timeout | undefined;
  let round: Promise<void> | undefined;
  const runOnce = async () => {
    // Every average of this process, also unchanged ones: the write keeps them from ageing
    // out while the process runs. One row per offer it served, so the write stays small.
    const local = deps.measurements.local();
    if (local.size > 0) await deps.store.write(deps.instanceId, local);
    deps.measurements.absorb(await deps.store.read(deps.maxAgeSeconds ?? 600));
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
  };
}
