import { randomBytes } from "node:crypto";
import { mkdir, rename, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { Address, Hex } from "viem";
import type { Logger } from "pino";
import { startAnvil, type AnvilInstance } from "../adapters/chain/anvil.js";
import { chainClients } from "../adapters/chain/clients.js";
import { createApiKey } from "../adapters/pg/api-keys.js";
import { authorizeApiKey } from "../clients/permit.js";
import { startGateway, type Gateway } from "../app.js";
import { parseConfig } from "../config.js";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { registerEndpoint, verifyOffer } from "../clients/provider.js";
import { connectSettlement } from "../clients/settlement.js";
import { createSettlementWorker, type SettlementWorker } from "../runtime/settlement-worker.js";
import { demoAccounts, seedDemoMarket } from "./demo-market.js";
import { approvePermit2, placeX402OnAnvil } from "./x402-placement.js";
import { startDemoProvider, type DemoProvider } from "./demo-provider.js";

/** How often the sandbox's settlement worker flushes: short, so a demo request settles while you watch. */
const workerIntervalMs = 2000;

/** The sandbox gateway's SHUTDOWN_GRACE_MS (requests in flight at SIGTERM may finish for this long). */
export const sandboxShutdownGraceMs = 5000;

/** What `npm start` writes to `$GATEWAY_STATE_DIR/dev.json` for scripts and tests. */
export interface DevManifest {
  baseUrl: string;
  grpcUrl: string;
  apiKey: string;
  rpcUrl: string;
  chainId: number;
  marketAddress: Address;
  settlementOperatorToken: string;
  models: { id: string; modelId: Hex; creditToken: Address }[];
  offers: { offerId: Hex; modelId: Hex; status: string }[];
  payer: { address: Address; privateKey: Hex };
  operator: { address: Address; privateKey: Hex };
  permitId: Hex;
  /** What to watch settlement with: the account that settles, the worker's pace, the flush route. */
  settlement: { account: Address; workerIntervalMs: number; flushUrl: string };
  /**
   * The address that signs usage receipts (`GET /v1/gateway`'s `receipt_signer`). Its key is
   * made for this run and written nowhere.
   */
  receiptSigner: Address;
  /** The demo provider's endpoint, which the demo offers are registered with, and its token. */
  demoProvider: { url: string; endpointToken: string };
}

/** A word for a POSIX shell, as is. */
function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replaceAll("'", "'\\''")}'`;
}

/**
 * The `gateway permit open` command line that opens another permit as the demo payer, with the
 * environment it needs. The payer's key is read from the manifest when the command runs, so it
 * is not printed (the sandbox prints no private key).
 */
export function sandboxPermitOpenCommand(manifest: DevManifest, manifestPath: string): string {
  const env = [
    `RPC_URL=${manifest.rpcUrl}`,
    `CHAIN_ID=${manifest.chainId}`,
    `MARKET_ADDRESS=${manifest.marketAddress}`,
    `GATEWAY_URL=${manifest.baseUrl}`,
    `GATEWAY_API_KEY=${manifest.apiKey}`,
    `PAYER_PRIVATE_KEY=$(node -p 'require(process.argv[1]).payer.privateKey' ${shellQuote(manifestPath)})`,
  ];
  const model = manifest.models[0]?.id ?? manifest.models[0]?.modelId ?? "MODEL";
  return `${env.join(" ")} npm run gateway -- permit open ${shellQuote(model)} --deposit 10tokens`;
}

export interface Sandbox {
  readonly manifest: DevManifest;
  readonly manifestPath: string;
  readonly gateway: Gateway;
  readonly anvil: AnvilInstance;
  readonly provider: DemoProvider;
  readonly worker: SettlementWorker;
  close(): Promise<void>;
}

export interface SandboxOptions {
  readonly stateDir: string;
  readonly host?: string;
  readonly port?: number;
  readonly logger: Logger;
}

/**
 * The embedded default: a fresh anvil with the market deployed and a demo
 * market seeded, an in-memory PGlite, and the gateway on top, configured
 * exactly as production is (through the environment parser). Nothing is kept
 * between runs: every start is a clean sandbox.
 */
export async function startSandbox(options: SandboxOptions): Promise<Sandbox> {
  const { logger } = options;
  const stateDir = resolve(options.stateDir);
  await mkdir(stateDir, { recursive: true });

  const anvil = await startAnvil({ chainId: 31337 });
  let provider: DemoProvider | undefined;
  try {
    const clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
    const roles = demoAccounts(anvil.accounts);
    const demo = await seedDemoMarket(clients, roles);
    // x402 (issue 37): Permit2 and the upto proxy where every x402 client looks for them, and
    // the demo payer's one approval of Permit2, so it can pay as an agent at once.
    await placeX402OnAnvil(clients, anvil.rpcUrl);
    await approvePermit2(clients, roles.payer.privateKey, demo.models[0]!.creditToken);
    logger.info({ market: demo.market, rpcUrl: anvil.rpcUrl }, "demo market deployed");

    const catalogFile = join(stateDir, "catalog.json");
    await writeFile(catalogFile, `${JSON.stringify({ models: demo.catalog }, null, 2)}\n`);
    const settlementOperatorToken = `op_${randomBytes(24).toString("hex")}`;
    // A receipt key of this run's own: it lives only in this process (config), never on disk.
    const receiptKey = generatePrivateKey();
    const config = parseConfig({
      RPC_URL: anvil.rpcUrl,
      CHAIN_ID: String(anvil.chainId),
      MARKET_ADDRESS: demo.market,
      START_BLOCK: demo.deployBlock.toString(),
      CONFIRMATIONS: "0",
      POLL_INTERVAL_MS: "500",
      CATALOG_FILE: catalogFile,
      SETTLEMENT_OPERATOR_TOKEN: settlementOperatorToken,
      SETTLEMENT_PRIVATE_KEY: roles.settlement.privateKey,
      RECEIPT_PRIVATE_KEY: receiptKey,
      HOST: options.host ?? "127.0.0.1",
      PORT: String(options.port ?? 8080),
      GATEWAY_STATE_DIR: stateDir,
      LOG_LEVEL: logger.level,
      // The demo provider listens on loopback.
      ALLOW_PRIVATE_ENDPOINTS: "true",
      PROBE_INTERVAL_MS: "5000",
      SHUTDOWN_GRACE_MS: String(sandboxShutdownGraceMs),
    });
    const gateway = await startGateway(config, { logger, inMemoryDatabase: true });
    try {
      const apiKey = await createApiKey(gateway.db.pool, "dev");
      // The demo offers onboard exactly as a real provider would: signed challenge, then verification.
      provider = await startDemoProvider(demo.models.map((m) => m.id));
      const connection = { baseUrl: gateway.url, apiKey: apiKey.key };
      const signer = privateKeyToAccount(roles.operator.privateKey);
      for (const offer of demo.offers.filter((o) => o.status === "active")) {
        await registerEndpoint(connection, {
          offerId: offer.offerId,
          endpointUrl: provider.url,
          endpointToken: provider.token,
          signer,
          chain: { chainId: anvil.chainId, market: demo.market },
        });
        await verifyOffer(connection, offer.offerId);
      }
      logger.info(
        { offers: demo.offers.filter((o) => o.status === "active").length },
        "demo offers registered and verified",
      );
      // The demo payer lets the demo key spend its permits, as any payer would (DESIGN.md
      // section 8): the key asks for the typed data, the payer signs it.
      await authorizeApiKey(connection, {
        signer: privateKeyToAccount(roles.payer.privateKey),
        chain: { chainId: anvil.chainId, market: demo.market },
      });
      const manifest: DevManifest = {
        baseUrl: gateway.url,
        grpcUrl: gateway.url,
        apiKey: apiKey.key,
        rpcUrl: anvil.rpcUrl,
        chainId: anvil.chainId,
        marketAddress: demo.market,
        settlementOperatorToken,
        models: demo.models.map(({ id, modelId, creditToken }) => ({ id, modelId, creditToken })),
        offers: demo.offers.map(({ offerId, modelId, status }) => ({ offerId, modelId, status })),
        payer: { address: roles.payer.address, privateKey: roles.payer.privateKey },
        operator: { address: roles.operator.address, privateKey: roles.operator.privateKey },
        permitId: demo.permitId,
        settlement: {
          account: roles.settlement.address,
          workerIntervalMs,
          flushUrl: `${gateway.url}/settlements/flush`,
        },
        receiptSigner: privateKeyToAccount(receiptKey).address,
        demoProvider: { url: provider.url, endpointToken: provider.token },
      };
      const manifestPath = join(stateDir, "dev.json");
      // Write-then-rename, so a script polling for the file never reads half of it.
      await writeFile(`${manifestPath}.tmp`, `${JSON.stringify(manifest, null, 2)}\n`, {
        mode: 0o600,
      });
      await rename(`${manifestPath}.tmp`, manifestPath);
      // The worker reaches the gateway the way a separate `gateway settle` process would: gRPC
      // over the network, with the operator token.
      const worker = createSettlementWorker({
        ...connectSettlement(gateway.url),
        token: settlementOperatorToken,
        intervalMs: workerIntervalMs,
        logger,
      });
      worker.start();
      let closing: Promise<void> | undefined;
      return {
        manifest,
        manifestPath,
        gateway,
        anvil,
        provider,
        worker,
        close() {
          closing ??= (async () => {
            // Together: readiness turns at once, and a flush in flight is one of the calls the
            // gateway lets finish within its grace.
            await Promise.all([worker.stop(), gateway.close()]);
            // Then the gateway's dependencies; the anvil child process must not outlive us.
            await Promise.all([provider?.close(), anvil.stop()]);
          })();
          return closing;
        },
      };
    } catch (error) {
      await gateway.close();
      await provider?.close();
      throw error;
    }
  } catch (error) {
    await anvil.stop();
    throw error;
  }
}
