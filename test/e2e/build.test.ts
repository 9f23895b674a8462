import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  unlinkSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChild } from "../../bench/lib/processes.js";
import { startAnvil, type AnvilInstance } from "../../src/adapters/chain/anvil.js";
import { chainClients } from "../../src/adapters/chain/clients.js";
import { demoAccounts, seedDemoMarket, type DemoMarket } from "../../src/dev/demo-market.js";
import type { DevManifest } from "../../src/dev/sandbox.js";
import { auditChildLogs, auditSecret } from "../helpers/log-audit.js";
import { eventually } from "../helpers/stack.js";

/**
 * The production build (issue 21, item 1): `npm run build` makes dist/, and every production
 * process (`gateway serve` through the bin, the bench's gateway, `npm start`) runs it without a
 * development loader. test/setup/build.ts built dist/ before this file started.
 */

const root = resolve(".");
const hasProc = existsSync("/proc/self/cmdline");

/** A process's argv (node's execArgv included), from /proc. */
function argvOf(pid: number | string): string[] {
  return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").slice(0, -1);
}

/** The PIDs whose parent is `pid`, from /proc. */
function childrenOf(pid: number): string[] {
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
        return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === pid;
      } catch {
        return false; // exited meanwhile
      }
    });
}

/** What a process shows of a loader: its argv (execArgv included), its children, tsx's cache. */
function loaderTraces(pid: number, tmp: string) {
  const argv = argvOf(pid);
  // tsx transforms through esbuild's service, a child process; `serve` itself starts none.
  const children = childrenOf(pid).map(argvOf);
  // tsx caches every file it transforms under os.tmpdir()/tsx-<uid>/: with TMPDIR a fresh
  // folder of the test's, any module tsx loaded leaves a trace there.
  const tsxCache = readdirSync(tmp).filter((name) => name.startsWith("tsx"));
  return { argv, children, tsxCache };
}

function exited(child: ChildProcess): Promise<number | null> {
  return new Promise((done) => {
    if (child.exitCode !== null || child.signalCode !== null) done(child.exitCode);
    else child.once("exit", (code) => done(code));
  });
}

describe.skipIf(!hasProc)("the production build (needs Linux /proc)", () => {
  const dirs: string[] = [];
  const tempDir = (prefix: string): string => {
    const dir = mkdtempSync(join(tmpdir(), prefix));
    dirs.push(dir);
    return dir;
  };
  let anvil: AnvilInstance;
  let demo: DemoMarket;
  const operatorToken = `op_${randomBytes(16).toString("hex")}`;
  auditSecret("operator token", operatorToken);

  beforeAll(async () => {
    anvil = await startAnvil();
    const clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
    demo = await seedDemoMarket(clients, demoAccounts(anvil.accounts));
  });
  afterAll(async () => {
    await anvil?.stop();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  /** `gateway serve`'s environment: the demo market on anvil, embedded PGlite, its own TMPDIR. */
  const serveEnv = (tmp: string): NodeJS.ProcessEnv => ({
    PATH: process.env.PATH,
    TMPDIR: tmp,
    RPC_URL: anvil.rpcUrl,
    CHAIN_ID: String(anvil.chainId),
    MARKET_ADDRESS: demo.market,
    START_BLOCK: demo.deployBlock.toString(),
    CONFIRMATIONS: "0",
    SETTLEMENT_OPERATOR_TOKEN: operatorToken,
    GATEWAY_STATE_DIR: join(tmp, "state"),
    HOST: "127.0.0.1",
    PORT: "0",
    LOG_LEVEL: "info",
  });

  it("emits JavaScript with source maps as files, the migrations beside, and no tests", () => {
    const main = readFileSync("dist/src/cli/main.js", "utf8");
    expect(main.trimEnd().split("\n").at(-1)).toBe("//# sourceMappingURL=main.js.map");
    const map = JSON.parse(readFileSync("dist/src/cli/main.js.map", "utf8")) as {
      sources: string[];
    };
    // The CLI is one bundle (scripts/bundle.mjs) whose map leads back to the TypeScript.
    expect(map.sources).toContain("../../../src/cli/main.ts");
    expect(map.sources).toContain("../../../src/app.ts");
    expect(map.sources).toContain("../../../src/adapters/pg/migrate.ts");
    expect(map.sources.filter((s) => s.startsWith("../../../src/") && !s.endsWith(".ts"))).toEqual(
      [],
    );
    // Tree-shaken to what the gateway calls, not every module its dependencies export.
    expect(map.sources.some((s) => s.includes("/viem/chains/definitions/"))).toBe(false);
    expect(readdirSync("dist/src/adapters/pg/functions")).toEqual(
      readdirSync("src/adapters/pg/functions"),
    );
    expect(readdirSync("dist/src/adapters/pg/migrations")).toEqual(
      readdirSync("src/adapters/pg/migrations"),
    );
    // The market console's files are served as they are, from beside the facade's module.
    expect(readdirSync("dist/src/console", { recursive: true }).sort()).toEqual(
      readdirSync("src/console", { recursive: true }).sort(),
    );
    // Its vendor module (viem's EIP-712 recovery) is one browser module, made by the build for
    // dist/ and for the sources alike, importing nothing (the page's CSP loads only its files).
    const vendor = readFileSync("dist/src/console/vendor/eip712.js", "utf8");
    expect(readFileSync("src/console/vendor/eip712.js", "utf8")).toBe(vendor);
    expect(vendor).not.toMatch(/\bimport\s*[{*"'(]|\brequire\(/);
    expect(vendor).toMatch(/export\s*\{[^}]*recoverTypedDataSigner/);
    // Not tracked: a build output.
    expect(
      execFileSync("git", ["ls-files", "src/console/vendor"], { encoding: "utf8" }).trim(),
    ).toBe("");
    expect(existsSync("dist/src/console-vendor")).toBe(false);
    for (const entry of ["gateway.js", "child.js", "lib/setup.js", "lib/settings.js"]) {
      expect(existsSync(join("dist/bench", entry)), entry).toBe(true);
    }
    const files = readdirSync("dist", { recursive: true, encoding: "utf8" });
    expect(files.filter((f) => f.endsWith(".test.js"))).toEqual([]);
    expect(files.filter((f) => f.startsWith("test"))).toEqual([]);
    // Only the bench's entry points and what they import, not the harness.
    expect(readdirSync("dist/bench").sort()).toEqual(
      [
        "child.js",
        "child.js.map",
        "gateway.js",
        "gateway.js.LEGAL.txt",
        "gateway.js.map",
        "lib",
      ].sort(),
    );
  });

  it("the probe sees tsx when it is there: the CLI from its sources leaves tsx's cache", () => {
    const tmp = tempDir("gw-build-tsx-");
    // No command: prints the usage and exits 2, after loading every module of the CLI.
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/main.ts"], {
      env: { PATH: process.env.PATH, TMPDIR: tmp },
      stdio: "ignore",
    });
    return exited(child).then((code) => {
      expect(code).toBe(2);
      expect(readdirSync(tmp).filter((name) => name.startsWith("tsx"))).toEqual([
        `tsx-${process.getuid!()}`,
      ]);
    });
  });

  /** The URL a started `gateway serve` logs once it listens. */
  const listening = (child: ChildProcess): Promise<string> =>
    new Promise<string>((done, fail) => {
      const timer = setTimeout(() => fail(new Error("gateway serve did not listen")), 60_000);
      child.once("exit", (code) => fail(new Error(`gateway serve exited with ${code}`)));
      createInterface({ input: child.stdout! }).on("line", (line) => {
        try {
          const entry = JSON.parse(line) as { msg?: string; url?: string };
          if (entry.msg === "gateway listening" && entry.url !== undefined) {
            clearTimeout(timer);
            done(entry.url);
          }
        } catch {
          // not a log line
        }
      });
    });

  it("`gateway serve` through the bin serves the build with no loader", async () => {
    const tmp = tempDir("gw-build-serve-");
    const child = spawn(process.execPath, ["bin/gateway.js", "serve"], {
      env: serveEnv(tmp),
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditChildLogs(child, "gateway serve (bin)");
    const exit = exited(child);
    try {
      const url = await listening(child);
      const health = await fetch(`${url}/health`);
      expect(health.status).toBe(200);
      expect(await health.json()).toEqual({ status: "ok" });
      // The migrations were found beside the built modules: the database is ready.
      expect((await fetch(`${url}/ready`)).status).toBe(200);

      expect(loaderTraces(child.pid!, tmp)).toEqual({
        argv: [process.execPath, "bin/gateway.js", "serve"],
        children: [],
        tsxCache: [],
      });
    } finally {
      child.kill("SIGTERM");
      expect(await exit).toBe(0);
    }
  }, 90_000);

  it("serves the build after `npm prune --omit=dev`, as docs/operators.md shows: production needs no dev dependency", async () => {
    // A copy of the install (hard links: nothing is copied but the directory tree), pruned.
    const copy = tempDir("gw-build-pruned-");
    for (const file of ["package.json", "package-lock.json"]) {
      copyFileSync(join(root, file), join(copy, file));
    }
    execFileSync("cp", [
      "-al",
      join(root, "node_modules"),
      join(root, "dist"),
      join(root, "bin"),
      copy,
    ]);
    execFileSync("npm", ["prune", "--omit=dev", "--offline", "--no-audit", "--no-fund"], {
      cwd: copy,
      stdio: "ignore",
    });
    // What the prune took away: tsx, the test runner and the linter, at least (TypeScript stays:
    // viem names it as an optional peer).
    for (const dev of ["tsx", "vitest", "eslint"]) {
      expect(existsSync(join(copy, "node_modules", dev))).toBe(false);
    }
    const tmp = tempDir("gw-build-pruned-serve-");
    const child = spawn(process.execPath, ["bin/gateway.js", "serve"], {
      cwd: copy,
      env: serveEnv(tmp),
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditChildLogs(child, "gateway serve (pruned)");
    const exit = exited(child);
    try {
      const url = await listening(child);
      expect((await fetch(`${url}/ready`)).status).toBe(200);
      const models = await fetch(`${url}/v1/models`);
      expect(models.status).toBe(401); // served by the gateway: no key, refused
    } finally {
      child.kill("SIGTERM");
      expect(await exit).toBe(0);
    }
  }, 180_000);

  it("the bench's gateway (dist/bench/gateway.js) runs the build with no loader", async () => {
    const tmp = tempDir("gw-build-bench-");
    const gateway = await startChild(
      "gateway",
      "../dist/bench/gateway.js",
      { ...serveEnv(tmp), LOG_LEVEL: "warn" },
      60_000,
    );
    try {
      expect((await fetch(`${gateway.url}/health`)).status).toBe(200);
      expect(loaderTraces(gateway.pid, tmp)).toEqual({
        argv: [process.execPath, join(root, "dist/bench/gateway.js")],
        children: [],
        tsxCache: [],
      });
    } finally {
      await gateway.stop();
    }
    expect(gateway.exitStatus()).toBe("code 0");
  }, 90_000);

  it("dist/bench/lib/setup.js loads without a loader and exports the bench's setup and startAnvil", () => {
    const exports = execFileSync(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        "const m = await import('./dist/bench/lib/setup.js'); console.log(Object.keys(m).sort().join(' '))",
      ],
      { encoding: "utf8", env: { PATH: process.env.PATH } },
    );
    expect(exports.trim().split(" ")).toEqual([
      "authorizeBenchKey",
      "createBenchApiKey",
      "createBenchDatabase",
      "maximumCreditsPerRequest",
      "onboardOffers",
      "seedBenchMarket",
      "startAnvil",
    ]);
  });
});

/**
 * The README's two commands on a fresh clone: `npm install` (here: the checkout's node_modules,
 * linked) and `npm start`, which builds dist/ because there is none, then runs it.
 */
describe.skipIf(!hasProc || !existsSync(join(root, ".git")))("npm start on a fresh clone", () => {
  let clone: string;
  let stateDir: string;
  beforeAll(() => {
    clone = mkdtempSync(join(tmpdir(), "gw-clone-"));
    stateDir = mkdtempSync(join(tmpdir(), "gw-clone-state-"));
    // What a clone of this commit holds: tracked files and new ones not ignored (no dist/).
    const files = execFileSync("git", ["ls-files", "-z", "-co", "--exclude-standard"], {
      encoding: "utf8",
    })
      .split("\0")
      .filter((f) => f !== "" && existsSync(f));
    for (const file of files) {
      mkdirSync(dirname(join(clone, file)), { recursive: true });
      copyFileSync(file, join(clone, file));
    }
    symlinkSync(realpathSync("node_modules"), join(clone, "node_modules"));
  });
  afterAll(() => {
    for (const dir of [clone, stateDir]) rmSync(dir, { recursive: true, force: true });
  });

  it("builds dist/ and serves the demo market, with the gateway exec'd from the build", async () => {
    expect(existsSync(join(clone, "dist"))).toBe(false);
    const npm = spawn("npm", ["start", "--silent"], {
      cwd: clone,
      env: { PATH: process.env.PATH, PORT: "0", GATEWAY_STATE_DIR: stateDir, LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    auditChildLogs(npm, "npm start (fresh clone)");
    let stderr = "";
    npm.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const exit = exited(npm);
    try {
      const manifestPath = join(stateDir, "dev.json");
      await eventually(async () => existsSync(manifestPath) || npm.exitCode !== null, 150_000, 200);
      expect(npm.exitCode, stderr).toBeNull();
      const manifest = JSON.parse(readFileSync(manifestPath, "utf8")) as DevManifest;
      auditSecret("api key", manifest.apiKey);
      auditSecret("operator token", manifest.settlementOperatorToken);
      auditSecret("private key", manifest.payer.privateKey);
      expect((await fetch(`${manifest.baseUrl}/health`)).status).toBe(200);
      expect(stderr).toContain("build: dist/ is missing or older than the sources; building");
      expect(existsSync(join(clone, "dist/.build-stamp"))).toBe(true);
      expect(existsSync(join(clone, ".build.lock"))).toBe(false);
      // The console's vendor module, made for the sources too (in-process gateways serve it).
      expect(existsSync(join(clone, "src/console/vendor/eip712.js"))).toBe(true);
      expect(existsSync(join(clone, "dist/src/console/vendor/eip712.js"))).toBe(true);
      // npm's child is the build's CLI (the shell exec'd it), not a loader.
      expect(childrenOf(npm.pid!).map(argvOf)).toEqual([["node", "dist/src/cli/main.js", "dev"]]);
    } finally {
      npm.kill("SIGTERM");
      await exit;
    }
  }, 180_000);

  it("the build is stale when a source, the lockfile or a folder's listing changes", async () => {
    const builder = (await import(pathToFileURL(join(clone, "scripts/build.mjs")).href)) as {
      isStale(): boolean;
    };
    expect(builder.isStale()).toBe(false);
    const built = statSync(join(clone, "dist/.build-stamp")).mtime;
    const later = new Date(built.getTime() + 5_000);
    const earlier = new Date(built.getTime() - 60_000);

    for (const file of [
      "src/config.ts",
      "package-lock.json",
      "gen/gateway/v1/catalog_pb.ts",
      "src/console/app.js",
      "src/console/console.css",
      "src/console-vendor/eip712.ts",
    ]) {
      utimesSync(join(clone, file), later, later);
      expect(builder.isStale(), file).toBe(true);
      utimesSync(join(clone, file), earlier, earlier);
      expect(builder.isStale(), file).toBe(false);
    }
    // bench/results is the bench's output, not an input.
    utimesSync(join(clone, "bench/results"), later, later);
    expect(builder.isStale()).toBe(false);
    // The console's vendor module missing from the sources: built again.
    const vendor = join(clone, "src/console/vendor/eip712.js");
    const kept = readFileSync(vendor);
    unlinkSync(vendor);
    // Even with its folder's time put back: a missing output is stale by itself.
    utimesSync(dirname(vendor), earlier, earlier);
    expect(builder.isStale()).toBe(true);
    writeFileSync(vendor, kept);
    utimesSync(vendor, earlier, earlier);
    utimesSync(dirname(vendor), earlier, earlier);
    expect(builder.isStale()).toBe(false);
    // A deleted module changes its folder.
    unlinkSync(join(clone, "src/rest/facade.ts"));
    expect(builder.isStale()).toBe(true);
  });
});
