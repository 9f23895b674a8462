import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { auditChildLogs } from "./log-audit.js";
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

export async function stopProcess(p: GatewayProcess | undefined): Promise<void> {
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
