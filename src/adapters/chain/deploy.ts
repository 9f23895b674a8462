import type { Account, Address, Chain, Hash, PublicClient, Transport, WalletClient } from "viem";
import { BaseError } from "../../domain/base-error.js";
import {
  creditTokenAbi,
  creditTokenBytecode,
  erc1271WalletAbi,
  erc1271WalletBytecode,
  marketAbi,
  marketBytecode,
} from "../../../gen/contracts/artifacts.js";

/** A wallet client that can send transactions on its own: it has an account and a chain. */
export type DeployerWallet = WalletClient<Transport, Chain, Account>;

export class DeployError extends BaseError {
  readonly reason = "deploy_failed";
  override readonly name = "DeployError";
}

/**
 * Waits for a deployment and returns the new contract's address. Throws when the transaction
 * reverted, so a caller never goes on with an address that holds no code.
 */
async function deployedAddress(
  publicClient: PublicClient,
  hash: Hash,
  contractName: string,
): Promise<Address> {
  const receipt = await publicClient.waitForTransactionReceipt({ hash });
  if (receipt.status !== "success" || !receipt.contractAddress) {
    throw new DeployError(`${contractName} deployment ${hash} failed (status ${receipt.status})`);
  }
  return receipt.contractAddress;
}

/** Deploys the market; the wallet's account becomes its owner. */
export async function deployMarket(
  wallet: DeployerWallet,
  publicClient: PublicClient,
  opts: { settlementOperator: Address; closeGracePeriod: bigint | number },
): Promise<Address> {
  const hash = await wallet.deployContract({
    abi: marketAbi,
    bytecode: marketBytecode,
    args: [opts.settlementOperator, BigInt(opts.closeGracePeriod)],
  });
  return deployedAddress(publicClient, hash, "Market");
}

/** Deploys a model's ERC-20 credit token; only `owner` can mint. */
export async function deployCreditToken(
  wallet: DeployerWallet,
  publicClient: PublicClient,
  opts: { name: string; symbol: string; owner: Address },
): Promise<Address> {
  const hash = await wallet.deployContract({
    abi: creditTokenAbi,
    bytecode: creditTokenBytecode,
    args: [opts.name, opts.symbol, opts.owner],
  });
  return deployedAddress(publicClient, hash, "CreditToken");
}

/** Deploys the test contract wallet whose ERC-1271 signatures are `owner`'s ECDSA signatures. */
export async function deployErc1271Wallet(
  wallet: DeployerWallet,
  publicClient: PublicClient,
  opts: { owner: Address },
): Promise<Address> {
  const hash = await wallet.deployContract({
    abi: erc1271WalletAbi,
    bytecode: erc1271WalletBytecode,
    args: [opts.owner],
  });
  return deployedAddress(publicClient, hash, "ERC1271Wallet");
}
