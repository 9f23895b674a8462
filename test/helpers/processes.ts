import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import type { DevManifest } from "../../src/dev/sandbox.js";
import { auditChildLogs, auditSecret } from "./log-audit.js";
import { settlementKey } from "./settlement.js";
import type { TestStack } from "./stack.js";

/** The stack's endpoint key, so a process can open the endpoints the stack registered. */
function endpointKey(stack: TestStack): string {
  if (stack.config.endpointEncryptionKey !== undefined) return stack.config.endpointEncryptionKey;
  const file = join(stack.config.stateDir, "endpoint-encryption.key");
  return existsSync(file) ? readFileSync(file, "utf8").trim() : randomBytes(32).toString("hex");
}

/**
 * The `gateway` CLI as production runs it: the build (test/setup/build.ts makes it fresh before
 * the run), no loader. Relative to the repository root, the cwd of every test process.
 */
export const gatewayCli: readonly string[] = ["dist/src/cli/main.js"];

/** What a finished CLI run left behind; `code` 0 when it succeeded. */
export interface CliRun {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `gateway ARGS` to its end with exactly `env` (nothing inherited). */
export async function runGatewayCli(
  args: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<CliRun> {
  try {
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [...gatewayCli, ...args],
      {
        env,
      },
    );
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** A port nothing listens on (bound, then released). */
export async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export interface GatewayProcess {
  readonly child: ChildProcess;
  readonly url: string;
  /** The environment it was started with beyond the stack's (for {@link restartProcess}). */
  readonly env?: Record<string, string>;
}

/** `gateway serve` as its own process on the stack's PostgreSQL and anvil; resolves once it listens. */
export async function serveProcess(
  stack: TestStack,
  env: Record<string, string> = {},
): Promise<GatewayProcess> {
  const child = spawn(process.execPath, [...gatewayCli, "serve"], {
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: stack.database.url!,
      ...(stack.database.directUrl === undefined
        ? {}
        : { DATABASE_DIRECT_URL: stack.database.directUrl }),
      ENDPOINT_ENCRYPTION_KEY: endpointKey(stack),
      RPC_URL: stack.config.rpcUrl,
      CHAIN_ID: String(stack.config.chainId),
      MARKET_ADDRESS: stack.config.marketAddress,
      START_BLOCK: stack.config.startBlock.toString(),
      CONFIRMATIONS: "0",
      SETTLEMENT_OPERATOR_TOKEN: stack.operatorToken,
      SETTLEMENT_PRIVATE_KEY: settlementKey,
      PROBE_INTERVAL_MS: "600000",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "info",
      ...(stack.config.catalogFile === undefined ? {} : { CATALOG_FILE: stack.config.catalogFile }),
      ALLOW_PRIVATE_ENDPOINTS: String(stack.config.allowPrivateEndpoints),
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = createInterface({ input: child.stdout! });
  // Everything the process logs goes through the log audit (test/setup/log-audit.ts).
  auditChildLogs(child, "gateway serve");
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("gateway process did not start")), 30_000);
    child.once("exit", (code) => reject(new Error(`gateway process exited with ${code}`)));
    lines.on("line", (line) => {
      try {
        const entry = JSON.parse(line) as { msg?: string; url?: string };
        if (entry.msg === "gateway listening" && entry.url !== undefined) {
          clearTimeout(timer);
          resolve(entry.url);
        }
      } catch {
        // not a log line
      }
    });
  });
  return { child, url, env };
}

export async function stopProcess(p: { readonly child: ChildProcess } | undefined): Promise<void> {
  if (p === undefined || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise((r) => p.child.once("exit", r));
  p.child.kill("SIGTERM");
  const timer = setTimeout(() => p.child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Sends `signal` (default SIGKILL: no shutdown code runs) and resolves once the process exited. */
export async function killProcess(
  p: { readonly child: ChildProcess } | undefined,
  signal: NodeJS.Signals = "SIGKILL",
): Promise<void> {
  if (p === undefined || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise((r) => p.child.once("exit", r));
  p.child.kill(signal);
  await exited;
}

/** A new `gateway serve` process with the same environment as `p` (on a new port). */
export async function restartProcess(stack: TestStack, p: GatewayProcess): Promise<GatewayProcess> {
  await killProcess(p);
  return serveProcess(stack, p.env ?? {});
}

/**
 * `gateway settle` (the settlement worker) as its own process, calling Flush on `gateway` with
 * the stack's operator token; resolves once it has started its loop.
 */
export async function settleWorkerProcess(
  stack: TestStack,
  gateway: GatewayProcess,
  env: Record<string, string> = {},
): Promise<{ readonly child: ChildProcess }> {
  const child = spawn(process.execPath, [...gatewayCli, "settle"], {
    env: {
      PATH: process.env.PATH,
      GATEWAY_URL: gateway.url,
      SETTLEMENT_OPERATOR_TOKEN: stack.operatorToken,
      LOG_LEVEL: "info",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = createInterface({ input: child.stdout! });
  auditChildLogs(child, "gateway settle");
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("settlement worker did not start")), 30_000);
    child.once("exit", (code) => reject(new Error(`settlement worker exited with ${code}`)));
    lines.on("line", (line) => {
      try {
        if ((JSON.parse(line) as { msg?: string }).msg === "settlement worker started") {
          clearTimeout(timer);
          resolve();
        }
      } catch {
        // not a log line
      }
    });
  });
  return { child };
}

/** `npm start` (`gateway dev`, the sandbox) as its own process, once its manifest is written. */
export interface DevProcess {
  readonly child: ChildProcess;
  readonly stateDir: string;
  readonly manifest: DevManifest;
}

/**
 * Starts `gateway dev` as `npm start` runs it (the build, no loader) on a free port and a fresh
 * state dir, and resolves with its manifest (dev.json); the manifest's secrets join the log audit.
 * Stop it with {@link stopDevProcess}.
 */
export async function startDevProcess(): Promise<DevProcess> {
  const stateDir = mkdtempSync(join(tmpdir(), "gateway-dev-"));
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    PORT: "0",
    GATEWAY_STATE_DIR: stateDir,
    LOG_LEVEL: "info",
  };
  const child = spawn(process.execPath, [...gatewayCli, "dev"], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  auditChildLogs(child, "gateway dev");
  const manifestPath = join(stateDir, "dev.json");
  const deadline = Date.now() + 90_000;
  while (!existsSync(manifestPath)) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(
        `gateway dev exited (${child.exitCode ?? child.signalCode}) before its manifest`,
      );
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error("gateway dev wrote no manifest within 90 s");
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const manifest = JSON.parse(readFileSync(manifestPath, "utf8")) as DevManifest;
  auditSecret("api key", manifest.apiKey);
  auditSecret("operator token", manifest.settlementOperatorToken);
  auditSecret("private key", manifest.payer.privateKey);
  auditSecret("private key", manifest.operator.privateKey);
  auditSecret("endpoint token", manifest.demoProvider.endpointToken);
  return { child, stateDir, manifest };
}

/** SIGTERM (SIGKILL after 10 s), then the state dir removed. */
export async function stopDevProcess(dev: DevProcess | undefined): Promise<void> {
  if (dev === undefined) return;
  await stopProcess(dev);
  rmSync(dev.stateDir, { recursive: true, force: true });
}
