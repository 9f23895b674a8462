/** Signing an attempt, and broadcasting one with what the node answered recorded. */
import type { Hex } from "viem";
import type { Flusher } from "./context.js";
import type { Fees, SettlementAttempt, Sign } from "./types.js";

export const signer =
  (f: Flusher, data: Hex, gas: bigint, fees: Fees, headBlock: bigint): Sign =>
  async (nonce) => {
    const signed = await f.chain.sign({ nonce, gas, data, ...fees });
    return { txHash: signed.txHash, raw: signed.raw, nonce, gas, headBlock, ...fees };
  };

export const insufficientFundsError =
  "insufficient_funds: the settlement account cannot pay for the transaction's gas";

/**
 * Broadcasts `attempt` and records what the node said: taken (sent or already known), the
 * attempt's `sentBlock` and the batch `submitted`; refused for want of funds, an error line and
 * the metric. A failure to reach the node throws (the attempt stays unsent: re-sent as it is).
 */
export async function send(f: Flusher, batchId: Hex, attempt: SettlementAttempt, head: bigint) {
  const outcome = await f.chain.broadcast(attempt.raw);
  if (outcome === "sent" || outcome === "known") {
    await f.store.markSent(batchId, attempt.txHash, head);
  } else if (outcome === "insufficient_funds") {
    f.deps.observer?.insufficientFunds();
    f.logger.error(
      {
        batchId,
        account: f.account,
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
