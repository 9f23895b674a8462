import type { Hex } from "viem";
import type { Billing, FinalStatus, UsageFigures, UsageSource } from "./chat/types.js";

/** A request's states: open (pending, streaming), then one final state, once. */
export type RequestStatus = "pending" | "streaming" | FinalStatus;
/** The final states (the chat pipeline's): a request reaches exactly one of them, once. */
export type FinalRequestStatus = FinalStatus;
export type SettlementStatus = "unsettled" | "settling" | "settled" | "none" | "unsettleable";

/**
 * A stored inference request, as the transports show it (request lookups, receipts) and as the
 * request store (adapters/pg/requests.ts) maps its rows of `inference_requests` to it: amounts
 * and token counts as bigint, times as Unix seconds. While the request is open (pending or
 * streaming) `maximumCredits` is the reservation held against the permit and the final fields
 * are null.
 */
export interface RequestRecord {
  readonly id: string;
  readonly apiKeyId: string;
  /** The gateway process that serves (or served) the request. */
  readonly instanceId: string;
  readonly model: string;
  readonly modelId: Hex;
  readonly offerId: Hex;
  readonly permitId: Hex;
  readonly quoteId: string;
  readonly stream: boolean;
  readonly status: RequestStatus;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  /** Usage details (migration 018): of the input, served from the provider's prompt cache. */
  readonly cachedInputTokens: bigint;
  /** Of the output, spent on reasoning (0 when not reported, or not credible). */
  readonly reasoningTokens: bigint;
  readonly maximumCredits: bigint;
  readonly creditsCharged: bigint | null;
  readonly billing: Billing | null;
  readonly usageSource: UsageSource | null;
  /**
   * The provider's usage claim (migration 026); null when it reported none, and for a request
   * closed before the gateway kept it.
   */
  readonly claimed: UsageFigures | null;
  /** The gateway's own count of the answer; null when nothing was counted. */
  readonly counted: UsageFigures | null;
  readonly tariffVersion: bigint;
  readonly error: string | null;
  readonly createdAt: number;
  readonly completedAt: number | null;
  readonly settlementStatus: SettlementStatus;
  readonly batchId: string | null;
  readonly txHash: Hex | null;
  readonly settledAt: number | null;
  /** Why the charge can never settle (unsettleable only). */
  readonly settlementReason: string | null;
}
