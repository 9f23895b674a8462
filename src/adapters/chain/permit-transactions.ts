import {
  BaseError as ViemError,
  ContractFunctionRevertedError,
  parseEventLogs,
  zeroAddress,
  zeroHash,
  type Account,
  type Address,
  type Chain,
  type Hex,
  type PublicClient,
  type TransactionReceipt,
  type Transport,
  type WalletClient,
} from "viem";
import { creditTokenAbi, marketAbi } from "../../../gen/contracts/artifacts.js";
import type { TokenUnits } from "../../domain/token-units.js";
import { readTokenUnits } from "./token-units.js";
import { BaseError } from "../../domain/base-error.js";

/**
 * A payer's own transactions on the market: open a permit (approving the model's credit token
 * first), request its close, finalize it. Each is simulated first, so a refusal comes back as the
 * contract's named error (never a transaction that burns gas to revert), then sent, then waited
 * for. The `permit` CLI, the dev sandbox's demo market and the tests use them.
 */

/** A payer's connection to the market: reads through `publicClient`, signs with `wallet`. */
export interface PayerChain {
  readonly publicClient: PublicClient;
  readonly wallet: WalletClient<Transport, Chain, Account>;
  readonly market: Address;
}

/**
 * The market (or the credit token) refused the call: its named error, with its arguments, and
 * a message that says what it means for the payer.
 */
export class MarketRefusedError extends BaseError {
  override readonly name = "MarketRefusedError";
  readonly reason = "market_refused";
  constructor(
    /** The contract's error name (`Unauthorized`, `GracePeriodNotOver`, ...), or `reverted`. */
    readonly errorName: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** A permit as the market stores it; `state` by name. */
export interface ChainPermit {
  readonly permitId: Hex;
  readonly payer: Address;
  readonly modelId: Hex;
  /** Zero: any offer of the model. */
  readonly offerId: Hex;
  readonly deposit: bigint;
  readonly settled: bigint;
  readonly expiresAt: bigint;
  readonly state: "open" | "closing" | "closed";
  /** Zero until the close is requested. */
  readonly closableAt: bigint;
}

const stateNames = ["open", "closing", "closed"] as const;

/** Reads a permit from the market; undefined when no permit has that id. */
export async function readChainPermit(
  publicClient: PublicClient,
  market: Address,
  permitId: Hex,
): Promise<ChainPermit | undefined> {
  const raw = await publicClient.readContract({
    address: market,
    abi: marketAbi,
    functionName: "getPermit",
    args: [permitId],
  });
  const state = stateNames[raw.state - 1];
  if (state === undefined || raw.payer === zeroAddress) return undefined;
  return {
    permitId,
    payer: raw.payer,
    modelId: raw.modelId,
    offerId: raw.offerId,
    deposit: raw.deposit,
    settled: raw.settled,
    expiresAt: raw.expiresAt,
    state,
    closableAt: raw.closableAt,
  };
}

/**
 * A model's credit token as the market names it, with the token's decimals and symbol as far as
 * they can be shown (src/domain/token-units.ts: undefined when the token does not answer, or
 * answers a value a terminal should not print).
 */
export interface ModelToken extends TokenUnits {
  readonly modelId: Hex;
  readonly creditToken: Address;
}

/** The credit token of `modelId` (read from the market, never from anyone's say-so). */
export async function readModelToken(
  publicClient: PublicClient,
  market: Address,
  modelId: Hex,
): Promise<ModelToken> {
  const model = await publicClient.readContract({
    address: market,
    abi: marketAbi,
    functionName: "getModel",
    args: [modelId],
  });
  if (model.creator === zeroAddress)
    throw new MarketRefusedError("NotFound", `no model ${modelId} on the market`);
  const units = await readTokenUnits(publicClient, model.creditToken);
  return { modelId, creditToken: model.creditToken, ...units };
}

// The token's own errors (OpenZeppelin's IERC20Errors), so a refusal from inside `openPermit`'s
// transfer decodes by name too.
const marketAndTokenAbi = [
  ...marketAbi,
  ...creditTokenAbi.filter((entry) => entry.type === "error"),
] as const;

/**
 * Simulates (as the wallet's account), sends and waits for one contract call; a refusal throws
 * {@link MarketRefusedError} with the message `explain` gives for the contract's error name.
 */
async function send(
  chain: PayerChain,
  call: {
    readonly address: Address;
    readonly abi: typeof marketAbi | typeof creditTokenAbi;
    readonly functionName: string;
    readonly args: readonly unknown[];
  },
  explain: (
    errorName: string,
    args: readonly unknown[],
  ) => string | undefined | Promise<string | undefined>,
): Promise<TransactionReceipt> {
  let request: unknown;
  try {
    ({ request } = await chain.publicClient.simulateContract({
      ...call,
      abi: call.abi === marketAbi ? marketAndTokenAbi : call.abi,
      account: chain.wallet.account,
    } as Parameters<PublicClient["simulateContract"]>[0]));
  } catch (error) {
    const reverted =
      error instanceof ViemError
        ? (error.walk(
            (e) => e instanceof ContractFunctionRevertedError,
          ) as ContractFunctionRevertedError | null)
        : null;
    if (reverted === null) throw error;
    const errorName = reverted.data?.errorName ?? "reverted";
    const args = reverted.data?.args ?? [];
    throw new MarketRefusedError(
      errorName,
      (await explain(errorName, args)) ??
        `the chain refused ${call.functionName}: ${errorName}(${args.map(String).join(", ")})`,
      { cause: error },
    );
  }
  const hash = await chain.wallet.writeContract(
    request as Parameters<typeof chain.wallet.writeContract>[0],
  );
  const receipt = await chain.publicClient.waitForTransactionReceipt({ hash });
  // The state moved between the simulation and the block (another transaction came first).
  if (receipt.status !== "success")
    throw new MarketRefusedError(
      "reverted",
      `${call.functionName} reverted in transaction ${hash}`,
    );
  return receipt;
}

/** The token's refusals, in a payer's words. */
function explainToken(errorName: string, args: readonly unknown[]): string | undefined {
  if (errorName === "ERC20InsufficientBalance")
    return `the payer holds ${String(args[1])} base units of the credit token, the deposit is ${String(args[2])}`;
  if (errorName === "ERC20InsufficientAllowance")
    return `the market may take ${String(args[1])} base units of the credit token, the deposit is ${String(args[2])}`;
  return undefined;
}

export interface OpenPermitOptions {
  /** The id the payer picks for the permit (any unused non-zero bytes32). */
  readonly permitId: Hex;
  readonly modelId: Hex;
  /** Pins the permit to one offer of the model; absent or zero: any offer. */
  readonly offerId?: Hex;
  /** Base units of the model's credit token. */
  readonly deposit: bigint;
  /** Unix seconds (chain time). */
  readonly expiresAt: bigint;
}

export interface OpenedPermit {
  readonly permitId: Hex;
  readonly payer: Address;
  readonly modelId: Hex;
  readonly offerId: Hex;
  readonly deposit: bigint;
  readonly expiresAt: bigint;
  readonly creditToken: Address;
  /** Absent when the market's allowance already covered the deposit. */
  readonly approveTx: Hex | undefined;
  readonly openTx: Hex;
}

/**
 * Approves the model's credit token for the market (only when the allowance falls short of the
 * deposit; exactly the deposit) and opens the permit. What it answers comes from the
 * `PermitOpened` event of the receipt, i.e. what the chain recorded.
 */
export async function openPermit(
  chain: PayerChain,
  options: OpenPermitOptions,
): Promise<OpenedPermit> {
  const { publicClient, market } = chain;
  const payer = chain.wallet.account.address;
  const offerId = options.offerId ?? zeroHash;
  const { creditToken } = await readModelToken(publicClient, market, options.modelId);
  // The market's own checks, read before the approval: a permit it would refuse must not cost
  // the payer an approval transaction first. The simulation below still has the last word.
  const explainOpen = (errorName: string): string | undefined => {
    switch (errorName) {
      case "AlreadyExists":
        return `a permit with id ${options.permitId} already exists`;
      case "InvalidArgument":
        return "the market refused the permit: the id must not be zero, the deposit must be above 0 and the expiry after the chain's current time";
      case "NotFound":
        return `no offer ${offerId} on the market`;
      case "OfferMismatch":
        return `offer ${offerId} does not serve model ${options.modelId}`;
      default:
        return explainToken(errorName, []);
    }
  };
  const refuse = (errorName: string): never => {
    throw new MarketRefusedError(errorName, explainOpen(errorName)!);
  };
  const [existing, head, offer] = await Promise.all([
    readChainPermit(publicClient, market, options.permitId),
    publicClient.getBlock(),
    offerId === zeroHash
      ? undefined
      : publicClient.readContract({
          address: market,
          abi: marketAbi,
          functionName: "getOffer",
          args: [offerId],
        }),
  ]);
  if (options.permitId === zeroHash || options.deposit <= 0n || options.expiresAt <= head.timestamp)
    refuse("InvalidArgument");
  if (offer !== undefined && offer.owner === zeroAddress) refuse("NotFound");
  if (offer !== undefined && offer.modelId.toLowerCase() !== options.modelId.toLowerCase())
    refuse("OfferMismatch");
  if (existing !== undefined) refuse("AlreadyExists");
  const [balance, allowance] = await Promise.all([
    publicClient.readContract({
      address: creditToken,
      abi: creditTokenAbi,
      functionName: "balanceOf",
      args: [payer],
    }),
    publicClient.readContract({
      address: creditToken,
      abi: creditTokenAbi,
      functionName: "allowance",
      args: [payer, market],
    }),
  ]);
  // Before any approval: an approval for a deposit the payer cannot make is a wasted transaction.
  if (balance < options.deposit)
    throw new MarketRefusedError(
      "ERC20InsufficientBalance",
      explainToken("ERC20InsufficientBalance", [payer, balance, options.deposit])!,
    );
  let approveTx: Hex | undefined;
  if (allowance < options.deposit) {
    const approved = await send(
      chain,
      {
        address: creditToken,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [market, options.deposit],
      },
      explainToken,
    );
    approveTx = approved.transactionHash;
  }
  const receipt = await send(
    chain,
    {
      address: market,
      abi: marketAbi,
      functionName: "openPermit",
      args: [options.permitId, options.modelId, offerId, options.deposit, options.expiresAt],
    },
    explainOpen,
  );
  const [opened] = parseEventLogs({
    abi: marketAbi,
    eventName: "PermitOpened",
    logs: receipt.logs,
  });
  if (opened === undefined)
    throw new Error(`openPermit transaction ${receipt.transactionHash} emitted no PermitOpened`);
  return {
    permitId: opened.args.permitId,
    payer: opened.args.payer,
    modelId: opened.args.modelId,
    offerId: opened.args.offerId,
    deposit: opened.args.deposit,
    expiresAt: opened.args.expiresAt,
    creditToken,
    approveTx,
    openTx: receipt.transactionHash,
  };
}

function when(seconds: bigint): string {
  return `${seconds} (${new Date(Number(seconds) * 1000).toISOString()})`;
}

/** Why a permit call was refused, said with what the chain holds for the permit. */
async function explainPermit(
  chain: PayerChain,
  permitId: Hex,
  errorName: string,
  args: readonly unknown[],
): Promise<string | undefined> {
  const permit = await readChainPermit(chain.publicClient, chain.market, permitId).catch(
    () => undefined,
  );
  switch (errorName) {
    case "NotFound":
      return `no permit ${permitId} on the market`;
    case "Unauthorized":
      return `only the permit's payer${permit === undefined ? "" : ` (${permit.payer})`} may request its close; ${chain.wallet.account.address} is not`;
    case "InvalidState":
      return permit === undefined
        ? undefined
        : permit.state === "open"
          ? `permit ${permitId} is open: request its close first (gateway permit close ${permitId})`
          : `permit ${permitId} is already ${permit.state}`;
    case "GracePeriodNotOver":
      return `the close grace period of permit ${permitId} ends at ${when(args[0] as bigint)}: finalize after it`;
    default:
      return undefined;
  }
}

/**
 * Starts the close grace period (payer only); answers when the permit becomes closable, from
 * the `PermitCloseRequested` event.
 */
export async function requestPermitClose(
  chain: PayerChain,
  permitId: Hex,
): Promise<{ readonly closableAt: bigint; readonly tx: Hex }> {
  const receipt = await send(
    chain,
    { address: chain.market, abi: marketAbi, functionName: "requestClose", args: [permitId] },
    (errorName, args) => explainPermit(chain, permitId, errorName, args),
  );
  const [requested] = parseEventLogs({
    abi: marketAbi,
    eventName: "PermitCloseRequested",
    logs: receipt.logs,
  });
  if (requested === undefined)
    throw new Error(`requestClose transaction ${receipt.transactionHash} emitted no event`);
  return { closableAt: requested.args.closableAt, tx: receipt.transactionHash };
}

/**
 * Closes a permit whose grace period is over; the market refunds `deposit - settled` to the
 * payer (whoever sends it: the refund never goes to the sender). Answers the refund from the
 * `PermitClosed` event.
 */
export async function finalizePermitClose(
  chain: PayerChain,
  permitId: Hex,
): Promise<{ readonly refund: bigint; readonly permit: ChainPermit; readonly tx: Hex }> {
  const receipt = await send(
    chain,
    { address: chain.market, abi: marketAbi, functionName: "finalizeClose", args: [permitId] },
    (errorName, args) => explainPermit(chain, permitId, errorName, args),
  );
  const [closed] = parseEventLogs({
    abi: marketAbi,
    eventName: "PermitClosed",
    logs: receipt.logs,
  });
  if (closed === undefined)
    throw new Error(`finalizeClose transaction ${receipt.transactionHash} emitted no event`);
  const permit = await readChainPermit(chain.publicClient, chain.market, permitId);
  if (permit === undefined) throw new Error(`permit ${permitId} closed but cannot be read`);
  return { refund: closed.args.refund, permit, tx: receipt.transactionHash };
}
