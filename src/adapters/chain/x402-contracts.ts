/**
 * The chain side of x402 `upto` payments: the two contracts an `@x402/evm` client signs for
 * (Permit2 and the upto proxy, at their canonical addresses), placed on a local anvil chain, and
 * the Market's `X402Payment` built from a client's payload.
 */
import { PERMIT2_ADDRESS, x402UptoPermit2ProxyAddress, type UptoPermit2Payload } from "@x402/evm";
import {
  encodeAbiParameters,
  getAddress,
  hashDomain,
  keccak256,
  stringToHex,
  type Address,
  type Hex,
  type PublicClient,
  type TestClient,
} from "viem";
import { BaseError } from "../../domain/base-error.js";
import {
  permit2Abi,
  permit2Bytecode,
  x402UptoPermit2ProxyAbi,
  x402UptoPermit2ProxyBytecode,
} from "../../../gen/contracts/artifacts.js";
import type { DeployerWallet } from "./deploy.js";

/** Uniswap's Permit2, at the same address on every chain. */
export const permit2Address: Address = PERMIT2_ADDRESS;
/** x402's canonical `upto` Permit2 proxy: the spender `@x402/evm` upto clients sign for. */
export const x402UptoProxyAddress: Address = x402UptoPermit2ProxyAddress;

export class X402PlacementError extends BaseError {
  readonly reason = "x402_placement_failed";
  override readonly name = "X402PlacementError";
}

export interface PlaceX402ContractsOptions {
  readonly publicClient: PublicClient;
  /** Sends the two deployments (any funded account). */
  readonly wallet: DeployerWallet;
  /** An anvil test client on the same node: `anvil_setCode` and `anvil_setChainId`. */
  readonly testClient: TestClient<"anvil">;
}

export interface PlacedX402Contracts {
  readonly permit2: Address;
  readonly uptoProxy: Address;
  /** False where the address already held code (nothing was deployed for it). */
  readonly placedPermit2: boolean;
  readonly placedUptoProxy: boolean;
}

/** Permit2's EIP-712 domain separator on `chainId` at its canonical address. */
export function permit2DomainSeparator(chainId: number): Hex {
  return hashDomain({
    domain: { name: "Permit2", chainId: BigInt(chainId), verifyingContract: permit2Address },
    types: {
      EIP712Domain: [
        { name: "name", type: "string" },
        { name: "chainId", type: "uint256" },
        { name: "verifyingContract", type: "address" },
      ],
    },
  });
}

/**
 * Places Permit2 and an upto proxy compatible with x402's at their canonical addresses on an
 * anvil chain; skips an address that already holds code. Permit2 caches its domain separator
 * (with its own address) for the chain id it was deployed on and recomputes it with
 * `address(this)` on any other, so it is deployed while the node claims another chain id and its
 * runtime copied to the canonical address; the proxy's runtime (its immutable `PERMIT2`
 * included) is copied as it is. Afterwards Permit2's `DOMAIN_SEPARATOR()` is checked against
 * the one a client signs with, and the proxy's `PERMIT2()` against Permit2's address.
 */
export async function placeX402Contracts(
  opts: PlaceX402ContractsOptions,
): Promise<PlacedX402Contracts> {
  const { publicClient, testClient } = opts;
  const chainId = await publicClient.getChainId();
  const placedPermit2 = !(await hasCode(publicClient, permit2Address));
  if (placedPermit2) {
    const runtime = await deployElsewhere(opts, chainId === 1 ? 2 : 1);
    await testClient.setCode({ address: permit2Address, bytecode: runtime });
  }
  const separator = await publicClient.readContract({
    address: permit2Address,
    abi: permit2Abi,
    functionName: "DOMAIN_SEPARATOR",
  });
  if (separator !== permit2DomainSeparator(chainId)) {
    throw new X402PlacementError(
      `Permit2 at ${permit2Address} has domain separator ${separator}, not chain ${chainId}'s`,
    );
  }

  const placedUptoProxy = !(await hasCode(publicClient, x402UptoProxyAddress));
  if (placedUptoProxy) {
    const hash = await opts.wallet.deployContract({
      abi: x402UptoPermit2ProxyAbi,
      bytecode: x402UptoPermit2ProxyBytecode,
      args: [permit2Address],
    });
    const address = await deployed(publicClient, hash);
    await testClient.setCode({
      address: x402UptoProxyAddress,
      bytecode: await runtimeOf(publicClient, address),
    });
  }
  const proxyPermit2 = await publicClient.readContract({
    address: x402UptoProxyAddress,
    abi: x402UptoPermit2ProxyAbi,
    functionName: "PERMIT2",
  });
  if (getAddress(proxyPermit2) !== getAddress(permit2Address)) {
    throw new X402PlacementError(`the upto proxy's PERMIT2 is ${proxyPermit2}`);
  }
  return {
    permit2: permit2Address,
    uptoProxy: x402UptoProxyAddress,
    placedPermit2,
    placedUptoProxy,
  };
}

async function hasCode(publicClient: PublicClient, address: Address): Promise<boolean> {
  const code = await publicClient.getCode({ address });
  return code !== undefined && code !== "0x";
}

async function runtimeOf(publicClient: PublicClient, address: Address): Promise<Hex> {
  const code = await publicClient.getCode({ address });
  if (code === undefined || code === "0x") {
    throw new X402PlacementError(`no code at ${address} after its deployment`);
  }
  return code;
}

/** Deploys Permit2 while the node claims `tempChainId`; returns its runtime code. */
async function deployElsewhere(opts: PlaceX402ContractsOptions, tempChainId: number): Promise<Hex> {
  const chainId = await opts.publicClient.getChainId();
  await setChainId(opts.testClient, tempChainId);
  try {
    // `chain: null`: sign for the id the node reports, not the wallet's own chain.
    const hash = await opts.wallet.deployContract({
      abi: permit2Abi,
      bytecode: permit2Bytecode,
      chain: null,
    });
    return await runtimeOf(opts.publicClient, await deployed(opts.publicClient, hash));
  } finally {
    await setChainId(opts.testClient, chainId);
  }
}

/** Waits for a deployment; returns the new contract's address. */
async function deployed(publicClient: PublicClient, hash: Hex): Promise<Address> {
  const receipt = await publicClient.waitForTransactionReceipt({ hash });
  if (receipt.status !== "success" || !receipt.contractAddress) {
    throw new X402PlacementError(`deployment ${hash} failed (status ${receipt.status})`);
  }
  return receipt.contractAddress;
}

type RawRequest = (args: { method: string; params: unknown[] }) => Promise<unknown>;

async function setChainId(testClient: TestClient<"anvil">, chainId: number): Promise<void> {
  // viem's test actions have no anvil_setChainId; the node has.
  await (testClient.request as unknown as RawRequest)({
    method: "anvil_setChainId",
    params: [chainId],
  });
}

// ------------------------------------------------------------------ Market payments

const x402IdTag = keccak256(stringToHex("x402-upto"));

/** The Market's record id of an x402 payment: `keccak256(abi.encode(keccak256("x402-upto"), owner, nonce))`. */
export function x402PermitId(owner: Address, nonce: bigint): Hex {
  return keccak256(
    encodeAbiParameters(
      [{ type: "bytes32" }, { type: "address" }, { type: "uint256" }],
      [x402IdTag, owner, nonce],
    ),
  );
}

/** One entry of `Market.settleWithPayments(batchId, charges, payments)`. */
export interface X402Payment {
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly amount: bigint;
  readonly permit: {
    readonly permitted: { readonly token: Address; readonly amount: bigint };
    readonly nonce: bigint;
    readonly deadline: bigint;
  };
  readonly owner: Address;
  readonly witness: {
    readonly to: Address;
    readonly facilitator: Address;
    readonly validAfter: bigint;
  };
  readonly signature: Hex;
}

/** The Market's settlement entry for an `@x402/evm` upto payload, charging `amount` to `offerId`. */
export function x402PaymentFromPayload(
  payload: UptoPermit2Payload,
  charge: { offerId: Hex; amount: bigint },
): X402Payment {
  const auth = payload.permit2Authorization;
  const owner = getAddress(auth.from);
  const nonce = BigInt(auth.nonce);
  return {
    permitId: x402PermitId(owner, nonce),
    offerId: charge.offerId,
    amount: charge.amount,
    permit: {
      permitted: { token: getAddress(auth.permitted.token), amount: BigInt(auth.permitted.amount) },
      nonce,
      deadline: BigInt(auth.deadline),
    },
    owner,
    witness: {
      to: getAddress(auth.witness.to),
      facilitator: getAddress(auth.witness.facilitator),
      validAfter: BigInt(auth.witness.validAfter),
    },
    signature: payload.signature,
  };
}
