/**
 * The settlement's vocabulary: the charges and batches it moves, its two ports (the store and
 * the chain), and what a flush reports.
 */
import type { Logger } from "pino";
import type { Hex } from "viem";
import type { EarningsBatch } from "../offer-earnings.js";

/**
 * An x402 payment's signed Permit2 transfer (issue 37), as the Market's `settleWithPayments`
 * takes it; integers as decimal strings (it is stored as JSON).
 */
export interface PaymentItem {
  readonly permit: {
    readonly permitted: { readonly token: Hex; readonly amount: string };
    readonly nonce: string;
    readonly deadline: string;
  };
  readonly owner: Hex;
  readonly witness: { readonly to: Hex; readonly facilitator: Hex; readonly validAfter: string };
  readonly signature: Hex;
  /**
   * The payer's EIP-2612 approval of Permit2 (a gasless first payment), submitted in the batch
   * (`settleWithPaymentsAndApprovals`) while its allowance is short.
   */
  readonly approval?: ApprovalItem | undefined;
}

/** A signed EIP-2612 `permit(owner, Permit2, value, deadline)` on the payment's token. */
export interface ApprovalItem {
  readonly value: string;
  readonly deadline: string;
  readonly signature: Hex;
}

/** A charged request waiting to settle. */
export interface PendingCharge {
  readonly requestId: string;
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly credits: bigint;
  /** When the permit may be finalised, for a permit in its close grace period. */
  readonly closableAt: number | undefined;
  /** The request was paid with x402: its permit is the payment, settled with its transfer. */
  readonly payment?: PaymentItem | undefined;
}

/** One `Charge` entry of a batch: the sum of a (permit, offer) pair's charges. */
export interface BatchCharge {
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly amount: bigint;
  readonly requests: number;
  /** An x402 payment (one request): settled through its signed transfer, not a deposit. */
  readonly payment?: PaymentItem | undefined;
}

export interface PlannedCharge extends BatchCharge {
  readonly requestIds: readonly string[];
}

export interface SettlementAttempt {
  readonly txHash: Hex;
  readonly nonce: number;
  readonly raw: Hex;
  readonly gas: bigint;
  readonly maxFeePerGas: bigint;
  readonly maxPriorityFeePerGas: bigint;
  /** The chain head when the attempt was made. */
  readonly headBlock: bigint;
  /** The chain head when the node first took it (sent, or already known); undefined: never. */
  readonly sentBlock?: bigint | undefined;
}

/** Fee fields of an EIP-1559 transaction, in wei. */
export interface Fees {
  readonly maxFeePerGas: bigint;
  readonly maxPriorityFeePerGas: bigint;
}

export interface InFlightBatch {
  readonly batchId: Hex;
  readonly status: "pending" | "submitted";
  readonly calldata: Hex;
  readonly requests: number;
  readonly credits: bigint;
  readonly charges: readonly BatchCharge[];
  readonly attempts: readonly SettlementAttempt[];
}

export interface UnsettleableMark {
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly requestIds: readonly string[];
  readonly credits: bigint;
  readonly reason: string;
}

export type Sign = (nonce: number) => Promise<SettlementAttempt>;

/** The settlement tables (the PostgreSQL adapter). Writes that take `holder` are fenced by the lease. */
export interface SettlementStore {
  /** Takes or renews the account's lease; false when another holder has it. */
  takeLease(account: Hex, holder: string, seconds: number): Promise<boolean>;
  releaseLease(account: Hex, holder: string): Promise<void>;
  /** Unsettled charges, closing permits' first (soonest closable first), then the oldest. */
  pendingCharges(opts: {
    limit: number;
    permits?: readonly Hex[] | undefined;
  }): Promise<PendingCharge[]>;
  closingPermitsWithCharges(): Promise<{ permitId: Hex; closableAt: number }[]>;
  markUnsettleable(account: Hex, holder: string, marks: readonly UnsettleableMark[]): Promise<void>;
  /**
   * One transaction: the batch, its first signed attempt (under `chainNonce`, the account's
   * mined count: with one transaction in flight per account it is the next free nonce), and its
   * requests `settling`.
   */
  storeBatch(
    input: {
      account: Hex;
      holder: string;
      batchId: Hex;
      charges: readonly PlannedCharge[];
      calldata: Hex;
      chainNonce: number;
      now: number;
    },
    sign: Sign,
  ): Promise<SettlementAttempt>;
  /** Another attempt for a stored batch: `nonce` for a replacement, else `chainNonce`. */
  recordAttempt(
    input: {
      account: Hex;
      holder: string;
      batchId: Hex;
      nonce?: number;
      chainNonce: number;
      now: number;
    },
    sign: Sign,
  ): Promise<SettlementAttempt>;
  /**
   * The node took `txHash` (sent, or already known) at chain head `head`: the attempt's
   * `sentBlock` (kept if already set) and the batch `submitted`.
   */
  markSent(batchId: Hex, txHash: Hex, head: bigint): Promise<void>;
  inFlight(account: Hex): Promise<InFlightBatch[]>;
  attempts(batchId: Hex): Promise<SettlementAttempt[]>;
  /** Settles the batch and its requests and adds to the permits' settled; false if it was not in flight. */
  markSettled(
    batchId: Hex,
    outcome: { txHash: Hex; blockNumber: bigint; gasUsed: bigint; settledAt: number },
  ): Promise<boolean>;
  /** Fails the batch and returns its requests to unsettled; false if it was not in flight. */
  markFailed(
    batchId: Hex,
    outcome: { txHash?: Hex; blockNumber?: bigint; gasUsed?: bigint; error: string },
  ): Promise<boolean>;
}

/** Why the chain would refuse a batch, decoded from its revert. */
export interface SettleRevert {
  /** The contract error's name (`ChargeExceedsDeposit`, `OfferMismatch`, `InvalidState`, ...). */
  readonly name: string;
  readonly permitId?: Hex;
  readonly offerId?: Hex;
  readonly amount?: bigint;
  readonly message: string;
  /** What an x402 payment's transfer failed on (`PaymentFailed`'s inner error), when decoded. */
  readonly detail?: string | undefined;
}

export type Simulation = { ok: true; gas: bigint } | { ok: false; revert: SettleRevert };
/**
 * What the node answered a broadcast. `insufficient_funds`: the settlement account cannot pay
 * `gas * maxFeePerGas` (an operator must fund it; no fee change helps). Anything else it
 * could not be asked about throws.
 */
export type BroadcastOutcome =
  "sent" | "known" | "nonce_too_low" | "underpriced" | "insufficient_funds";
export type PermitChainState = "none" | "open" | "closing" | "closed";

/** The chain side of settlement (the viem adapter). Failures to reach the chain throw. */
export interface SettlementChain {
  /** The settlement operator account the gateway sends from. */
  readonly account: Hex;
  head(): Promise<bigint>;
  /** Transactions of the account mined so far (the next nonce the chain expects). */
  minedNonce(): Promise<number>;
  fees(): Promise<Fees>;
  encode(batchId: Hex, charges: readonly BatchCharge[]): Hex;
  simulate(calldata: Hex): Promise<Simulation>;
  sign(tx: {
    nonce: number;
    gas: bigint;
    maxFeePerGas: bigint;
    maxPriorityFeePerGas: bigint;
    data: Hex;
  }): Promise<{ raw: Hex; txHash: Hex }>;
  broadcast(raw: Hex): Promise<BroadcastOutcome>;
  receipt(
    txHash: Hex,
  ): Promise<{ status: "success" | "reverted"; blockNumber: bigint; gasUsed: bigint } | undefined>;
  /** Where `batchId` settled (its BatchSettled log), searching from `fromBlock`; undefined if it has not. */
  batchSettled(
    batchId: Hex,
    fromBlock: bigint,
  ): Promise<{ txHash: Hex; blockNumber: bigint } | undefined>;
  permitState(permitId: Hex): Promise<PermitChainState>;
}

/**
 * A stored settlement batch, as the batch list shows it (the settlement console); the earnings
 * store (adapters/pg/earnings.ts) reads it.
 */
export interface BatchRecord {
  readonly batchId: Hex;
  readonly status: EarningsBatch["status"];
  readonly requests: number;
  readonly credits: bigint;
  readonly txHash: Hex | null;
  readonly createdAt: number;
  readonly settledAt: number | null;
  readonly error: string | null;
}

export type BatchState = "pending" | "submitted" | "settled" | "failed" | "dry_run";

export interface BatchReport {
  readonly batchId: Hex;
  readonly requests: number;
  readonly credits: bigint;
  readonly charges: number;
  readonly txHash: Hex | undefined;
  readonly status: BatchState;
  readonly gas: bigint | undefined;
  readonly error: string | undefined;
}

export interface UnsettleableReport {
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly requests: number;
  readonly credits: bigint;
  readonly reason: string;
}

export interface FlushResult {
  readonly batches: BatchReport[];
  readonly settledRequests: number;
  readonly settledCredits: bigint;
  readonly unsettleable: UnsettleableReport[];
  /** Another flusher holds the account: nothing was done. */
  readonly busy: boolean;
}

export interface FlushOptions {
  readonly maxRequests?: number | undefined;
  readonly dryRun?: boolean | undefined;
  /** Only these permits' charges (the close watcher). */
  readonly permits?: readonly Hex[] | undefined;
  /**
   * Stops waiting for a transaction in flight (shutdown): the flush answers at once with the
   * batch `submitted`, and the next flush goes on from the chain's state. Nothing is abandoned.
   */
  readonly signal?: AbortSignal | undefined;
}

export interface SettlementFlusherDeps {
  readonly store: SettlementStore;
  readonly chain: SettlementChain;
  /** Identifies this flusher in the lease (one per process). */
  readonly holder: string;
  readonly logger: Logger;
  /** Unix seconds. */
  readonly clock: () => number;
  /** Blocks on top of a receipt's block before it counts. */
  readonly confirmations: number;
  readonly maxBatchGas: bigint;
  readonly replaceAfterBlocks: number;
  readonly feeBumpPercent: number;
  /** Most the flusher ever offers per gas, whatever the market or a replacement asks. */
  readonly feeCap: Fees;
  /** How long one flush waits for its transaction before answering `submitted`. */
  readonly waitMs: number;
  readonly leaseSeconds: number;
  /** Between two looks at the chain while a transaction is in flight. */
  readonly pollMs: number;
  /** Settle charges of closing permits this long before `closableAt` at the latest. */
  readonly closeMarginSeconds?: number;
  /** Metrics hooks; absent: nothing is observed. */
  readonly observer?: SettlementObserver;
  /**
   * Told of the permits of a batch once it is recorded settled (its receipt `confirmations`
   * deep, the ledger's `settled` raised), so cached chain reads of them are dropped at once: a
   * permit read from before the settlement says `settled` 0 while the ledger no longer counts
   * the charge as unsettled. It must not throw.
   */
  readonly onSettled?: (permitIds: readonly Hex[]) => void;
}

/** Hooks for metrics (the domain never imports a metrics library); they must not throw. */
export interface SettlementObserver {
  /**
   * A batch as a flush reports it (a batch still in flight is reported again by the next
   * flush); `gasUsed` only for a mined one (settled or failed).
   */
  batch(status: BatchState, gasUsed: bigint | undefined): void;
  /** A flush that failed with an error (its outcome is resumed by the next flush). */
  failure(): void;
  /** A broadcast the node refused because the settlement account cannot pay for it. */
  insufficientFunds(): void;
}

export interface SettlementFlusher {
  readonly account: Hex;
  flush(options?: FlushOptions): Promise<FlushResult>;
  /** Settles the charges of permits in their close grace period, if any (the close watcher). */
  settleClosing(signal?: AbortSignal): Promise<FlushResult | undefined>;
}
