import {
  createTestClient,
  http,
  keccak256,
  maxUint256,
  parseEther,
  stringToHex,
  type Address,
  type Hex,
} from "viem";
import { creditTokenAbi } from "../../gen/contracts/artifacts.js";
import { privateKeyToAccount } from "viem/accounts";
import type { ChainClients } from "../adapters/chain/clients.js";
import {
  permit2Address,
  placeX402Contracts,
  type PlacedX402Contracts,
} from "../adapters/chain/x402-contracts.js";

/**
 * Places Permit2 and the x402 upto proxy at their canonical addresses on a local anvil
 * (issue 37, item 7), so an unmodified x402 client pays the local market as it would pay one on
 * a public chain. Deployed from an account of its own (funded here), so the demo roles' nonces,
 * and every address they deploy to, stay as they were.
 */
export async function placeX402OnAnvil(
  clients: ChainClients,
  rpcUrl: string,
): Promise<PlacedX402Contracts> {
  const key = keccak256(stringToHex("model-market-gateway: x402 placement (local chains only)"));
  const account = privateKeyToAccount(key);
  const testClient = createTestClient({
    mode: "anvil",
    chain: clients.chain,
    transport: http(rpcUrl),
  });
  await testClient.setBalance({ address: account.address, value: parseEther("10") });
  return placeX402Contracts({
    publicClient: clients.publicClient,
    wallet: clients.wallet(key),
    testClient,
  });
}

/** `owner` approves Permit2 for `token`, once (an agent's one transaction before its first payment). */
export async function approvePermit2(
  clients: ChainClients,
  ownerKey: Hex,
  token: Address,
): Promise<void> {
  const hash = await clients.wallet(ownerKey).writeContract({
    address: token,
    abi: creditTokenAbi,
    functionName: "approve",
    args: [permit2Address, maxUint256],
  });
  await clients.publicClient.waitForTransactionReceipt({ hash });
}
