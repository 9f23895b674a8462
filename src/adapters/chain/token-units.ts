import {
  BaseError as ViemError,
  ContractFunctionExecutionError,
  ContractFunctionRevertedError,
  ContractFunctionZeroDataError,
  HttpRequestError,
  RpcRequestError,
  SocketClosedError,
  TimeoutError,
  WebSocketRequestError,
  hexToBytes,
  type Address,
  type Hex,
  type PublicClient,
} from "viem";
import { tokenDecimals, tokenSymbol, type TokenUnits } from "../../domain/token-units.js";

// `decimals()` as any uint256 and `symbol()` as raw bytes (same ABI encoding as `string`): the
// contract is anyone's, so its answer is read as it is and judged here, not by viem's decoder
// (which would throw on a uint8 out of range, or turn invalid UTF-8 into U+FFFD).
const rawTokenAbi = [
  {
    type: "function",
    name: "decimals",
    stateMutability: "view",
    inputs: [],
    outputs: [{ name: "", type: "uint256" }],
  },
  {
    type: "function",
    name: "symbol",
    stateMutability: "view",
    inputs: [],
    outputs: [{ name: "", type: "bytes" }],
  },
] as const;

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Whether a read failed because of the contract's answer (none, a revert, bytes that decode to
 * nothing: viem has a dozen decoding errors, some not exported) rather than the transport.
 */
function unanswered(error: unknown): boolean {
  if (!(error instanceof ViemError)) return false;
  if (
    error.walk(
      (e) =>
        e instanceof ContractFunctionRevertedError || e instanceof ContractFunctionZeroDataError,
    ) !== null
  )
    return true;
  const transport = error.walk(
    (e) =>
      e instanceof HttpRequestError ||
      e instanceof RpcRequestError ||
      e instanceof TimeoutError ||
      e instanceof WebSocketRequestError ||
      e instanceof SocketClosedError,
  );
  return error instanceof ContractFunctionExecutionError && transport === null;
}

async function answer<T>(read: () => Promise<T>): Promise<T | undefined> {
  try {
    return await read();
  } catch (error) {
    // A failing RPC is not the token's answer: thrown, so the caller retries later.
    if (unanswered(error)) return undefined;
    throw error;
  }
}

function decodeSymbol(bytes: Hex | undefined): string | undefined {
  if (bytes === undefined) return undefined;
  try {
    return tokenSymbol(utf8.decode(hexToBytes(bytes)));
  } catch {
    return undefined;
  }
}

/**
 * A credit token's decimals and symbol as its contract answers them (ERC-20's optional
 * `decimals()` and `symbol()`), each kept only when safe to show ({@link tokenDecimals},
 * {@link tokenSymbol}) and undefined when the token does not answer: amounts of such a token are
 * shown in base units. A transport failure throws.
 */
export async function readTokenUnits(
  client: PublicClient,
  token: Address,
  blockNumber?: bigint,
): Promise<TokenUnits> {
  const at = blockNumber === undefined ? {} : { blockNumber };
  const [decimals, symbol] = await Promise.all([
    answer(() =>
      client.readContract({ address: token, abi: rawTokenAbi, functionName: "decimals", ...at }),
    ),
    answer(() =>
      client.readContract({ address: token, abi: rawTokenAbi, functionName: "symbol", ...at }),
    ),
  ]);
  return { decimals: tokenDecimals(decimals), symbol: decodeSymbol(symbol) };
}
