#!/usr/bin/env node
/**
 * The production build: TypeScript -> JavaScript in dist/ (tsconfig.build.json), with source maps
 * as files and the non-TypeScript files the runtime reads by path (the SQL migrations and functions,
 * the market console's static files, the tokenizers' registry, templates and derived tables)
 * copied beside the modules that read them; then the
 * production entry points (the CLI, the bench's gateway) bundled into single files
 * (scripts/bundle.mjs), and the market console's vendor modules (src/console-vendor/, e.g. viem's
 * EIP-712 recovery) bundled into dist/src/console/vendor/. Those are also copied to
 * src/console/vendor/ (gitignored, a build output): a gateway run from the sources (the test
 * suite's in-process stacks) serves the console from src/console/ and needs them too. Plain
 * JavaScript so that building needs no loader.
 *
 *   node scripts/build.mjs             build now (`npm run build`)
 *   node scripts/build.mjs --if-stale  build only when dist/ is missing or older than its inputs
 *                                      (`npm start`, `npm run gateway`, the test suite's setup)
 *
 * Type checking is `npm run typecheck`'s job (it covers tests and scripts too); the build emits
 * with `--noCheck`, which takes a third of the time and fails only on syntax errors.
 *
 * Concurrent builds (parallel test runs, two `npm start`s) take turns on a lock file; whoever
 * waited re-checks and finds dist/ fresh. dist/ is replaced by a rename, so a process that is
 * starting never sees half a build.
 */
import { execFileSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  closeSync,
} from "node:fs";
import { createRequire } from "node:module";
import { join, sep } from "node:path";
import { fileURLToPath, URL } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const dist = join(root, "dist");
/** Written last: dist/ is complete, and as new as this file's mtime. */
const stamp = join(dist, ".build-stamp");
const lock = join(root, ".build.lock");

/** Files whose change makes dist/ stale, besides every source file under the input folders. */
const inputFiles = [
  "package.json",
  "package-lock.json",
  "tsconfig.json",
  "tsconfig.build.json",
  "scripts/build.mjs",
  "scripts/bundle.mjs",
];
/** src/console-vendor/ (the console's vendor entries) is among src/'s sources. */
const inputDirs = ["src", "gen", "bench"];
/** Build outputs written into the sources (see above): missing, the build is stale. */
const sourceOutputs = ["src/console/vendor/eip712.js"];
/**
 * Copied from src/ to dist/src/ as they are (folders or single files): read at run time relative
 * to their module. Every file under them is an input, whatever its name (the tokenizers' derived
 * tables are binary: default/derived/*.bpe, gemma/gemma3-table.gz).
 */
const assets = [
  "src/adapters/pg/migrations",
  "src/adapters/pg/functions",
  "src/adapters/tokenizers/default",
  "src/adapters/audits/data",
  "src/adapters/tokenizers/gemma/gemma3-table.gz",
  "src/console",
];
/** The source files among the input folders' files (the console's are served as they are). */
const sourceFile = /\.(ts|sql|js|css|html|svg|json|jinja)$/;
const assetPaths = assets.map((asset) => join(root, asset));
/** A file of an asset (above): an input whatever its extension. */
const isAsset = (path) =>
  assetPaths.some((asset) => path === asset || path.startsWith(`${asset}${sep}`));

/** The newest mtime (ms) among the inputs; folders count too, so a deleted file makes it stale. */
function newestInput() {
  let newest = 0;
  const see = (path) => {
    const mtime = statSync(path).mtimeMs;
    if (mtime > newest) newest = mtime;
  };
  const walk = (dir) => {
    see(dir);
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) {
        if (path !== join(root, "bench", "results")) walk(path);
      } else if (sourceFile.test(entry.name) || isAsset(path)) {
        see(path);
      }
    }
  };
  for (const file of inputFiles) if (existsSync(join(root, file))) see(join(root, file));
  for (const dir of inputDirs) walk(join(root, dir));
  return newest;
}

export function isStale() {
  if (!existsSync(stamp)) return true;
  if (sourceOutputs.some((file) => !existsSync(join(root, file)))) return true;
  return newestInput() > statSync(stamp).mtimeMs;
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return error.code === "EPERM";
  }
}

/** Takes the lock, waiting while a live process holds it; a dead holder's lock is taken over. */
function acquireLock() {
  const deadline = Date.now() + 10 * 60_000;
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    try {
      const fd = openSync(lock, "wx");
      writeFileSync(fd, String(process.pid));
      closeSync(fd);
      return;
    } catch (error) {
      if (error.code !== "EEXIST") throw error;
    }
    let holder = NaN;
    try {
      holder = Number(readFileSync(lock, "utf8"));
    } catch {
      continue; // released meanwhile
    }
    // An empty file is a holder between creating and writing it, unless it has been so for long.
    const stale = Number.isInteger(holder) && holder > 0 ? !alive(holder) : lockAgeMs() > 10_000;
    if (stale) {
      rmSync(lock, { force: true });
      continue;
    }
    if (Date.now() > deadline) throw new Error(`build: ${lock} is held by process ${holder}`);
    Atomics.wait(sleeper, 0, 0, 200);
  }
}

function lockAgeMs() {
  try {
    return Date.now() - statSync(lock).mtimeMs;
  } catch {
    return 0;
  }
}

export function build() {
  const started = Date.now();
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  const out = join(root, `dist.building-${process.pid}`);
  rmSync(out, { recursive: true, force: true });
  try {
    execFileSync(
      process.execPath,
      [tsc, "-p", join(root, "tsconfig.build.json"), "--noCheck", "--outDir", out],
      { stdio: ["ignore", "inherit", "inherit"] },
    );
    for (const asset of assets) cpSync(join(root, asset), join(out, asset), { recursive: true });
    // The production entry points as single files (scripts/bundle.mjs says why).
    execFileSync(process.execPath, [join(root, "scripts", "bundle.mjs"), out], {
      stdio: ["ignore", "inherit", "inherit"],
    });
    // The console's vendor modules for a gateway run from the sources (see the top).
    const vendor = join("src", "console", "vendor");
    rmSync(join(root, vendor), { recursive: true, force: true });
    cpSync(join(out, vendor), join(root, vendor), { recursive: true });
    writeFileSync(join(out, ".build-stamp"), `${new Date().toISOString()}\n`);
    const old = join(root, `dist.old-${process.pid}`);
    if (existsSync(dist)) renameSync(dist, old);
    renameSync(out, dist);
    rmSync(old, { recursive: true, force: true });
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
  process.stderr.write(`build: dist/ in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
}

/** Builds unless dist/ is fresh (checked again under the lock: someone may just have built). */
export function buildIfStale() {
  if (!isStale()) return false;
  acquireLock();
  try {
    if (!isStale()) return false;
    process.stderr.write("build: dist/ is missing or older than the sources; building\n");
    build();
    return true;
  } finally {
    rmSync(lock, { force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  if (args.length > 1 || (args.length === 1 && args[0] !== "--if-stale")) {
    process.stderr.write("usage: node scripts/build.mjs [--if-stale]\n");
    process.exit(2);
  }
  try {
    if (args[0] === "--if-stale") {
      buildIfStale();
    } else {
      acquireLock();
      try {
        build();
      } finally {
        rmSync(lock, { force: true });
      }
    }
  } catch (error) {
    // tsc has printed what it found; dist/ is as it was.
    process.stderr.write(`build: failed (${error.message.split("\n")[0]}); dist/ unchanged\n`);
    process.exit(1);
  }
}
