#!/usr/bin/env node
// Fails when committed generated code differs from what the sources produce:
// gen/ (from proto/ by buf) and gen/contracts/ (the contract artifacts, from contracts/src by solc).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

function files(dir) {
  const out = [];
  const walk = (d) => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      if (statSync(path).isDirectory()) walk(path);
      else out.push(relative(dir, path));
    }
  };
  walk(dir);
  return out.sort();
}

let failed = false;
const scratch = mkdtempSync(join(tmpdir(), "gw-drift-"));
try {
  execFileSync("node_modules/.bin/buf", ["generate", "-o", scratch], { stdio: "inherit" });
  const fresh = join(scratch, "gen");
  const want = files(fresh);
  // gen/contracts/ is the contracts' (checked below), not buf's.
  const have = files("gen").filter((f) => !f.startsWith("contracts/"));
  const differing = [
    ...want.filter(
      (f) =>
        !have.includes(f) || !readFileSync(join(fresh, f)).equals(readFileSync(join("gen", f))),
    ),
    ...have.filter((f) => !want.includes(f)),
  ];
  if (differing.length > 0) {
    failed = true;
    console.error(
      `gen/ is out of date with proto/ (run 'npm run generate'):\n  ${differing.join("\n  ")}`,
    );
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}

try {
  execFileSync("node", ["--import", "tsx", "scripts/build-contracts.ts", "--check"], {
    stdio: "inherit",
  });
} catch {
  failed = true;
}

if (failed) process.exit(1);
console.log("generated code matches its sources");
