import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import type { Hex } from "viem";
import { startAnvil, type AnvilInstance } from "../../src/adapters/chain/anvil.js";
import { chainClients, type ChainClients } from "../../src/adapters/chain/clients.js";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { startGateway, type Gateway, type StartOptions } from "../../src/app.js";
import { parseConfig, type Config } from "../../src/config.js";
import {
  demoAccounts,
  seedDemoMarket,
  type DemoAccounts,
  type DemoMarket,
} from "../../src/dev/demo-market.js";
import { createLogger, type Logger } from "../../src/runtime/logger.js";
import { authorizeKey } from "./authorize.js";
import { createTestDatabase, type TestDatabase } from "./db.js";
import { auditLog, auditSecret } from "./log-audit.js";
import { startFakeUpstream, type FakeUpstream } from "./fake-upstream.js";
import { demoChatOffer, onboard } from "./market.js";

/** Log lines a test can search (the gateway logs JSON, one object per line). */
export class LogCapture extends Writable {
  readonly lines: string[] = [];
  override _write(chunk: Buffer, _encoding: string, done: () => void): void {
    const text = chunk.toString("utf8");
    auditLog("gateway", text);
    this.lines.push(...text.split("\n").filter((l) => l !== ""));
    done();
  }
  get text(): string {
    return this.lines.join("\n");
  }
}

export interface TestStack {
  readonly anvil: AnvilInstance;
  readonly clients: ChainClients;
  readonly roles: DemoAccounts;
  readonly demo: DemoMarket;
  readonly database: TestDatabase;
  readonly config: Config;
  readonly logs: LogCapture;
  readonly logger: Logger;
  gateway: Gateway;
  readonly apiKey: string;
  readonly operatorToken: string;
  /** Stops the gateway and starts a new one on the same database and chain. */
  restart(): Promise<Gateway>;
  close(): Promise<void>;
}

/**
 * A real stack on port 0: anvil with the demo market, a fresh test database
 * (PGlite, or PostgreSQL when TEST_DATABASE_URL is set), the gateway, and an
 * API key. Logs are captured for assertions.
 */
export async function startTestStack(
  env: Record<string, string> = {},
  options: { clock?: () => number; tokens?: StartOptions["tokens"] } = {},
): Promise<TestStack> {
  const anvil = await startAnvil();
  const dir = await mkdtemp(join(tmpdir(), "gw-test-"));
  const clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
  const roles = demoAccounts(anvil.accounts);
  const demo = await seedDemoMarket(clients, roles);
  const catalogFile = join(dir, "catalog.json");
  await writeFile(catalogFile, JSON.stringify({ models: demo.catalog }));
  const operatorToken = `op_${randomBytes(16).toString("hex")}`;
  const config = parseConfig({
    RPC_URL: anvil.rpcUrl,
    CHAIN_ID: String(anvil.chainId),
    MARKET_ADDRESS: demo.market,
    START_BLOCK: demo.deployBlock.toString(),
    CONFIRMATIONS: "0",
    POLL_INTERVAL_MS: "100",
    CATALOG_FILE: catalogFile,
    SETTLEMENT_OPERATOR_TOKEN: operatorToken,
    HOST: "127.0.0.1",
    PORT: "0",
    GATEWAY_STATE_DIR: dir,
    LOG_LEVEL: "debug",
    ...env,
  });
  // The gateway is handed the test database, so the pool timeouts it would set itself are set
  // here, when a suite asks for them (the other suites keep the helper's plain pool).
  const database = await createTestDatabase(
    ["DB_STATEMENT_TIMEOUT_MS", "DB_QUERY_TIMEOUT_MS", "DB_CONNECT_TIMEOUT_MS"].some(
      (key) => key in env,
    )
      ? {
          timeouts: {
            statementMs: config.dbStatementTimeoutMs,
            queryMs: config.dbQueryTimeoutMs,
            connectMs: config.dbConnectTimeoutMs,
          },
        }
      : {},
  );
  const logs = new LogCapture();
  const logger = createLogger(config.logLevel, logs);
  const start = () =>
    startGateway(config, {
      logger,
      database: database.db,
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.tokens === undefined ? {} : { tokens: options.tokens }),
    });
  const gateway = await start();
  const apiKey = (await createApiKey(database.db.pool, "test")).key;
  auditSecret("api key", apiKey);
  // The demo payer lets the stack's key spend its permits (DESIGN.md section 8), as a payer
  // would: through the gateway's routes, with the payer's signature.
  await authorizeKey(gateway.url, apiKey, roles.payer.privateKey);
  auditSecret("operator token", operatorToken);
  auditSecret("private key", config.settlementPrivateKey);
  auditSecret("encryption key", config.endpointEncryptionKey);
  for (const account of anvil.accounts) auditSecret("private key", account.privateKey);
  const stack: TestStack = {
    anvil,
    clients,
    roles,
    demo,
    database,
    config,
    logs,
    logger,
    gateway,
    apiKey,
    operatorToken,
    async restart() {
      await stack.gateway.close();
      stack.gateway = await start();
      return stack.gateway;
    },
    async close() {
      await stack.gateway.close();
      await database.drop();
      await anvil.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
  return stack;
}

/** fetch against the gateway with the stack's API key. */
export function authed(stack: TestStack, path: string, init: RequestInit = {}): Promise<Response> {
  return fetch(`${stack.gateway.url}${path}`, {
    ...init,
    headers: {
      authorization: `Bearer ${stack.apiKey}`,
      ...(init.headers as Record<string, string>),
    },
  });
}

/** Polls `check` until it returns true or `timeoutMs` passes (for asynchronous effects like indexing). */
export async function eventually(
  check: () => Promise<boolean>,
  timeoutMs = 5000,
  stepMs = 50,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, stepMs));
  }
}

/** A response body as loosely typed JSON, for assertions. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function json(res: Response): Promise<any> {
  return res.json();
}

/**
 * A stack whose `demo-chat` offer is served by a fake upstream (registered and verified as its
 * operator would), for suites that make chat requests.
 */
export async function startChatStack(
  env: Record<string, string> = {},
  options: { clock?: () => number; chunks?: number; tokens?: StartOptions["tokens"] } = {},
): Promise<{ stack: TestStack; fake: FakeUpstream; chatOffer: Hex }> {
  const stack = await startTestStack(
    { ALLOW_PRIVATE_ENDPOINTS: "true", PROBE_INTERVAL_MS: "600000", ...env },
    {
      ...(options.clock === undefined ? {} : { clock: options.clock }),
      ...(options.tokens === undefined ? {} : { tokens: options.tokens }),
    },
  );
  try {
    const fake = await startFakeUpstream({ models: ["demo-chat"], chunks: options.chunks ?? 2 });
    const chatOffer = demoChatOffer(stack);
    await onboard(stack, chatOffer, fake.url);
    return { stack, fake, chatOffer };
  } catch (error) {
    await stack.close();
    throw error;
  }
}
