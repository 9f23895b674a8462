import {
  createPublicClient,
  createWalletClient,
  defineChain,
  http,
  type Account,
  type Chain,
  type Hex,
  type PublicClient,
  type Transport,
  type WalletClient,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";

/** A viem chain for a JSON-RPC URL whose id is known (anvil, or a configured chain). */
export function chainFor(chainId: number, rpcUrl: string): Chain {
  return defineChain({
    id: chainId,
    name: `chain-${chainId}`,
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } },
  });
}

export interface ChainClients {
  readonly chain: Chain;
  readonly publicClient: PublicClient;
  wallet(privateKey: Hex): WalletClient<Transport, Chain, Account>;
}

/** Public and wallet clients for one chain; `pollingIntervalMs` suits local chains when short. */
export function chainClients(
  chainId: number,
  rpcUrl: string,
  pollingIntervalMs = 4000,
): ChainClients {
  const chain = chainFor(chainId, rpcUrl);
  const publicClient = createPublicClient({
    chain,
    transport: http(rpcUrl),
    pollingInterval: pollingIntervalMs,
  });
  return {
    chain,
    publicClient: publicClient as PublicClient,
    wallet: (privateKey) =>
      createWalletClient({
        chain,
        account: privateKeyToAccount(privateKey),
        transport: http(rpcUrl),
        pollingInterval: pollingIntervalMs,
      }),
  };
}
