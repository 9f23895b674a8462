import { join } from "node:path";
import { createPublicClient, http, type PublicClient } from "viem";
import type { Logger } from "pino";
import { loadCatalogFile } from "./adapters/catalog-file.js";
import { createIndexer, type Indexer } from "./adapters/chain/indexer.js";
import { findActiveApiKey } from "./adapters/pg/api-keys.js";
import { createPgCatalogStore } from "./adapters/pg/catalog.js";
import { openDatabase, type Database } from "./adapters/pg/database.js";
import { migrate } from "./adapters/pg/migrate.js";
import type { Config } from "./config.js";
import { createCatalogService } from "./connect/catalog-service.js";
import { createCatalog, ModelDirectory } from "./domain/catalog.js";
import { listen } from "./listen.js";
import type { Readiness } from "./rest/facade.js";
import { createGatewayHandler } from "./server.js";

export interface Gateway {
  readonly port: number;
  /** Base URL for REST and Connect, e.g. http://127.0.0.1:8080 */
  readonly url: string;
  readonly db: Database;
  readonly chain: PublicClient;
  readonly indexer: Indexer;
  close(): Promise<void>;
}

export interface StartOptions {
  readonly logger: Logger;
  /** Embedded PGlite only: keep data in memory instead of under the state dir. */
  readonly inMemoryDatabase?: boolean;
  /** A database opened by the caller (tests); the gateway migrates it but does not close it. */
  readonly database?: Database;
}

async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Connects to the chain and refuses one whose id or market contract is not the configured one. */
export async function connectChain(config: Config): Promise<PublicClient> {
  const client = createPublicClient({
    transport: http(config.rpcUrl, { batch: true, retryCount: 2, timeout: 10_000 }),
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

/** Config -> dependencies -> listening server. */
export async function startGateway(config: Config, options: StartOptions): Promise<Gateway> {
  const { logger } = options;
  const chain = await connectChain(config);
  const entries = config.catalogFile === undefined ? [] : await loadCatalogFile(config.catalogFile);
  const directory = new ModelDirectory(entries);

  const ownsDatabase = options.database === undefined;
  const db =
    options.database ??
    (await openDatabase({
      url: config.databaseUrl,
      dataDir: options.inMemoryDatabase ? undefined : join(config.stateDir, "pgdata"),
      logger,
    }));
  try {
    const { applied } = await migrate(db.pool);
    if (applied.length > 0) logger.info({ applied }, "database migrated");

    const indexer = createIndexer({
      client: chain,
      market: config.marketAddress,
      pool: db.pool,
      confirmations: config.confirmations,
      startBlock: config.startBlock,
      pollIntervalMs: config.pollIntervalMs,
      logger: logger.child({ component: "indexer" }),
    });
    // Catch up once before serving, so a fresh gateway does not list an empty market.
    try {
      let pass = await indexer.syncOnce();
      while (pass?.behind) pass = await indexer.syncOnce();
    } catch (error) {
      logger.warn({ err: error }, "initial indexing failed; the indexer keeps trying");
    }
    indexer.start();

    const catalog = createCatalog({ store: createPgCatalogStore(db.pool), directory });
    const readiness = async (): Promise<Readiness> => {
      const check = async (probe: () => Promise<unknown>) => {
        try {
          await withTimeout(probe(), 2000);
          return { ok: true };
        } catch (error) {
          return { ok: false, error: (error as Error).message.split("\n")[0] ?? "failed" };
        }
      };
      const [database, chainCheck] = await Promise.all([
        check(() => db.pool.query("SELECT 1")),
        check(() => chain.getBlockNumber({ cacheTime: 0 })),
      ]);
      return { ok: database.ok && chainCheck.ok, checks: { database, chain: chainCheck } };
    };

    const handler = createGatewayHandler({
      services: { catalog: createCatalogService(catalog) },
      logger,
      bodyLimitBytes: config.bodyLimitBytes,
      readiness,
      findApiKey: (key) => findActiveApiKey(db.pool, key),
      settlementOperatorToken: config.settlementOperatorToken,
    });
    const listener = await listen(handler, { host: config.host, port: config.port });
    const host = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
    const url = `http://${host.includes(":") ? `[${host}]` : host}:${listener.port}`;
    logger.info(
      { url, chainId: config.chainId, market: config.marketAddress, database: db.kind },
      "gateway listening",
    );

    let closing: Promise<void> | undefined;
    return {
      port: listener.port,
      url,
      db,
      chain,
      indexer,
      close() {
        closing ??= (async () => {
          await listener.close();
          await indexer.stop();
          if (ownsDatabase) await db.close();
        })();
        return closing;
      },
    };
  } catch (error) {
    if (ownsDatabase) await db.close();
    throw error;
  }
}
