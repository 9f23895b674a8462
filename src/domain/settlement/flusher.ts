/**
 * The settlement flusher: one flush takes the account's lease, drives the batches in flight to
 * their end, then plans, stores and drives new batches from the queue until the deadline. The
 * state one flush carries is its {@link FlushRun}; each stage is a function of its own.
 */
import type { Hex } from "viem";
import { signer } from "./broadcast.js";
import { flusherOf, type Flusher } from "./context.js";
import { drive } from "./drive.js";
import { cappedMarketFees } from "./fees.js";
import { plan, selectLimit } from "./plan.js";
import { report, summary, unsettleableReport } from "./report.js";
import type {
  BatchReport,
  FlushOptions,
  FlushResult,
  PlannedCharge,
  SettlementFlusher,
  SettlementFlusherDeps,
  UnsettleableMark,
  UnsettleableReport,
} from "./types.js";

/** What one leased flush carries from stage to stage. */
interface FlushRun {
  readonly f: Flusher;
  readonly options: FlushOptions;
  /** When the flush stops waiting for its transaction (`waitMs` after it began). */
  readonly deadline: number;
  readonly batches: BatchReport[];
  readonly unsettleable: UnsettleableReport[];
  /** Requests still to settle (`maxRequests`); 0: only drive what is in flight. */
  remaining: number;
}

export function createSettlementFlusher(deps: SettlementFlusherDeps): SettlementFlusher {
  const f = flusherOf(deps);
  // One flush at a time in this process: the lease's holder is the process, so a second flush
  // (the worker's and an operator's Flush) would share it, and the first to end would release
  // it under the other (found on a Flush right after a restart: 500, lease lost). The second
  // waits for the first, then flushes what is left.
  let running: Promise<unknown> = Promise.resolve();
  const flush = (options: FlushOptions = {}): Promise<FlushResult> => {
    const next = running.then(
      () => flushWithLease(f, options),
      () => flushWithLease(f, options),
    );
    running = next.catch(() => undefined);
    return next;
  };
  return {
    account: f.account,
    flush,
    settleClosing: (signal) => settleClosing(f, flush, signal),
  };
}

async function flushWithLease(f: Flusher, options: FlushOptions): Promise<FlushResult> {
  const { store, account, holder, logger, deps } = f;
  if (options.dryRun === true) return dryRun(f, options);
  if (!(await store.takeLease(account, holder, deps.leaseSeconds))) {
    return { batches: [], settledRequests: 0, settledCredits: 0n, unsettleable: [], busy: true };
  }
  let renewal: Promise<unknown> = Promise.resolve();
  const renew = setInterval(
    () => {
      renewal = store.takeLease(account, holder, deps.leaseSeconds).catch((error: unknown) => {
        logger.warn({ err: error }, "settlement lease renewal failed");
      });
    },
    (deps.leaseSeconds * 1000) / 3,
  );
  try {
    const result = await flushLeased(f, options);
    for (const b of result.batches) {
      const mined = b.status === "settled" || b.status === "failed";
      deps.observer?.batch(b.status, mined ? b.gas : undefined);
    }
    return result;
  } catch (error) {
    deps.observer?.failure();
    throw error;
  } finally {
    clearInterval(renew);
    await renewal;
    await store.releaseLease(account, holder).catch((error: unknown) => {
      logger.warn({ err: error }, "settlement lease release failed; it expires on its own");
    });
  }
}

async function flushLeased(f: Flusher, options: FlushOptions): Promise<FlushResult> {
  const run: FlushRun = {
    f,
    options,
    deadline: Date.now() + f.deps.waitMs,
    batches: [],
    unsettleable: [],
    remaining: options.maxRequests ?? Number.POSITIVE_INFINITY,
  };
  if (await driveInFlight(run)) {
    // maxRequests 0: only drive what is in flight (recovery after a restart).
    while (run.remaining > 0 && Date.now() < run.deadline && options.signal?.aborted !== true) {
      if (!(await settleQueue(run))) break;
    }
  }
  return summary(run.batches, run.unsettleable);
}

/** The batches already in flight, each to its end; false when one is still in flight. */
async function driveInFlight(run: FlushRun): Promise<boolean> {
  const { f } = run;
  for (const batch of await f.store.inFlight(f.account)) {
    const outcome = await drive(f, batch, run.deadline, run.options.signal);
    run.batches.push(outcome);
    if (outcome.status !== "settled") return false;
  }
  return true;
}

/**
 * One read of the queue: its unsettleable charges marked, its batches stored and driven one
 * after the other. True to read the queue again; false when it was empty, a batch is still in
 * flight (one transaction per account), a batch failed, or the deadline passed.
 */
async function settleQueue(run: FlushRun): Promise<boolean> {
  let planned = false;
  const limit = Math.min(run.remaining, selectLimit);
  for await (const { batchId, good, bad, calldata, gas } of plan(run.f, run.options, limit)) {
    planned = true;
    if (bad.length > 0) await markUnsettleable(run, bad);
    if (calldata === undefined || good.length === 0) continue;
    const outcome = await storeAndDrive(run, { batchId, good, calldata, gas });
    run.batches.push(outcome);
    run.remaining -= outcome.requests;
    // Still in flight: one transaction per account. Failed: its charges are unsettled
    // again, and the next flush simulates them afresh (never a loop of reverting batches).
    if (outcome.status !== "settled" || Date.now() >= run.deadline) return false;
  }
  return planned;
}

/** Charges the chain would refuse: marked unsettleable, reported and logged. */
async function markUnsettleable(run: FlushRun, bad: readonly UnsettleableMark[]): Promise<void> {
  const { f } = run;
  await f.store.markUnsettleable(f.account, f.holder, bad);
  for (const mark of bad) {
    const reported = unsettleableReport(mark);
    run.unsettleable.push(reported);
    f.logger.warn(
      { ...reported, credits: reported.credits.toString() },
      "charges cannot settle on chain; marked unsettleable",
    );
  }
}

/** A planned batch stored with its first signed attempt, then driven. */
async function storeAndDrive(
  run: FlushRun,
  batch: { batchId: Hex; good: PlannedCharge[]; calldata: Hex; gas: bigint },
): Promise<BatchReport> {
  const { f } = run;
  const { batchId, good, calldata, gas } = batch;
  const fees = await cappedMarketFees(f, batchId);
  const head = await f.chain.head();
  const gasLimit = (gas * 125n) / 100n + 20_000n;
  await f.store.storeBatch(
    {
      account: f.account,
      holder: f.holder,
      batchId,
      charges: good,
      calldata,
      chainNonce: await f.chain.minedNonce(),
      now: f.clock(),
    },
    signer(f, calldata, gasLimit, fees, head),
  );
  return drive(
    f,
    { batchId, calldata, charges: good, status: "pending" },
    run.deadline,
    run.options.signal,
  );
}

/** The batches a flush would make, simulated, nothing stored or sent. */
async function dryRun(f: Flusher, options: FlushOptions): Promise<FlushResult> {
  const batches: BatchReport[] = [];
  const unsettleable: UnsettleableReport[] = [];
  const limit = Math.min(options.maxRequests ?? selectLimit, selectLimit);
  for await (const { batchId, good, bad, gas } of plan(f, options, limit)) {
    unsettleable.push(...bad.map(unsettleableReport));
    if (good.length > 0) batches.push(report(batchId, good, "dry_run", { gas }));
  }
  return { batches, settledRequests: 0, settledCredits: 0n, unsettleable, busy: false };
}

/** Settles the charges of permits in their close grace period, if any (the close watcher). */
async function settleClosing(
  f: Flusher,
  flush: (options: FlushOptions) => Promise<FlushResult>,
  signal: AbortSignal | undefined,
): Promise<FlushResult | undefined> {
  const closing = await f.store.closingPermitsWithCharges();
  if (closing.length === 0) return undefined;
  const now = f.clock();
  const margin = f.deps.closeMarginSeconds ?? 0;
  for (const permit of closing) {
    if (now >= permit.closableAt - margin) {
      f.logger.error(
        { permitId: permit.permitId, closableAt: permit.closableAt, now },
        "a closing permit still has unsettled charges inside the close margin",
      );
    }
  }
  return flush({ permits: closing.map((c) => c.permitId), signal });
}
