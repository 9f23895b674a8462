import type { Hex } from "viem";
import { createPeriodic } from "../periodic.js";
import type {
  MeasurementStore,
  MeasurementSync,
  OfferMeasurements,
  OfferRecordCounts,
} from "./measurement-types.js";

/**
 * Shares measurements through the database every `intervalMs` (one write and three reads per
 * round, never one per request), and reads what the catalog shows from records (verification
 * runs, flags) in the same round, so the catalog answers from memory. A process's window not
 * written for `maxAgeSeconds` (a stopped process) is left out. A failed round changes nothing:
 * routing and the catalog keep what they had.
 *
 * Usage exclusions (src/domain/reputation/divergence.ts) go through the same round: read first (a
 * clearing restarts the counts before they are written), then, once the others' windows are
 * merged, the offers whose share calls for it are excluded in the database, for every process.
 * A process reads them before it serves (`readExclusions`), so a restart routes nothing to an
 * excluded offer. An offer whose share would exclude it but whose diverged answers come from too
 * few independent payers is handed to `confirm` instead (the gateway's own probe).
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
  /**
   * Asks the gateway's own probe to confirm an offer's divergence (a verification of it): called
   * in each round for the offers whose share would exclude them but for too few independent
   * payers (`OfferMeasurements.confirmationsDue`, src/domain/reputation/divergence.ts). The verification
   * is bounded fleet-wide by its own minimum interval; a run whose counting step finds the
   * provider overclaiming fails `usage_diverged` and takes the offer out of routing.
   */
  confirm?: (offerId: Hex) => void;
}): MeasurementSync {
  let counts = new Map<Hex, OfferRecordCounts>();
  const runOnce = async () => {
    deps.measurements.setExclusions(await deps.store.readExclusions());
    // Every window of this process, also unchanged ones: the write keeps them from ageing
    // out while the process runs. One row per offer it served, so the write stays small.
    await deps.store.write(deps.instanceId, deps.measurements.local());
    deps.measurements.absorb(await deps.store.read(deps.maxAgeSeconds ?? 60));
    if (deps.confirm !== undefined) {
      for (const offerId of deps.measurements.confirmationsDue()) deps.confirm(offerId);
    }
    const due = deps.measurements.exclusionsDue();
    if (due.length > 0) {
      const at = deps.clock();
      for (const exclusion of due) await deps.store.exclude(exclusion, at);
      deps.measurements.setExclusions(await deps.store.readExclusions());
    }
    counts = await deps.store.readCounts(deps.clock() - deps.measurements.windowSeconds);
  };
  const rounds = createPeriodic({
    run: runOnce,
    intervalMs: deps.intervalMs,
    onError: deps.onError,
  });
  return {
    runOnce,
    start: rounds.start,
    async readExclusions() {
      deps.measurements.setExclusions(await deps.store.readExclusions());
    },
    stop: rounds.stop,
    counts: (offerId) => counts.get(offerId),
  };
}
