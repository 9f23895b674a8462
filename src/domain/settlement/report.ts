/** What a flush answers: one report per batch, per unsettleable pair, and the sums. */
import type { Hex } from "viem";
import type {
  BatchCharge,
  BatchReport,
  BatchState,
  FlushResult,
  UnsettleableMark,
  UnsettleableReport,
} from "./types.js";

export const report = (
  batchId: Hex,
  charges: readonly BatchCharge[],
  status: BatchState,
  extra: { txHash?: Hex | undefined; gas?: bigint | undefined; error?: string | undefined } = {},
): BatchReport => ({
  batchId,
  requests: charges.reduce((n, c) => n + c.requests, 0),
  credits: charges.reduce((sum, c) => sum + c.amount, 0n),
  charges: charges.length,
  txHash: extra.txHash,
  status,
  gas: extra.gas,
  error: extra.error,
});

export const unsettleableReport = (mark: UnsettleableMark): UnsettleableReport => ({
  permitId: mark.permitId,
  offerId: mark.offerId,
  requests: mark.requestIds.length,
  credits: mark.credits,
  reason: mark.reason,
});

export function summary(batches: BatchReport[], unsettleable: UnsettleableReport[]): FlushResult {
  const settled = batches.filter((b) => b.status === "settled");
  return {
    batches,
    settledRequests: settled.reduce((n, b) => n + b.requests, 0),
    settledCredits: settled.reduce((sum, b) => sum + b.credits, 0n),
    unsettleable,
    busy: false,
  };
}
