/** Fees of settlement transactions: the market's held to the cap, and a replacement's bump. */
import type { Hex } from "viem";
import type { Flusher } from "./context.js";
import type { Fees } from "./types.js";

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

/** The market's fees, held to the cap (logged when the cap bites: the transaction may wait). */
export async function cappedMarketFees(f: Flusher, batchId: Hex): Promise<Fees> {
  const market = await f.chain.fees();
  const fees = capFees(market, f.deps.feeCap);
  if (
    fees.maxFeePerGas !== market.maxFeePerGas ||
    fees.maxPriorityFeePerGas !== market.maxPriorityFeePerGas
  ) {
    f.logger.warn(
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
