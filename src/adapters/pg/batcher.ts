import { BaseError } from "../../domain/base-error.js";
/**
 * Natural batching (group commit in the application): items submitted while a batch is in
 * flight wait and then go together as the next batch, so under load many items share one round
 * trip, and unloaded an item goes at once, alone, with no added latency (no timer, no waiting
 * for a batch to fill).
 */

/** What became of one item of a batch. */
export type ItemOutcome<R> =
  { readonly ok: true; readonly value: R } | { readonly ok: false; readonly error: unknown };

export interface BatcherOptions<I, R> {
  /**
   * Runs one batch and returns one outcome per item, in the items' order. A rejection (or a
   * wrong number of outcomes) fails every item of the batch with that error.
   */
  readonly run: (items: readonly I[]) => Promise<readonly ItemOutcome<R>[]>;
  /** The most items in one batch (default 64); the rest wait for the next one. */
  readonly maxBatch?: number;
  /** The most batches in flight at once (default 1). */
  readonly maxInFlight?: number;
  /**
   * The most items waiting for a batch (not counting those in flight); a submit that would
   * have to wait beyond it is refused at once (default: no bound; 0: only what can go at once).
   */
  readonly maxQueued?: number;
  /**
   * How long an item may wait for a batch (default: no bound). One still waiting then is taken
   * out of the queue, refused, and never sent: behind a hung batch, a caller fails in time. An
   * item already sent is never refused early: it keeps its batch's outcome, whenever that comes
   * (bound that with the run's own timeouts).
   */
  readonly maxWaitMs?: number;
}

/**
 * The batcher refused an item before sending it: nothing of it reached the database, so its
 * outcome is known (nothing happened) and there is nothing to undo.
 */
export class BatcherOverloadError extends BaseError {
  override readonly name = "BatcherOverloadError";
  /** Always false: the item was never sent (callers outside this module test this field). */
  readonly sent = false;
  constructor(readonly reason: "queue_full" | "wait_timeout") {
    super(
      reason === "queue_full"
        ? "too many items are waiting for the database"
        : "the item waited too long for the database",
    );
  }
}

export interface BatcherStats {
  /** Batches sent so far. */
  readonly batches: number;
  /** Items sent so far, in all batches. */
  readonly items: number;
  /** Items waiting for a batch. */
  readonly queued: number;
  readonly inFlight: number;
}

export interface Batcher<I, R> {
  /** Sends `item` in the next batch; settles with its own outcome, or its batch's failure. */
  submit(item: I): Promise<R>;
  stats(): BatcherStats;
}

interface Waiting<I, R> {
  readonly item: I;
  readonly resolve: (value: R) => void;
  readonly reject: (error: unknown) => void;
  timer?: NodeJS.Timeout;
}

export function createBatcher<I, R>(options: BatcherOptions<I, R>): Batcher<I, R> {
  const maxBatch = options.maxBatch ?? 64;
  const maxInFlight = options.maxInFlight ?? 1;
  const maxQueued = options.maxQueued ?? Number.POSITIVE_INFINITY;
  const maxWaitMs = options.maxWaitMs;
  if (!Number.isInteger(maxBatch) || maxBatch < 1) {
    throw new RangeError(`maxBatch must be a positive integer (got ${maxBatch})`);
  }
  if (!Number.isInteger(maxInFlight) || maxInFlight < 1) {
    throw new RangeError(`maxInFlight must be a positive integer (got ${maxInFlight})`);
  }
  if (maxQueued !== Number.POSITIVE_INFINITY && (!Number.isInteger(maxQueued) || maxQueued < 0)) {
    throw new RangeError(`maxQueued must be a non-negative integer (got ${maxQueued})`);
  }
  if (maxWaitMs !== undefined && (!Number.isFinite(maxWaitMs) || maxWaitMs < 0)) {
    throw new RangeError(`maxWaitMs must be a non-negative number (got ${maxWaitMs})`);
  }
  const queue: Waiting<I, R>[] = [];
  let inFlight = 0;
  let batches = 0;
  let items = 0;

  // Synchronous: a batch goes out in the same call that made room for it (submit, or the end
  // of the previous batch), before any caller's continuation runs.
  function pump(): void {
    while (inFlight < maxInFlight && queue.length > 0) {
      const batch = queue.splice(0, maxBatch);
      for (const w of batch) if (w.timer !== undefined) clearTimeout(w.timer);
      inFlight++;
      batches++;
      items += batch.length;
      void send(batch);
    }
  }

  async function send(batch: Waiting<I, R>[]): Promise<void> {
    try {
      let outcomes: readonly ItemOutcome<R>[];
      try {
        outcomes = await options.run(batch.map((w) => w.item));
        if (!Array.isArray(outcomes) || outcomes.length !== batch.length) {
          throw new Error(
            `a batch of ${batch.length} items returned ${Array.isArray(outcomes) ? outcomes.length : "no"} outcomes`,
          );
        }
      } catch (error) {
        // The whole batch failed: what became of each item is unknown to us.
        for (const w of batch) w.reject(error);
        return;
      }
      batch.forEach((w, i) => {
        const outcome = outcomes[i]!;
        if (outcome.ok) w.resolve(outcome.value);
        else w.reject(outcome.error);
      });
    } finally {
      inFlight--;
      pump();
    }
  }

  return {
    submit(item) {
      return new Promise<R>((resolve, reject) => {
        // Only an item that would have to wait is counted against the bound (with a batch
        // slot free the queue is empty and the item goes at once).
        if (inFlight >= maxInFlight && queue.length >= maxQueued) {
          reject(new BatcherOverloadError("queue_full"));
          return;
        }
        const waiting: Waiting<I, R> = { item, resolve, reject };
        queue.push(waiting);
        pump();
        // Still waiting (pump takes from the front, so an item it did not take is still the last).
        if (maxWaitMs !== undefined && queue[queue.length - 1] === waiting) {
          waiting.timer = setTimeout(() => {
            const at = queue.indexOf(waiting);
            if (at < 0) return;
            queue.splice(at, 1);
            reject(new BatcherOverloadError("wait_timeout"));
          }, maxWaitMs);
          waiting.timer.unref();
        }
      });
    },
    stats: () => ({ batches, items, queued: queue.length, inFlight }),
  };
}
