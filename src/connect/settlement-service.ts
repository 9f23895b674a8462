import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  BatchStatus,
  FlushResponseSchema,
  ListBatchesResponseSchema,
  ReconcileResponseSchema,
  SettlementService,
} from "../../gen/gateway/v1/settlement_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { BatchState, Reconciliation, SettlementFlusher } from "../domain/settlement/index.js";
import type { BatchRecord } from "../domain/settlement/index.js";

export interface SettlementServiceDeps {
  /** Absent when this gateway has no settlement account (SETTLEMENT_PRIVATE_KEY). */
  readonly flusher: SettlementFlusher | undefined;
  readonly reconcile: () => Promise<Reconciliation>;
  /** The most recent batches, newest first (adapters/pg/earnings.ts). */
  readonly listBatches?: (args: {
    limit: number;
    status?: Exclude<BatchState, "dry_run">;
  }) => Promise<BatchRecord[]>;
}

/** Batches a list answers when the request names no limit, and the most it may name. */
export const defaultBatchListLimit = 50;
export const maxBatchListLimit = 500;

const statusOfBatch = new Map<BatchStatus, Exclude<BatchState, "dry_run">>([
  [BatchStatus.PENDING, "pending"],
  [BatchStatus.SUBMITTED, "submitted"],
  [BatchStatus.SETTLED, "settled"],
  [BatchStatus.FAILED, "failed"],
]);

const batchStatus: Record<BatchState, BatchStatus> = {
  pending: BatchStatus.PENDING,
  submitted: BatchStatus.SUBMITTED,
  settled: BatchStatus.SETTLED,
  failed: BatchStatus.FAILED,
  dry_run: BatchStatus.DRY_RUN,
};

/** Flush and Reconcile; the operator token is checked by the auth interceptor before either. */
export function createSettlementService(
  deps: SettlementServiceDeps,
): ServiceImpl<typeof SettlementService> {
  const flusher = (): SettlementFlusher => {
    if (deps.flusher === undefined) {
      throw new GatewayError(
        "settlement_unavailable",
        "this gateway has no settlement account configured (SETTLEMENT_PRIVATE_KEY)",
      );
    }
    return deps.flusher;
  };
  return {
    async flush(req) {
      const result = await flusher().flush({
        maxRequests: req.maxRequests,
        dryRun: req.dryRun,
      });
      return create(FlushResponseSchema, {
        batches: result.batches.map((b) => ({
          batchId: b.batchId,
          requests: BigInt(b.requests),
          credits: b.credits.toString(),
          txHash: b.txHash ?? "",
          status: batchStatus[b.status],
          charges: BigInt(b.charges),
          gas: b.gas?.toString() ?? "",
          error: b.error ?? "",
        })),
        settledRequests: BigInt(result.settledRequests),
        settledCredits: result.settledCredits.toString(),
        unsettleable: result.unsettleable.map((u) => ({
          permitId: u.permitId,
          offerId: u.offerId,
          requests: BigInt(u.requests),
          credits: u.credits.toString(),
          reason: u.reason,
        })),
        busy: result.busy,
      });
    },
    async reconcile() {
      const r = await deps.reconcile();
      return create(ReconcileResponseSchema, {
        account: r.account,
        drift: r.drift,
        permits: r.permits.map((p) => ({
          permitId: p.permitId,
          gatewaySettled: p.gatewaySettled.toString(),
          ledgerSettled: p.ledgerSettled.toString(),
          chainSettled: p.chainSettled.toString(),
          unsettleable: p.unsettleable.toString(),
          drift: p.drift,
        })),
        offers: r.offers.map((o) => ({
          offerId: o.offerId,
          gatewayPaid: o.gatewayPaid.toString(),
          chainPaid: o.chainPaid.toString(),
          drift: o.drift,
        })),
      });
    },
    async listBatches(req) {
      if (deps.listBatches === undefined)
        throw new GatewayError("not_implemented", "the batch list is not served here");
      const limit = req.limit ?? defaultBatchListLimit;
      if (limit < 1 || limit > maxBatchListLimit) {
        throw new GatewayError(
          "invalid_request",
          `limit must be between 1 and ${maxBatchListLimit}`,
        );
      }
      const wanted = statusOfBatch.get(req.status);
      if (req.status !== BatchStatus.UNSPECIFIED && wanted === undefined) {
        throw new GatewayError("invalid_request", "no stored batch has that status");
      }
      const batches = await deps
        .listBatches({ limit, ...(wanted === undefined ? {} : { status: wanted }) })
        .catch((error: unknown) => {
          throw new GatewayError("database_unavailable", "the batches could not be read", {
            cause: error,
          });
        });
      return create(ListBatchesResponseSchema, {
        batches: batches.map((b) => ({
          batchId: b.batchId,
          status: batchStatus[b.status],
          requests: BigInt(b.requests),
          credits: b.credits.toString(),
          txHash: b.txHash ?? "",
          createdAt: BigInt(b.createdAt),
          settledAt: b.settledAt === null ? undefined : BigInt(b.settledAt),
          error: b.error ?? "",
        })),
      });
    },
  };
}
