/**
 * Driving one stored batch to its end: each look at the chain is one pass of stages (settled,
 * reverted, stuck or unsent), each answering the batch's report, "look again now" or "wait".
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Hex } from "viem";
import { insufficientFundsError, send, signer } from "./broadcast.js";
import type { Flusher } from "./context.js";
import { cappedMarketFees, replacementFees } from "./fees.js";
import { report } from "./report.js";
import type { BatchCharge, BatchReport, SettlementAttempt } from "./types.js";

/** A batch to drive: stored, with at least one attempt. */
export interface DrivenBatch {
  readonly batchId: Hex;
  readonly calldata: Hex;
  readonly charges: readonly BatchCharge[];
  readonly status: "pending" | "submitted";
}

/** The state one drive of one batch carries from look to look. */
interface Drive {
  readonly f: Flusher;
  readonly batch: DrivenBatch;
  /** An attempt was broadcast by this drive (a stored one is re-sent once at most). */
  broadcastThisCall: boolean;
  /** Attempts found at the fee cap in this call (logged once, not re-priced every poll). */
  readonly atCap: Set<Hex>;
  lagLogged: boolean;
}

/** What one look at the chain saw: the batch's attempts, the block to search from, the head. */
interface Look {
  readonly attempts: readonly SettlementAttempt[];
  readonly fromBlock: bigint;
  readonly head: bigint;
}

/** The batch's end (its report), look again at once, or wait a poll (unless the deadline passed). */
type Step = BatchReport | "again" | "wait";

/**
 * Drives one stored batch until it is settled, failed, or `deadline` passes (then it stays
 * in flight for the next flush). The chain is asked first, every time.
 */
export async function drive(
  f: Flusher,
  batch: DrivenBatch,
  deadline: number,
  signal: AbortSignal | undefined,
): Promise<BatchReport> {
  const d: Drive = { f, batch, broadcastThisCall: false, atCap: new Set(), lagLogged: false };
  for (;;) {
    const attempts = await f.store.attempts(batch.batchId);
    const step = await lookAtChain(d, attempts);
    if (step === "again") continue;
    if (step !== "wait") return step;
    if (Date.now() >= deadline || signal?.aborted === true) {
      const latest = attempts[attempts.length - 1]!;
      return report(batch.batchId, batch.charges, "submitted", { txHash: latest.txHash });
    }
    await sleep(f.deps.pollMs, undefined, { signal }).catch(() => undefined);
  }
}

/** One look at the chain: settled deep enough, or what the attempts' receipts say. */
async function lookAtChain(d: Drive, attempts: readonly SettlementAttempt[]): Promise<Step> {
  const { chain } = d.f;
  const { batchId } = d.batch;
  const first = attempts[0];
  if (first === undefined) throw new Error(`settlement batch ${batchId} has no attempt`);
  const fromBlock = attempts.reduce((m, a) => (a.headBlock < m ? a.headBlock : m), first.headBlock);
  const head = await chain.head();
  const settled = await chain.batchSettled(batchId, fromBlock);
  if (settled !== undefined) {
    if (head >= settled.blockNumber + BigInt(d.f.deps.confirmations)) return confirm(d, settled);
    return "wait";
  }
  return notSettled(d, { attempts, fromBlock, head });
}

/** The batch settled, `confirmations` deep: recorded settled with its receipt's gas. */
async function confirm(d: Drive, settled: { txHash: Hex; blockNumber: bigint }): Promise<Step> {
  const { f } = d;
  const { batchId, charges } = d.batch;
  const receipt = await f.chain.receipt(settled.txHash);
  if (receipt === undefined) {
    // The node has the log but not yet the receipt (a lagging replica): ask again.
    await sleep(f.deps.pollMs);
    return "again";
  }
  const gasUsed = receipt.gasUsed;
  await f.store.markSettled(batchId, {
    txHash: settled.txHash,
    blockNumber: settled.blockNumber,
    gasUsed,
    settledAt: f.clock(),
  });
  f.deps.onSettled?.([...new Set(charges.map((c) => c.permitId))]);
  const done = report(batchId, charges, "settled", {
    txHash: settled.txHash,
    gas: gasUsed,
  });
  f.logger.info(
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

/** Not settled (as of the look's head). Did one of our attempts get mined anyway? */
async function notSettled(d: Drive, look: Look): Promise<Step> {
  const { f } = d;
  const { attempts, head } = look;
  const receipts = await Promise.all(attempts.map((a) => f.chain.receipt(a.txHash)));
  const mined = receipts.some((r) => r !== undefined);
  const succeeded = receipts.findIndex((r) => r?.status === "success");
  const reverted = receipts.findIndex(
    (r) => r?.status === "reverted" && head >= r.blockNumber + BigInt(f.deps.confirmations),
  );
  if (succeeded >= 0) {
    // One attempt succeeded, so the batch id settled, whatever the read above said (a
    // load-balanced node behind the one that answered the receipt, a reorg under way):
    // never failed, whichever other attempt reverted. Wait until the chain shows it.
    if (!d.lagLogged) {
      d.lagLogged = true;
      f.logger.warn(
        { batchId: d.batch.batchId, txHash: attempts[succeeded]!.txHash },
        "a settlement attempt succeeded but the chain does not show the batch settled yet; waiting",
      );
    }
    return "wait";
  }
  if (reverted >= 0) return fail(d, look, attempts[reverted]!.txHash, receipts[reverted]!);
  if (!mined) return unmined(d, look);
  return "wait";
}

/** An attempt reverted, `confirmations` deep, and none succeeded: failed, unless the chain says settled. */
async function fail(
  d: Drive,
  look: Look,
  txHash: Hex,
  receipt: { blockNumber: bigint; gasUsed: bigint },
): Promise<Step> {
  const { f } = d;
  const { batchId, charges } = d.batch;
  // Failing returns the charges to be batched again under a new id, which the chain
  // cannot refuse as a replay: ask it once more, now, whether this id settled.
  if ((await f.chain.batchSettled(batchId, look.fromBlock)) !== undefined) {
    f.logger.warn(
      { batchId, txHash },
      "a settlement attempt's receipt says reverted but the chain says the batch settled; not failing it",
    );
    return "again";
  }
  const error = "the settlement transaction reverted";
  if (
    await f.store.markFailed(batchId, {
      txHash,
      blockNumber: receipt.blockNumber,
      gasUsed: receipt.gasUsed,
      error,
    })
  ) {
    f.logger.error(
      { batchId, txHash, requests: report(batchId, charges, "failed").requests },
      "settlement batch reverted on chain; its charges are unsettled again and will be re-simulated",
    );
  }
  return report(batchId, charges, "failed", { txHash, gas: receipt.gasUsed, error });
}

/** No attempt is mined: its nonce taken by another transaction, stuck for its price, or unsent. */
async function unmined(d: Drive, look: Look): Promise<Step> {
  const { f } = d;
  const { attempts, head } = look;
  const latest = attempts[attempts.length - 1]!;
  const minedNonce = await f.chain.minedNonce();
  if (minedNonce > latest.nonce) return nonceTaken(d, look, latest, minedNonce);
  // Only an attempt the node took can be stuck for its price; one it never took is
  // re-sent below as it is (a failed broadcast never raises the fees).
  const sentBlock = latest.sentBlock;
  if (
    sentBlock !== undefined &&
    head >= sentBlock + BigInt(f.deps.replaceAfterBlocks) &&
    !d.atCap.has(latest.txHash)
  ) {
    const replaced = await replace(d, look, latest, minedNonce);
    if (replaced !== undefined) return replaced;
  }
  if (!d.broadcastThisCall) {
    // Stored but perhaps never sent (a crash between store and broadcast, a failed
    // broadcast), or sent by a flusher that died: the same signed bytes again, which the
    // chain takes at most once.
    return broadcast(d, latest, head);
  }
  return "wait";
}

/** The latest attempt's nonce is spent: re-sent under a new nonce if none of ours took it. */
async function nonceTaken(
  d: Drive,
  look: Look,
  latest: SettlementAttempt,
  minedNonce: number,
): Promise<Step> {
  const { f } = d;
  const { batchId, calldata } = d.batch;
  const { attempts, fromBlock, head } = look;
  // The nonce is spent, but by none of our attempts (checked again now, after reading
  // the nonce, so an attempt mined in between is not taken for a stranger's).
  const again = await Promise.all(attempts.map((a) => f.chain.receipt(a.txHash)));
  if (
    again.every((r) => r === undefined) &&
    (await f.chain.batchSettled(batchId, fromBlock)) === undefined
  ) {
    const fees = await cappedMarketFees(f, batchId);
    const attempt = await f.store.recordAttempt(
      { account: f.account, holder: f.holder, batchId, chainNonce: minedNonce, now: f.clock() },
      signer(f, calldata, latest.gas, fees, head),
    );
    f.logger.warn(
      {
        batchId,
        nonce: attempt.nonce,
        previousNonce: latest.nonce,
        txHash: attempt.txHash,
      },
      "settlement nonce taken by another transaction; re-sending the batch under a new nonce",
    );
    return broadcast(d, attempt, head);
  }
  return "again";
}

/**
 * The latest attempt was taken but not mined in time: replaced with higher fees under its
 * nonce. Undefined when the cap leaves no rise (the attempt is kept, logged once).
 */
async function replace(
  d: Drive,
  look: Look,
  latest: SettlementAttempt,
  minedNonce: number,
): Promise<Step | undefined> {
  const { f } = d;
  const { batchId, calldata } = d.batch;
  const fees = replacementFees(latest, await f.chain.fees(), f.deps.feeBumpPercent, f.deps.feeCap);
  if (fees === undefined) {
    d.atCap.add(latest.txHash);
    f.logger.warn(
      {
        batchId,
        txHash: latest.txHash,
        maxFeePerGas: latest.maxFeePerGas.toString(),
        maxPriorityFeePerGas: latest.maxPriorityFeePerGas.toString(),
      },
      "settlement transaction not mined in time, but its fees are at SETTLEMENT_MAX_FEE_PER_GAS / SETTLEMENT_MAX_PRIORITY_FEE_PER_GAS; keeping it",
    );
    return undefined;
  }
  const attempt = await f.store.recordAttempt(
    {
      account: f.account,
      holder: f.holder,
      batchId,
      nonce: latest.nonce,
      chainNonce: minedNonce,
      now: f.clock(),
    },
    signer(f, calldata, latest.gas, fees, look.head),
  );
  f.logger.warn(
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
  return broadcast(d, attempt, look.head);
}

/** Broadcasts `attempt`, then looks again; the account cannot pay: the batch stays in flight. */
async function broadcast(d: Drive, attempt: SettlementAttempt, head: bigint): Promise<Step> {
  d.broadcastThisCall = true;
  if ((await send(d.f, d.batch.batchId, attempt, head)) === "insufficient_funds") {
    return unfunded(d);
  }
  return "again";
}

/** The account cannot pay: stay in flight (nothing to wait for until it is funded). */
async function unfunded(d: Drive): Promise<BatchReport> {
  const { batchId, charges } = d.batch;
  const all = await d.f.store.attempts(batchId);
  const latest = all.at(-1);
  const status = all.some((a) => a.sentBlock !== undefined) ? "submitted" : d.batch.status;
  return report(batchId, charges, status, {
    txHash: latest?.txHash,
    error: insufficientFundsError,
  });
}
