import type { Logger } from "pino";
import type { Hex, PublicClient } from "viem";
import { createChainSettlement } from "../adapters/chain/settlement.js";
import type { Database } from "../adapters/pg/database.js";
import { createPgSettlementStore } from "../adapters/pg/settlement.js";
import { createSettledTotals } from "../adapters/settled-totals.js";
import type { Config } from "../config.js";
import type { ChainPermitReader } from "../adapters/chain/permits.js";
import { reconcileSettled } from "../domain/reconciliation.js";
import {
  createSettlementFlusher,
  type Reconciliation,
  type SettlementFlusher,
} from "../domain/settlement/index.js";
import type { createMetrics } from "../runtime/metrics.js";
import type { Tracing } from "../runtime/tracing.js";

/**
 * Settlement in this process: the flusher behind SettlementService.Flush (absent without
 * SETTLEMENT_PRIVATE_KEY), one background settlement task at a time (the recovery of a batch a
 * stopped process left in flight, and the close watcher that settles charges of permits in
 * their close grace period without waiting for a worker), and the reconciliation report.
 */
export interface Settlement {
  readonly flusher: SettlementFlusher | undefined;
  /** Settles the charges of closing permits soon (in the background, once at a time). */
  settleClosingSoon(): void;
  /** Starts the close watcher and drives a batch left in flight to its end. */
  start(): void;
  reconcile(): Promise<Reconciliation>;
  /**
   * Stops the watcher and the task's waiting at once (when called); resolves when the task under
   * way ended.
   */
  stop(): Promise<void>;
}

export function createSettlement(
  config: Config,
  deps: {
    readonly db: Database;
    readonly chain: PublicClient;
    readonly permits: ChainPermitReader;
    readonly instanceId: string;
    readonly clock: () => number;
    readonly metrics: ReturnType<typeof createMetrics>;
    readonly tracing: Tracing | undefined;
    readonly logger: Logger;
  },
): Settlement {
  const { db, chain, permits, logger } = deps;
  const untraced: SettlementFlusher | undefined =
    config.settlementPrivateKey === undefined
      ? undefined
      : createSettlementFlusher({
          store: createPgSettlementStore(db.pool),
          chain: createChainSettlement({
            client: chain,
            chainId: config.chainId,
            market: config.marketAddress,
            privateKey: config.settlementPrivateKey,
          }),
          holder: deps.instanceId,
          logger: logger.child({ component: "settlement" }),
          clock: deps.clock,
          confirmations: config.confirmations,
          maxBatchGas: config.settlementMaxBatchGas,
          replaceAfterBlocks: config.settlementReplaceAfterBlocks,
          feeBumpPercent: config.settlementFeeBumpPercent,
          feeCap: {
            maxFeePerGas: config.settlementMaxFeePerGas,
            maxPriorityFeePerGas: config.settlementMaxPriorityFeePerGas,
          },
          waitMs: config.settlementWaitMs,
          leaseSeconds: config.settlementLeaseSeconds,
          pollMs: Math.min(config.pollIntervalMs, 1000),
          closeMarginSeconds: config.settlementCloseMarginSeconds,
          observer: deps.metrics.settlement,
          // What we just settled is read afresh (the view's four amounts add up at once),
          // without waiting for the indexer to see ChargeSettled.
          onSettled: (permitIds: readonly Hex[]) => {
            for (const permitId of permitIds) permits.invalidate(permitId);
          },
        });
  const flusher =
    untraced === undefined ? undefined : (deps.tracing?.traceFlusher(untraced) ?? untraced);
  const totals = createSettledTotals({
    pool: db.pool,
    chain,
    market: config.marketAddress,
    startBlock: config.startBlock,
  });
  // Shutdown stops the task's waiting at once.
  const stopping = new AbortController();
  let task: Promise<void> | undefined;
  let watcher: NodeJS.Timeout | undefined;
  const inBackground = (what: string, run: (flusher: SettlementFlusher) => Promise<unknown>) => {
    if (flusher === undefined || task !== undefined || stopping.signal.aborted) return;
    task = run(flusher)
      .then(
        () => undefined,
        (error: unknown) => logger.warn({ err: error }, `${what} failed; will retry`),
      )
      .finally(() => {
        task = undefined;
      });
  };
  const settleClosingSoon = (): void =>
    inBackground("settling charges of closing permits", (f) => f.settleClosing(stopping.signal));

  return {
    flusher,
    settleClosingSoon,
    start() {
      watcher = setInterval(settleClosingSoon, config.settlementCloseCheckMs);
      watcher.unref();
      // A batch a stopped process left in flight is driven to its end from the chain's state
      // (asking isBatchSettled first), whether or not a worker calls soon.
      inBackground("recovering settlement batches in flight", (f) =>
        f.flush({ maxRequests: 0, signal: stopping.signal }),
      );
    },
    reconcile: () => reconcileSettled({ totals, permits, account: flusher?.account ?? "0x" }),
    async stop() {
      clearInterval(watcher);
      stopping.abort();
      await task;
    },
  };
}
