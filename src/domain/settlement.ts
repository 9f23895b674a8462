import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import type { Hex } from "viem";
import type { EarningsBatch } from "./offer-earnings.js";

/**
 * Settlement: every charge reaches the chain exactly once (DESIGN.md sections 2 and 3).
 *
 * The chain is the authority on what has been paid: `settle(batchId, charges)` accepts a batch
 * id once, and `isBatchSettled(batchId)` says whether it did. The flusher is a transaction
 * manager in the style of Chainlink's, persisted before every side effect:
 *
 *   unsettled --store (batch, calldata, signed tx, hash, nonce)--> settling / batch `pending`
 *   pending --broadcast--> `submitted` --receipt with BatchSettled, CONFIRMATIONS deep--> settled
 *   submitted --an attempt reverted, CONFIRMATIONS deep, none succeeded, and the chain asked
 *     once more says the batch id has not settled--> `failed`: charges unsettled
 *
 * - One flusher per settlement account at a time (a lease on the database clock; every write
 *   is fenced by it), and one transaction in flight per account: a batch is driven to its end
 *   before the next is made.
 * - Every signed attempt is stored before it is broadcast, and kept. A batch is settled only
 *   when the chain says its id settled; before any resend the chain is asked first.
 * - An attempt the node took (`sentBlock`) and left unmined for `replaceAfterBlocks` blocks is
 *   replaced: same nonce, same calldata, fees raised by `feeBumpPercent` (at least 15), never
 *   above `feeCap`. An attempt the node never took (its broadcast failed or was refused) is
 *   re-sent as it is: a higher fee cures neither an unreachable node nor an empty account, and
 *   raising it on every failed try would ratchet without end. An attempt whose nonce another
 *   transaction took is re-sent under a new nonce with the same batch id (the chain refuses a
 *   second settlement of one id, so whichever lands, it lands once).
 * - A batch is simulated before it is stored; a charge the chain would refuse (its permit
 *   closed or unknown, an offer mismatch, beyond the deposit) is taken out and marked
 *   `unsettleable` with the reason, so one bad permit never holds up the others.
 * - Charges are aggregated per (permit, offer): one `Charge` entry per pair per batch.
 */

/** A charged request waiting to settle. */
export interface PendingCharge {
  readonly requestId: string;
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly credits: bigint;
  /** When the permit may be finalised, for a permit in its close grace period. */
  readonly closableAt: number | undefined;
}

/** One `Charge` entry of a batch: the sum of a (permit, offer) pair's charges. */
export interface BatchCharge {
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly amount: bigint;
  readonly requests: number;
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

/** Gas a batch costs besides its entries, and a first guess of one entry's (refined by estimation). */
const baseGasGuess = 60_000n;
const chargeGasGuess = 30_000n;
/** Most charges read for one batch. */
const selectLimit = 20_000;

/** Sums charges per (permit, offer), in the order each pair first appears (the queue's priority). */
export function aggregateCharges(charges: readonly PendingCharge[]): PlannedCharge[] {
  const byPair = new Map<string, { permitId: Hex; offerId: Hex; amount: bigint; ids: string[] }>();
  for (const charge of charges) {
    const key = `${charge.permitId}:${charge.offerId}`;
    let entry = byPair.get(key);
    if (entry === undefined) {
      entry = { permitId: charge.permitId, offerId: charge.offerId, amount: 0n, ids: [] };
      byPair.set(key, entry);
    }
    entry.amount += charge.credits;
    entry.ids.push(charge.requestId);
  }
  return [...byPair.values()].map((e) => ({
    permitId: e.permitId,
    offerId: e.offerId,
    amount: e.amount,
    requests: e.ids.length,
    requestIds: e.ids,
  }));
}

/** `value` raised by `percent`, rounded up. */
export function bump(value: bigint, percent: number): bigint {
  return (value * BigInt(100 + percent) + 99n) / 100n;
}

const maxOf = (a: bigint, b: bigint) => (a > b ? a : b);
const minOf = (a: bigint, b: bigint) => (a < b ? a : b);

/**
 * The least rise of both fee fields a node takes as a replacement of a pending transaction
 * (geth's txpool price bump); a smaller one it refuses as underpriced.
 */
export const minReplacementBumpPercent = 10;

/** `fees` held to `cap` field by field; the fee cap never falls below the tip. */
export function capFees(fees: Fees, cap: Fees): Fees {
  const priority = minOf(fees.maxPriorityFeePerGas, cap.maxPriorityFeePerGas);
  return {
    maxFeePerGas: maxOf(minOf(fees.maxFeePerGas, cap.maxFeePerGas), priority),
    maxPriorityFeePerGas: priority,
  };
}

/**
 * The fees of a replacement: the old ones raised by `percent`, or the market's if higher, held
 * to `cap`. Undefined when the cap leaves no rise a node would take (under
 * {@link minReplacementBumpPercent} on either field): the attempt in flight stays as it is.
 */
export function replacementFees(
  previous: Fees,
  market: Fees,
  percent: number,
  cap: Fees,
): Fees | undefined {
  const priority = maxOf(bump(previous.maxPriorityFeePerGas, percent), market.maxPriorityFeePerGas);
  const fee = maxOf(bump(previous.maxFeePerGas, percent), market.maxFeePerGas);
  const fees = capFees({ maxFeePerGas: maxOf(fee, priority), maxPriorityFeePerGas: priority }, cap);
  const taken =
    fees.maxFeePerGas >= bump(previous.maxFeePerGas, minReplacementBumpPercent) &&
    fees.maxPriorityFeePerGas >= bump(previous.maxPriorityFeePerGas, minReplacementBumpPercent);
  const changed =
    fees.maxFeePerGas !== previous.maxFeePerGas ||
    fees.maxPriorityFeePerGas !== previous.maxPriorityFeePerGas;
  return taken && changed ? fees : undefined;
}

/** Entries the contract would process up to `gasBound`, by the first guess of an entry's gas. */
export function entriesUnder(gasBound: bigint): number {
  const n = (gasBound - baseGasGuess) / chargeGasGuess;
  return n < 1n ? 1 : Number(n);
}

const reasonOf = (revert: SettleRevert): string => {
  switch (revert.name) {
    case "ChargeExceedsDeposit":
      return "exceeds_deposit";
    case "OfferMismatch":
      return "offer_mismatch";
    case "InvalidState":
      return "permit_closed";
    case "NotFound":
      return "not_found";
    default:
      return revert.name;
  }
};

/** A failure that makes every batch revert, not one charge: configuration, never unsettleable. */
const batchWideErrors = new Set(["NotSettlementOperator", "BatchAlreadySettled"]);

/** A batch ready to store: what simulates cleanly under the gas bound, and what never will. */
interface Prepared {
  readonly good: PlannedCharge[];
  readonly bad: UnsettleableMark[];
  readonly badEntries: PlannedCharge[];
  readonly calldata: Hex | undefined;
  readonly gas: bigint;
}

export function createSettlementFlusher(deps: SettlementFlusherDeps): SettlementFlusher {
  const { store, chain, holder, logger, clock } = deps;
  const account = chain.account;
  const newBatchId = (): Hex => `0x${randomBytes(32).toString("hex")}`;

  /**
   * Takes the charges the chain would refuse out of `entries` (marking nothing: the caller
   * decides), until the rest simulates cleanly under the gas bound.
   */
  async function prepare(batchId: Hex, entries: readonly PlannedCharge[]): Promise<Prepared> {
    let candidate = [...entries];
    const bad: UnsettleableMark[] = [];
    const badEntries: PlannedCharge[] = [];
    const remove = (culprits: readonly PlannedCharge[], reason: string) => {
      for (const c of culprits) {
        badEntries.push(c);
        bad.push({
          permitId: c.permitId,
          offerId: c.offerId,
          requestIds: c.requestIds,
          credits: c.amount,
          reason,
        });
      }
      candidate = candidate.filter((c) => !culprits.includes(c));
    };
    for (;;) {
      if (candidate.length === 0)
        return { good: [], bad, badEntries, calldata: undefined, gas: 0n };
      const calldata = chain.encode(batchId, candidate);
      const result = await chain.simulate(calldata);
      if (result.ok) {
        if (result.gas > deps.maxBatchGas && candidate.length > 1) {
          const keep = Number(
            (BigInt(candidate.length) * deps.maxBatchGas * 9n) / (result.gas * 10n),
          );
          candidate = candidate.slice(0, Math.max(1, Math.min(keep, candidate.length - 1)));
          continue;
        }
        return { good: candidate, bad, badEntries, calldata, gas: result.gas };
      }
      const revert = result.revert;
      if (batchWideErrors.has(revert.name)) {
        throw new Error(`settlement refused by the market: ${revert.message}`);
      }
      // 1. The revert names the charge.
      if (revert.permitId !== undefined) {
        const culprit = candidate.find(
          (c) =>
            c.permitId === revert.permitId &&
            (revert.offerId === undefined || c.offerId === revert.offerId) &&
            (revert.amount === undefined || c.amount === revert.amount),
        );
        if (culprit !== undefined) {
          remove([culprit], reasonOf(revert));
          continue;
        }
      }
      // 2. Permits the chain no longer takes charges for.
      const permits = [...new Set(candidate.map((c) => c.permitId))];
      const states = await Promise.all(permits.map((p) => chain.permitState(p)));
      const gone = new Map<Hex, string>();
      permits.forEach((p, i) => {
        if (states[i] === "closed") gone.set(p, "permit_closed");
        if (states[i] === "none") gone.set(p, "permit_not_found");
      });
      if (gone.size > 0) {
        for (const [permitId, reason] of gone)
          remove(
            candidate.filter((c) => c.permitId === permitId),
            reason,
          );
        continue;
      }
      // 3. Each entry alone.
      const alone = await Promise.all(
        candidate.map((c) => chain.simulate(chain.encode(batchId, [c]))),
      );
      const culprits = candidate.filter((_, i) => !alone[i]!.ok);
      if (culprits.length === 0) {
        throw new Error(`settlement batch reverts in simulation: ${revert.message}`);
      }
      for (const c of culprits) {
        const r = alone[candidate.indexOf(c)]!;
        remove([c], r.ok ? "rejected" : reasonOf(r.revert));
      }
    }
  }

  const report = (
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

  const signer =
    (data: Hex, gas: bigint, fees: Fees, headBlock: bigint): Sign =>
    async (nonce) => {
      const signed = await chain.sign({ nonce, gas, data, ...fees });
      return { txHash: signed.txHash, raw: signed.raw, nonce, gas, headBlock, ...fees };
    };

  /** The market's fees, held to the cap (logged when the cap bites: the transaction may wait). */
  async function cappedMarketFees(batchId: Hex): Promise<Fees> {
    const market = await chain.fees();
    const fees = capFees(market, deps.feeCap);
    if (
      fees.maxFeePerGas !== market.maxFeePerGas ||
      fees.maxPriorityFeePerGas !== market.maxPriorityFeePerGas
    ) {
      logger.warn(
        {
          batchId,
          marketMaxFeePerGas: market.maxFeePerGas.toString(),
          marketMaxPriorityFeePerGas: market.maxPriorityFeePerGas.toString(),
          maxFeePerGas: fees.maxFeePerGas.toString(),
          maxPriorityFeePerGas: fees.maxPriorityFeePerGas.toString(),
        },
        "settlement fees held to SETTLEMENT_MAX_FEE_PER_GAS / SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS; the transaction may wait for the market to fall",
      );
    }
    return fees;
  }

  const insufficientFundsError =
    "insufficient_funds: the settlement account cannot pay for the transaction's gas";

  /**
   * Broadcasts `attempt` and records what the node said: taken (sent or already known), the
   * attempt's `sentBlock` and the batch `submitted`; refused for want of funds, an error line and
   * the metric. A failure to reach the node throws (the attempt stays unsent: re-sent as it is).
   */
  async function send(batchId: Hex, attempt: SettlementAttempt, head: bigint) {
    const outcome = await chain.broadcast(attempt.raw);
    if (outcome === "sent" || outcome === "known") {
      await store.markSent(batchId, attempt.txHash, head);
    } else if (outcome === "insufficient_funds") {
      deps.observer?.insufficientFunds();
      logger.error(
        {
          batchId,
          account,
          txHash: attempt.txHash,
          nonce: attempt.nonce,
          gas: attempt.gas.toString(),
          maxFeePerGas: attempt.maxFeePerGas.toString(),
          // What the node wants the account to hold (no value is sent).
          needsWei: (attempt.gas * attempt.maxFeePerGas).toString(),
        },
        "settlement account has insufficient funds for gas; fund it: the batch stays in flight and the same transaction is re-sent",
      );
    }
    return outcome;
  }

  /**
   * Drives one stored batch until it is settled, failed, or `deadline` passes (then it stays
   * in flight for the next flush). The chain is asked first, every time.
   */
  async function drive(
    batch: {
      batchId: Hex;
      calldata: Hex;
      charges: readonly BatchCharge[];
      status: "pending" | "submitted";
    },
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<BatchReport> {
    const { batchId, calldata, charges } = batch;
    let broadcastThisCall = false;
    // Attempts found at the fee cap in this call (logged once, not re-priced every poll).
    const atCap = new Set<Hex>();
    let lagLogged = false;
    // The account cannot pay: stay in flight (nothing to wait for until it is funded).
    const unfunded = async (): Promise<BatchReport> => {
      const all = await store.attempts(batchId);
      const latest = all.at(-1);
      const status = all.some((a) => a.sentBlock !== undefined) ? "submitted" : batch.status;
      return report(batchId, charges, status, {
        txHash: latest?.txHash,
        error: insufficientFundsError,
      });
    };
    for (;;) {
      const attempts = await store.attempts(batchId);
      const first = attempts[0];
      if (first === undefined) throw new Error(`settlement batch ${batchId} has no attempt`);
      const fromBlock = attempts.reduce(
        (m, a) => (a.headBlock < m ? a.headBlock : m),
        first.headBlock,
      );
      const head = await chain.head();
      const settled = await chain.batchSettled(batchId, fromBlock);
      if (settled !== undefined) {
        if (head >= settled.blockNumber + BigInt(deps.confirmations)) {
          const receipt = await chain.receipt(settled.txHash);
          if (receipt === undefined) {
            // The node has the log but not yet the receipt (a lagging replica): ask again.
            await sleep(deps.pollMs);
            continue;
          }
          const gasUsed = receipt.gasUsed;
          await store.markSettled(batchId, {
            txHash: settled.txHash,
            blockNumber: settled.blockNumber,
            gasUsed,
            settledAt: clock(),
          });
          deps.onSettled?.([...new Set(charges.map((c) => c.permitId))]);
          const done = report(batchId, charges, "settled", {
            txHash: settled.txHash,
            gas: gasUsed,
          });
          logger.info(
            {
              batchId,
              txHash: settled.txHash,
              requests: done.requests,
              credits: done.credits.toString(),
              gasUsed: gasUsed.toString(),
            },
            "settlement batch settled",
          );
          return done;
        }
      } else {
        // Not settled (as of the head read above). Did one of our attempts get mined anyway?
        const receipts = await Promise.all(attempts.map((a) => chain.receipt(a.txHash)));
        const mined = receipts.some((r) => r !== undefined);
        const succeeded = receipts.findIndex((r) => r?.status === "success");
        const reverted = receipts.findIndex(
          (r) => r?.status === "reverted" && head >= r.blockNumber + BigInt(deps.confirmations),
        );
        if (succeeded >= 0) {
          // One attempt succeeded, so the batch id settled, whatever the read above said (a
          // load-balanced node behind the one that answered the receipt, a reorg under way):
          // never failed, whichever other attempt reverted. Wait until the chain shows it.
          if (!lagLogged) {
            lagLogged = true;
            logger.warn(
              { batchId, txHash: attempts[succeeded]!.txHash },
              "a settlement attempt succeeded but the chain does not show the batch settled yet; waiting",
            );
          }
        } else if (reverted >= 0) {
          const txHash = attempts[reverted]!.txHash;
          const receipt = receipts[reverted]!;
          // Failing returns the charges to be batched again under a new id, which the chain
          // cannot refuse as a replay: ask it once more, now, whether this id settled.
          if ((await chain.batchSettled(batchId, fromBlock)) !== undefined) {
            logger.warn(
              { batchId, txHash },
              "a settlement attempt's receipt says reverted but the chain says the batch settled; not failing it",
            );
            continue;
          }
          const error = "the settlement transaction reverted";
          if (
            await store.markFailed(batchId, {
              txHash,
              blockNumber: receipt.blockNumber,
              gasUsed: receipt.gasUsed,
              error,
            })
          ) {
            logger.error(
              { batchId, txHash, requests: report(batchId, charges, "failed").requests },
              "settlement batch reverted on chain; its charges are unsettled again and will be re-simulated",
            );
          }
          return report(batchId, charges, "failed", { txHash, gas: receipt.gasUsed, error });
        } else if (!mined) {
          const latest = attempts[attempts.length - 1]!;
          const minedNonce = await chain.minedNonce();
          if (minedNonce > latest.nonce) {
            // The nonce is spent, but by none of our attempts (checked again now, after reading
            // the nonce, so an attempt mined in between is not taken for a stranger's).
            const again = await Promise.all(attempts.map((a) => chain.receipt(a.txHash)));
            if (
              again.every((r) => r === undefined) &&
              (await chain.batchSettled(batchId, fromBlock)) === undefined
            ) {
              const fees = await cappedMarketFees(batchId);
              const attempt = await store.recordAttempt(
                { account, holder, batchId, chainNonce: minedNonce, now: clock() },
                signer(calldata, latest.gas, fees, head),
              );
              logger.warn(
                {
                  batchId,
                  nonce: attempt.nonce,
                  previousNonce: latest.nonce,
                  txHash: attempt.txHash,
                },
                "settlement nonce taken by another transaction; re-sending the batch under a new nonce",
              );
              broadcastThisCall = true;
              if ((await send(batchId, attempt, head)) === "insufficient_funds") return unfunded();
              continue;
            }
            continue;
          }
          // Only an attempt the node took can be stuck for its price; one it never took is
          // re-sent below as it is (a failed broadcast never raises the fees).
          const sentBlock = latest.sentBlock;
          if (
            sentBlock !== undefined &&
            head >= sentBlock + BigInt(deps.replaceAfterBlocks) &&
            !atCap.has(latest.txHash)
          ) {
            const fees = replacementFees(
              latest,
              await chain.fees(),
              deps.feeBumpPercent,
              deps.feeCap,
            );
            if (fees === undefined) {
              atCap.add(latest.txHash);
              logger.warn(
                {
                  batchId,
                  txHash: latest.txHash,
                  maxFeePerGas: latest.maxFeePerGas.toString(),
                  maxPriorityFeePerGas: latest.maxPriorityFeePerGas.toString(),
                },
                "settlement transaction not mined in time, but its fees are at SETTLEMENT_MAX_FEE_PER_GAS / SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS; keeping it",
              );
            } else {
              const attempt = await store.recordAttempt(
                {
                  account,
                  holder,
                  batchId,
                  nonce: latest.nonce,
                  chainNonce: minedNonce,
                  now: clock(),
                },
                signer(calldata, latest.gas, fees, head),
              );
              logger.warn(
                {
                  batchId,
                  nonce: attempt.nonce,
                  txHash: attempt.txHash,
                  replaces: latest.txHash,
                  maxFeePerGas: fees.maxFeePerGas.toString(),
                  maxPriorityFeePerGas: fees.maxPriorityFeePerGas.toString(),
                },
                "settlement transaction not mined in time; replacing it with higher fees",
              );
              broadcastThisCall = true;
              if ((await send(batchId, attempt, head)) === "insufficient_funds") return unfunded();
              continue;
            }
          }
          if (!broadcastThisCall) {
            // Stored but perhaps never sent (a crash between store and broadcast, a failed
            // broadcast), or sent by a flusher that died: the same signed bytes again, which the
            // chain takes at most once.
            broadcastThisCall = true;
            if ((await send(batchId, latest, head)) === "insufficient_funds") return unfunded();
            continue;
          }
        }
      }
      if (Date.now() >= deadline || signal?.aborted === true) {
        const latest = attempts[attempts.length - 1]!;
        return report(batchId, charges, "submitted", { txHash: latest.txHash });
      }
      await sleep(deps.pollMs, undefined, { signal }).catch(() => undefined);
    }
  }

  /**
   * Batches from one read of the queue: its charges aggregated per (permit, offer), each pair in
   * one batch, as many pairs per batch as simulate under the gas bound.
   */
  async function* plan(
    options: FlushOptions,
    limit: number,
  ): AsyncGenerator<Prepared & { batchId: Hex }> {
    const pending = await store.pendingCharges({ limit, permits: options.permits });
    let entries = aggregateCharges(pending);
    const maxEntries = entriesUnder(deps.maxBatchGas);
    while (entries.length > 0) {
      const batchId = newBatchId();
      const prepared = await prepare(batchId, entries.slice(0, maxEntries));
      const taken = new Set([...prepared.good, ...prepared.badEntries]);
      entries = entries.filter((e) => !taken.has(e));
      yield { batchId, ...prepared };
    }
  }

  const unsettleableReport = (mark: UnsettleableMark): UnsettleableReport => ({
    permitId: mark.permitId,
    offerId: mark.offerId,
    requests: mark.requestIds.length,
    credits: mark.credits,
    reason: mark.reason,
  });

  async function flushLeased(options: FlushOptions): Promise<FlushResult> {
    const deadline = Date.now() + deps.waitMs;
    const batches: BatchReport[] = [];
    const unsettleable: UnsettleableReport[] = [];
    for (const batch of await store.inFlight(account)) {
      const outcome = await drive(batch, deadline, options.signal);
      batches.push(outcome);
      if (outcome.status !== "settled") return summary(batches, unsettleable);
    }
    let remaining = options.maxRequests ?? Number.POSITIVE_INFINITY;
    // maxRequests 0: only drive what is in flight (recovery after a restart).
    reading: while (remaining > 0 && Date.now() < deadline && options.signal?.aborted !== true) {
      let planned = false;
      for await (const { batchId, good, bad, calldata, gas } of plan(
        options,
        Math.min(remaining, selectLimit),
      )) {
        planned = true;
        if (bad.length > 0) {
          await store.markUnsettleable(account, holder, bad);
          for (const mark of bad) {
            const reported = unsettleableReport(mark);
            unsettleable.push(reported);
            logger.warn(
              { ...reported, credits: reported.credits.toString() },
              "charges cannot settle on chain; marked unsettleable",
            );
          }
        }
        if (calldata === undefined || good.length === 0) continue;
        const fees = await cappedMarketFees(batchId);
        const head = await chain.head();
        const gasLimit = (gas * 125n) / 100n + 20_000n;
        await store.storeBatch(
          {
            account,
            holder,
            batchId,
            charges: good,
            calldata,
            chainNonce: await chain.minedNonce(),
            now: clock(),
          },
          signer(calldata, gasLimit, fees, head),
        );
        const outcome = await drive(
          { batchId, calldata, charges: good, status: "pending" },
          deadline,
          options.signal,
        );
        batches.push(outcome);
        remaining -= outcome.requests;
        // Still in flight: one transaction per account. Failed: its charges are unsettled
        // again, and the next flush simulates them afresh (never a loop of reverting batches).
        if (outcome.status !== "settled" || Date.now() >= deadline) break reading;
      }
      if (!planned) break;
    }
    return summary(batches, unsettleable);
  }

  async function dryRun(options: FlushOptions): Promise<FlushResult> {
    const batches: BatchReport[] = [];
    const unsettleable: UnsettleableReport[] = [];
    const limit = Math.min(options.maxRequests ?? selectLimit, selectLimit);
    for await (const { batchId, good, bad, gas } of plan(options, limit)) {
      unsettleable.push(...bad.map(unsettleableReport));
      if (good.length > 0) batches.push(report(batchId, good, "dry_run", { gas }));
    }
    return { batches, settledRequests: 0, settledCredits: 0n, unsettleable, busy: false };
  }

  function summary(batches: BatchReport[], unsettleable: UnsettleableReport[]): FlushResult {
    const settled = batches.filter((b) => b.status === "settled");
    return {
      batches,
      settledRequests: settled.reduce((n, b) => n + b.requests, 0),
      settledCredits: settled.reduce((sum, b) => sum + b.credits, 0n),
      unsettleable,
      busy: false,
    };
  }

  async function flush(options: FlushOptions = {}): Promise<FlushResult> {
    if (options.dryRun === true) return dryRun(options);
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
      const result = await flushLeased(options);
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

  return {
    account,
    flush,
    async settleClosing(signal) {
      const closing = await store.closingPermitsWithCharges();
      if (closing.length === 0) return undefined;
      const now = clock();
      const margin = deps.closeMarginSeconds ?? 0;
      for (const permit of closing) {
        if (now >= permit.closableAt - margin) {
          logger.error(
            { permitId: permit.permitId, closableAt: permit.closableAt, now },
            "a closing permit still has unsettled charges inside the close margin",
          );
        }
      }
      return flush({ permits: closing.map((c) => c.permitId), signal });
    },
  };
}

export interface PermitReconciliation {
  readonly permitId: Hex;
  readonly gatewaySettled: bigint;
  readonly ledgerSettled: bigint;
  readonly chainSettled: bigint;
  readonly unsettleable: bigint;
  readonly drift: boolean;
}

export interface OfferReconciliation {
  readonly offerId: Hex;
  readonly gatewayPaid: bigint;
  readonly chainPaid: bigint;
  readonly drift: boolean;
}

export interface Reconciliation {
  readonly account: Hex;
  readonly permits: PermitReconciliation[];
  readonly offers: OfferReconciliation[];
  readonly drift: boolean;
}

/**
 * Compares the gateway's settled sums with the chain's: per permit, the settled requests' sum,
 * the permit ledger's settled amount and the chain's `settled` must be one number; per offer,
 * the settled requests' sum and what the chain's `ChargeSettled` events paid it. A permit or
 * offer known to only one side counts with zero on the other.
 */
export function reconcile(input: {
  account: Hex;
  gateway: {
    permits: readonly {
      permitId: Hex;
      settled: bigint;
      unsettleable: bigint;
      ledgerSettled: bigint;
    }[];
    offers: readonly { offerId: Hex; settled: bigint }[];
  };
  chainPermits: ReadonlyMap<Hex, bigint>;
  chainOffers: ReadonlyMap<Hex, bigint>;
}): Reconciliation {
  const permitIds = new Set<Hex>([
    ...input.gateway.permits.map((p) => p.permitId),
    ...input.chainPermits.keys(),
  ]);
  const byPermit = new Map(input.gateway.permits.map((p) => [p.permitId, p]));
  const permits = [...permitIds].sort().map((permitId): PermitReconciliation => {
    const g = byPermit.get(permitId);
    const gatewaySettled = g?.settled ?? 0n;
    const ledgerSettled = g?.ledgerSettled ?? 0n;
    const chainSettled = input.chainPermits.get(permitId) ?? 0n;
    return {
      permitId,
      gatewaySettled,
      ledgerSettled,
      chainSettled,
      unsettleable: g?.unsettleable ?? 0n,
      drift: gatewaySettled !== chainSettled || ledgerSettled !== chainSettled,
    };
  });
  const offerIds = new Set<Hex>([
    ...input.gateway.offers.map((o) => o.offerId),
    ...input.chainOffers.keys(),
  ]);
  const byOffer = new Map(input.gateway.offers.map((o) => [o.offerId, o.settled]));
  const offers = [...offerIds].sort().map((offerId): OfferReconciliation => {
    const gatewayPaid = byOffer.get(offerId) ?? 0n;
    const chainPaid = input.chainOffers.get(offerId) ?? 0n;
    return { offerId, gatewayPaid, chainPaid, drift: gatewayPaid !== chainPaid };
  });
  return {
    account: input.account,
    permits,
    offers,
    drift: permits.some((p) => p.drift) || offers.some((o) => o.drift),
  };
}
