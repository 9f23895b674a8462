import { hkdfSync } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "pino";
import {
  createSealer,
  generateEncryptionKey,
  parseEncryptionKey,
  type Sealer,
} from "../adapters/crypto/sealer.js";
import { openDatabase, type Database } from "../adapters/pg/database.js";
import { migrate } from "../adapters/pg/migrate.js";
import { isDatabaseUnavailable } from "../adapters/pg/unavailable.js";
import { settleDeployment } from "../adapters/pg/deployment.js";
import type { Config } from "../config.js";
import { recognizeDatabaseUnavailable } from "../domain/errors.js";

/** What the gateway stores, and the key that seals provider endpoints in it. */
export interface Storage {
  readonly db: Database;
  /** The database was opened here (closed at shutdown), not handed in by the caller. */
  readonly ownsDatabase: boolean;
  /** The endpoint encryption key (ENDPOINT_ENCRYPTION_KEY, else made on first start). */
  readonly key: Buffer;
  readonly sealer: Sealer;
  /** The secret registration challenges are derived from (shared by gateways sharing `key`). */
  readonly challengeSecret: Buffer;
  /** This database's gateway deployment id (GET /v1/gateway), named in payers' signatures. */
  readonly deploymentId: string;
}

/** Opens (or takes) the database and migrates it; then the endpoint key. */
export async function openStorage(
  config: Config,
  options: { logger: Logger; database?: Database; inMemoryDatabase?: boolean },
): Promise<Storage> {
  const { logger } = options;
  // The transports answer the driver's "could not ask the database" failures with 503
  // `database_unavailable` through this check; they do not know the adapter themselves.
  recognizeDatabaseUnavailable(isDatabaseUnavailable);
  const ownsDatabase = options.database === undefined;
  const db =
    options.database ??
    (await openDatabase({
      url: config.databaseUrl,
      directUrl: config.databaseDirectUrl,
      dataDir: options.inMemoryDatabase ? undefined : join(config.stateDir, "pgdata"),
      logger,
      timeouts: {
        statementMs: config.dbStatementTimeoutMs,
        queryMs: config.dbQueryTimeoutMs,
        connectMs: config.dbConnectTimeoutMs,
      },
    }));
  try {
    // The advisory lock that serializes migrations is a session's: not through a pooler.
    const { applied } = await migrate(db.session);
    if (applied.length > 0) logger.info({ applied }, "database migrated");
    const key = await endpointEncryptionKey(config, options.inMemoryDatabase === true);
    // The configuration's and the database's must agree (a restored or cloned database does not
    // answer to another environment's signatures): else the gateway does not start.
    const deployment = await settleDeployment(db.pool, config.deploymentId);
    if (deployment.warning !== undefined && config.databaseUrl !== undefined)
      logger.warn({ deployment: deployment.id }, deployment.warning);
    return {
      deploymentId: deployment.id,
      db,
      ownsDatabase,
      key,
      sealer: createSealer(key),
      // Derived, so every gateway sharing the endpoint key also shares it.
      challengeSecret: Buffer.from(
        hkdfSync("sha256", key, "", "gateway.v1 registration challenge", 32),
      ),
    };
  } catch (error) {
    if (ownsDatabase) await db.close();
    throw error;
  }
}

/**
 * The key that seals provider endpoints at rest: ENDPOINT_ENCRYPTION_KEY, else
 * (embedded database only) one made on first start and kept beside the data,
 * or a throwaway one for an in-memory database.
 */
async function endpointEncryptionKey(config: Config, inMemory: boolean): Promise<Buffer> {
  if (config.endpointEncryptionKey !== undefined)
    return parseEncryptionKey(config.endpointEncryptionKey);
  if (inMemory) return generateEncryptionKey();
  const path = join(config.stateDir, "endpoint-encryption.key");
  try {
    return parseEncryptionKey((await readFile(path, "utf8")).trim());
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
  await mkdir(config.stateDir, { recursive: true });
  const key = generateEncryptionKey();
  try {
    await writeFile(path, `${key.toString("hex")}\n`, { mode: 0o600, flag: "wx" });
    return key;
  } catch (error) {
    // Another process made it first: use theirs.
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    return parseEncryptionKey((await readFile(path, "utf8")).trim());
  }
}
