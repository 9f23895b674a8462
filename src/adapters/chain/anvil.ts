import { spawn, type ChildProcess } from "node:child_process";
import { BaseError } from "../../domain/base-error.js";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { toHex, type Address, type Hex } from "viem";
import { mnemonicToAccount } from "viem/accounts";

/** The mnemonic anvil derives its prefunded dev accounts from. */
export const anvilMnemonic = "test test test test test test test test test test test junk";

export interface AnvilAccount {
  address: Address;
  privateKey: Hex;
}

export interface StartAnvilOptions {
  /** Defaults to 31337, anvil's own default. */
  chainId?: number;
  /** Seconds between mined blocks; absent: a block per transaction (automine). */
  blockTime?: number;
  /** Extra command-line arguments, appended as given. */
  args?: string[];
}

export interface AnvilInstance {
  rpcUrl: string;
  chainId: number;
  pid: number;
  /** The first 10 prefunded accounts (10,000 ETH each), in anvil's order. */
  accounts: AnvilAccount[];
  /** Stops the node (SIGTERM, SIGKILL after 2 s); resolves once it has exited. Idempotent. */
  stop(): Promise<void>;
}

export class AnvilError extends BaseError {
  readonly reason = "anvil_failed";
  override readonly name = "AnvilError";
}

const startTimeoutMs = 20_000;
const killGraceMs = 2_000;
const listeningPattern = /Listening on 127\.0\.0\.1:(\d+)/;

const binaryPackages: Partial<Record<string, string>> = {
  "linux-x64": "anvil-linux-amd64",
  "linux-arm64": "anvil-linux-arm64",
  "darwin-x64": "anvil-darwin-amd64",
  "darwin-arm64": "anvil-darwin-arm64",
  "win32-x64": "anvil-win32-amd64",
};

/**
 * Path of the platform's anvil binary from the `@foundry-rs/anvil-*` optional dependency.
 * We run the binary directly rather than the `anvil` npm shim so the PID we hold is anvil's own
 * and a signal to it actually stops the node.
 */
export function anvilBinaryPath(): string {
  const key = `${process.platform}-${process.arch}`;
  const pkg = binaryPackages[key];
  if (!pkg) throw new AnvilError(`anvil has no npm binary for ${key}`);
  let pkgJson: string;
  try {
    pkgJson = createRequire(import.meta.url).resolve(`@foundry-rs/${pkg}/package.json`);
  } catch (cause) {
    // Only the linux-x64 binary is a dependency (the registry this project is built against
    // carries no other platform's); elsewhere install yours: npm install --no-save @foundry-rs/${pkg}
    throw new AnvilError(
      `@foundry-rs/${pkg} is not installed: run 'npm install --no-save @foundry-rs/${pkg}'`,
      { cause },
    );
  }
  const bin = join(dirname(pkgJson), "bin", process.platform === "win32" ? "anvil.exe" : "anvil");
  if (!existsSync(bin)) throw new AnvilError(`anvil binary missing at ${bin}`);
  return bin;
}

let cachedAccounts: AnvilAccount[] | undefined;

/** anvil's default accounts; derived once per process (BIP-39 seed derivation is slow). */
export function anvilAccounts(): AnvilAccount[] {
  cachedAccounts ??= Array.from({ length: 10 }, (_, addressIndex) => {
    const account = mnemonicToAccount(anvilMnemonic, { addressIndex });
    const privateKey = account.getHdKey().privateKey;
    if (!privateKey) throw new AnvilError(`no private key for account ${addressIndex}`);
    return { address: account.address, privateKey: toHex(privateKey) };
  });
  return cachedAccounts.map((a) => ({ ...a }));
}

// Children still running; one 'exit' handler kills them all so no anvil outlives the process
// (tests that crash or forget stop() would otherwise leak nodes and ports).
const live = new Set<ChildProcess>();

function killAllSync(): void {
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
}

function track(child: ChildProcess): void {
  if (live.size === 0) process.on("exit", killAllSync);
  live.add(child);
}

function untrack(child: ChildProcess): void {
  if (live.delete(child) && live.size === 0) process.off("exit", killAllSync);
}

/**
 * Starts a fresh anvil on a free port of 127.0.0.1 and resolves once it accepts RPC.
 * Rejects with anvil's output if it exits early or is not listening within 20 s.
 */
export async function startAnvil(opts: StartAnvilOptions = {}): Promise<AnvilInstance> {
  const chainId = opts.chainId ?? 31337;
  const args = ["--port", "0", "--host", "127.0.0.1", "--chain-id", String(chainId)];
  if (opts.blockTime !== undefined) args.push("--block-time", String(opts.blockTime));
  args.push(...(opts.args ?? []));

  const accounts = anvilAccounts();
  const child = spawn(anvilBinaryPath(), args, { stdio: ["ignore", "pipe", "pipe"] });
  track(child);
  const exited = new Promise<void>((resolve) => {
    child.once("exit", () => {
      untrack(child);
      resolve();
    });
  });

  let output = "";
  const port = await new Promise<number>((resolve, reject) => {
    const fail = (reason: string): void => {
      cleanup();
      child.kill("SIGKILL");
      reject(new AnvilError(`anvil ${reason}\n--- anvil output ---\n${output}`));
    };
    const onData = (chunk: Buffer): void => {
      output += chunk.toString("utf8");
      const match = listeningPattern.exec(output);
      if (match?.[1]) {
        cleanup();
        resolve(Number(match[1]));
      }
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void =>
      fail(`exited before listening (code ${code}, signal ${signal})`);
    const onError = (err: Error): void => fail(`could not be started: ${err.message}`);
    const timer = setTimeout(
      () => fail(`was not listening after ${startTimeoutMs / 1000} s`),
      startTimeoutMs,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      child.stdout?.off("data", onData);
      child.stderr?.off("data", onData);
      child.off("exit", onExit);
      child.off("error", onError);
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    child.once("exit", onExit);
    child.once("error", onError);
  });

  // anvil logs every RPC call; keep draining its pipes so a full pipe never blocks the node.
  child.stdout?.resume();
  child.stderr?.resume();

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), killGraceMs);
        await exited;
        clearTimeout(timer);
      }
      untrack(child);
    })();
    return stopping;
  };

  if (child.pid === undefined) throw new AnvilError("anvil started without a pid");
  return { rpcUrl: `http://127.0.0.1:${port}`, chainId, pid: child.pid, accounts, stop };
}
