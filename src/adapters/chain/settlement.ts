import {
  BaseError,
  ContractFunctionRevertedError,
  decodeFunctionData,
  encodeFunctionData,
  getAbiItem,
  keccak256,
  toFunctionSelector,
  TransactionReceiptNotFoundError,
  type Address,
  type Hex,
  type PublicClient,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { GatewayError } from "../../domain/errors.js";
import { normalizeHex } from "../../domain/hex.js";
import type {
  BroadcastOutcome,
  PermitChainState,
  SettleRevert,
  SettlementChain,
} from "../../domain/settlement/index.js";
import { marketAbi } from "../../../gen/contracts/artifacts.js";
import { encodeWithPayments, paymentFailureDetail, paymentsAbi } from "./x402.js";

const settleSelector = toFunctionSelector(getAbiItem({ abi: marketAbi, name: "settle" }));
const paymentsSelectors = (["settleWithPayments", "settleWithPaymentsAndApprovals"] as const).map(
  (name) => toFunctionSelector(getAbiItem({ abi: paymentsAbi, name })),
);

export interface ChainSettlementOptions {
  readonly client: PublicClient;
  readonly chainId: number;
  readonly market: Address;
  /** The settlement operator account's key; it signs locally and is never sent anywhere. */
  readonly privateKey: Hex;
}

const permitStateNames: readonly PermitChainState[] = ["none", "open", "closing", "closed"];

function unavailable(what: string, cause: unknown): GatewayError {
  return new GatewayError("chain_unavailable", `the chain could not be asked (${what})`, { cause });
}

/** The contract's refusal inside a viem error, if the error is one (else it is the chain's own failure). */
function revertOf(error: unknown): SettleRevert | undefined {
  if (!(error instanceof BaseError)) return undefined;
  const reverted = error.walk((e) => e instanceof ContractFunctionRevertedError);
  if (!(reverted instanceof ContractFunctionRevertedError)) return undefined;
  // viem also reads a JSON-RPC "internal error" (-32603) without revert data as a revert: that
  // is the node failing, not the contract refusing, and must not make charges unsettleable.
  if (reverted.raw === undefined) return undefined;
  const name = reverted.data?.errorName ?? "Reverted";
  const args = (reverted.data?.args ?? []) as readonly unknown[];
  const revert: { -readonly [K in keyof SettleRevert]: SettleRevert[K] } = {
    name,
    message: reverted.shortMessage,
  };
  if (name === "ChargeExceedsDeposit") {
    revert.permitId = normalizeHex(args[0] as Hex);
    revert.amount = args[2] as bigint;
  } else if (name === "OfferMismatch") {
    revert.permitId = normalizeHex(args[0] as Hex);
    revert.offerId = normalizeHex(args[1] as Hex);
  } else if (name === "PaymentFailed") {
    revert.permitId = normalizeHex(args[0] as Hex);
    revert.detail = paymentFailureDetail(args[1] as Hex);
  }
  return revert;
}

/**
 * What a failed broadcast means: the node already has the transaction, its nonce is spent, its
 * fees are too low, or the account cannot pay; anything else is the chain's own failure (thrown).
 */
function refusalOf(error: unknown): BroadcastOutcome {
  const text =
    error instanceof BaseError ? `${error.shortMessage} ${error.details}` : String(error);
  if (/already known|known transaction|already imported|already exists/i.test(text)) return "known";
  if (/nonce too low|nonce.*(lower|already used)/i.test(text)) return "nonce_too_low";
  if (/underpriced|fee too low|replacement/i.test(text)) return "underpriced";
  // geth, erigon, nethermind, reth and anvil: "insufficient funds for gas * price + value".
  if (/insufficient funds|insufficient balance/i.test(text)) return "insufficient_funds";
  throw unavailable("broadcast", error);
}

/** Where `batchId` settled (its BatchSettled log), searching from `fromBlock`; undefined if it has not. */
async function batchSettled(
  client: PublicClient,
  market: Address,
  batchId: Hex,
  fromBlock: bigint,
): Promise<{ txHash: Hex; blockNumber: bigint } | undefined> {
  try {
    const settled = await client.readContract({
      address: market,
      abi: marketAbi,
      functionName: "isBatchSettled",
      args: [batchId],
    });
    if (!settled) return undefined;
    // Every attempt was signed at or after `fromBlock`, so its log cannot be older.
    const logs = await client.getContractEvents({
      address: market,
      abi: marketAbi,
      eventName: "BatchSettled",
      args: { batchId },
      fromBlock,
      toBlock: "latest",
    });
    const log = logs[0];
    if (log?.transactionHash && log.blockNumber !== null)
      return { txHash: normalizeHex(log.transactionHash), blockNumber: log.blockNumber };
    throw new Error(`batch ${batchId} is settled on chain but its BatchSettled log is missing`);
  } catch (error) {
    if (error instanceof GatewayError) throw error;
    throw unavailable("batch state", error);
  }
}

/**
 * The market's `settle` through viem, for the flusher. Transactions are signed locally and their
 * hash computed before anything is broadcast (the flusher stores both first); broadcasting the
 * same signed bytes again is harmless, so every "already known" answer counts as sent.
 */
export function createChainSettlement(options: ChainSettlementOptions): SettlementChain {
  const { client, market, chainId } = options;
  const signer = privateKeyToAccount(options.privateKey);
  const account = normalizeHex(signer.address);

  return {
    account,

    async head() {
      try {
        return await client.getBlockNumber({ cacheTime: 0 });
      } catch (error) {
        throw unavailable("block number", error);
      }
    },

    async minedNonce() {
      try {
        return await client.getTransactionCount({ address: signer.address, blockTag: "latest" });
      } catch (error) {
        throw unavailable("nonce", error);
      }
    },

    async fees() {
      try {
        const fees = await client.estimateFeesPerGas({ chain: null, type: "eip1559" });
        return { maxFeePerGas: fees.maxFeePerGas, maxPriorityFeePerGas: fees.maxPriorityFeePerGas };
      } catch (error) {
        throw unavailable("fees", error);
      }
    },

    encode(batchId, charges) {
      if (charges.some((c) => c.payment !== undefined)) return encodeWithPayments(batchId, charges);
      return encodeFunctionData({
        abi: marketAbi,
        functionName: "settle",
        args: [
          batchId,
          charges.map((c) => ({ permitId: c.permitId, offerId: c.offerId, amount: c.amount })),
        ],
      });
    },

    async simulate(calldata) {
      const settles = calldata.startsWith(settleSelector);
      if (!settles && !paymentsSelectors.some((s) => calldata.startsWith(s)))
        throw new Error(
          "settlement calldata is neither settle() nor settleWithPayments[AndApprovals]()",
        );
      try {
        const { functionName, args } = decodeFunctionData({ abi: marketAbi, data: calldata });
        const gas = await client.estimateContractGas({
          address: market,
          abi: marketAbi,
          functionName,
          args,
          account: signer.address,
        } as never);
        return { ok: true, gas };
      } catch (error) {
        const revert = revertOf(error);
        if (revert === undefined) throw unavailable("simulation", error);
        return { ok: false, revert };
      }
    },

    async sign(tx) {
      const raw = await signer.signTransaction({
        chainId,
        type: "eip1559",
        to: market,
        data: tx.data,
        nonce: tx.nonce,
        gas: tx.gas,
        maxFeePerGas: tx.maxFeePerGas,
        maxPriorityFeePerGas: tx.maxPriorityFeePerGas,
      });
      return { raw, txHash: keccak256(raw) };
    },

    async broadcast(raw): Promise<BroadcastOutcome> {
      try {
        await client.sendRawTransaction({ serializedTransaction: raw });
        return "sent";
      } catch (error) {
        return refusalOf(error);
      }
    },

    async receipt(txHash) {
      try {
        const receipt = await client.getTransactionReceipt({ hash: txHash });
        return {
          status: receipt.status,
          blockNumber: receipt.blockNumber,
          gasUsed: receipt.gasUsed,
        };
      } catch (error) {
        if (
          error instanceof BaseError &&
          error.walk((e) => e instanceof TransactionReceiptNotFoundError)
        )
          return undefined;
        throw unavailable("receipt", error);
      }
    },

    batchSettled: (batchId, fromBlock) => batchSettled(client, market, batchId, fromBlock),

    async permitState(permitId) {
      try {
        const permit = await client.readContract({
          address: market,
          abi: marketAbi,
          functionName: "getPermit",
          args: [permitId],
        });
        return permitStateNames[permit.state] ?? "none";
      } catch (error) {
        throw unavailable("permit", error);
      }
    },
  };
}

/** Per offer and per permit, what the market's ChargeSettled events paid (reconciliation). */
export async function chainSettledTotals(
  client: PublicClient,
  market: Address,
  fromBlock: bigint,
): Promise<{ offers: Map<Hex, bigint>; permits: Map<Hex, bigint> }> {
  const offers = new Map<Hex, bigint>();
  const permits = new Map<Hex, bigint>();
  const head = await client.getBlockNumber({ cacheTime: 0 });
  const step = 10_000n;
  for (let from = fromBlock; from <= head; from += step) {
    const to = from + step - 1n < head ? from + step - 1n : head;
    const logs = await client.getContractEvents({
      address: market,
      abi: marketAbi,
      eventName: "ChargeSettled",
      fromBlock: from,
      toBlock: to,
    });
    for (const log of logs) {
      const { permitId, offerId, amount } = log.args;
      if (permitId === undefined || offerId === undefined || amount === undefined) continue;
      const o = normalizeHex(offerId);
      const p = normalizeHex(permitId);
      offers.set(o, (offers.get(o) ?? 0n) + amount);
      permits.set(p, (permits.get(p) ?? 0n) + amount);
    }
  }
  return { offers, permits };
}
