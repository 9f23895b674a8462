import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  BatchStatus,
  FlushResponseSchema,
  ReconcileResponseSchema,
  SettlementService,
} from "../../gen/gateway/v1/settlement_pb.js";
import { GatewayError } from "../domain/errors.js";
import type { BatchState, Reconciliation, SettlementFlusher } from "../domain/settlement.js";

export interface SettlementServiceDeps {
  /** Absent when this gateway has no settlement account (SETTLEMENT_PRIVATE_KEY). */
  readonly flusher: SettlementFlusher | undefined;
  readonly reconcile: () => Promise<Reconciliation>;
}

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
  };
}
