import type { Logger } from "pino";
import { createPublicClient, http, type Hex, type PublicClient } from "viem";
import type { ModelRef } from "../domain/tokens.js";
import { createIndexer, type Indexer } from "../adapters/chain/indexer.js";
import { createChainPermitReader } from "../adapters/chain/permits.js";
import type { Database } from "../adapters/pg/database.js";
import type { Config } from "../config.js";
import { createPermitClock } from "../domain/permits.js";

/** Connects to the chain and refuses one whose id or market contract is not the configured one. */
export async function connectChain(config: Config): Promise<PublicClient> {
  const client = createPublicClient({
    transport: http(config.rpcUrl, { batch: true, retryCount: 2, timeout: config.chainTimeoutMs }),
  });
  let chainId: number;
  try {
    chainId = await client.getChainId();
  } catch (error) {
    throw new Error(`cannot reach the chain at RPC_URL: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (chainId !== config.chainId) {
    throw new Error(
      `RPC_URL serves chain ${chainId}, but CHAIN_ID is ${config.chainId}: refusing to start`,
    );
  }
  const code = await client.getCode({ address: config.marketAddress });
  if (code === undefined || code === "0x") {
    throw new Error(`no contract at MARKET_ADDRESS ${config.marketAddress} on chain ${chainId}`);
  }
  return client as PublicClient;
}

/** The permits as the chain holds them, and the clock their expiry is judged by. */
export function marketReads(config: Config, chain: PublicClient, clock: () => number) {
  return {
    permits: createChainPermitReader({
      client: chain,
      market: config.marketAddress,
      maxStalenessMs: config.permitCacheMs,
    }),
    // Permit expiry is judged by the later of our clock and the chain's latest block time, which
    // the indexer's head reads feed (no RPC per request).
    permitClock: createPermitClock(clock),
  };
}

/** What the indexer tells the rest of the gateway. */
export interface IndexerHooks {
  readonly onHead: (timestamp: number) => void;
  readonly onPermitEvent: (permitId: Hex) => void;
  readonly onCatalogChange: () => void;
  /** Models a pass wrote (their tokenizers are loaded before their offers route). */
  readonly onModelsIndexed: (models: readonly ModelRef[]) => void;
  readonly onPermitClosing: (permitIds: readonly Hex[]) => void;
}

/** The indexer, caught up once before serving (a fresh gateway does not list an empty market). */
export async function startIndexer(
  config: Config,
  deps: { chain: PublicClient; db: Database; logger: Logger; hooks: IndexerHooks },
): Promise<Indexer> {
  const { hooks, logger } = deps;
  const indexer = createIndexer({
    onHead: (head) => hooks.onHead(head.timestamp),
    onPermitEvent: hooks.onPermitEvent,
    onCatalogChange: hooks.onCatalogChange,
    onModelsIndexed: hooks.onModelsIndexed,
    onPermitClosing: hooks.onPermitClosing,
    client: deps.chain,
    market: config.marketAddress,
    pool: deps.db.pool,
    confirmations: config.confirmations,
    startBlock: config.startBlock,
    pollIntervalMs: config.pollIntervalMs,
    logger: logger.child({ component: "indexer" }),
  });
  try {
    let pass = await indexer.syncOnce();
    while (pass?.behind) pass = await indexer.syncOnce();
  } catch (error) {
    logger.warn({ err: error }, "initial indexing failed; the indexer keeps trying");
  }
  indexer.start();
  return indexer;
}
