import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

/**
 * npm 11 runs a dependency's install script only when `allowScripts` in package.json approves
 * it, and lists the skipped ones at the end of every install. Every package the lock file marks
 * `hasInstallScript` is decided there, approved or denied, with its reason in
 * docs/decisions/operations-and-performance.md ("Dependencies' install scripts"), so a fresh
 * `npm install` prints no such list.
 */

interface LockEntry {
  readonly name?: string;
  readonly version?: string;
  readonly hasInstallScript?: boolean;
}

interface Scripted {
  readonly name: string;
  readonly version: string;
}

const root = new URL("../", import.meta.url);
const readJson = (path: string): unknown => JSON.parse(readFileSync(new URL(path, root), "utf8"));

/** The packages the lock file installs with an install script (not the project itself). */
function scriptedPackages(lock: { packages: Record<string, LockEntry> }): Scripted[] {
  return Object.entries(lock.packages)
    .filter(([path, entry]) => path !== "" && entry.hasInstallScript === true)
    .map(([path, entry]) => ({
      // A path is node_modules/<name>, possibly nested under another package's node_modules.
      name: entry.name ?? path.slice(path.lastIndexOf("node_modules/") + "node_modules/".length),
      version: entry.version ?? "",
    }));
}

/**
 * An entry's key is a name (every version) or name@version (that version), as
 * `npm install-scripts approve|deny` writes them; a range is not used here.
 */
function parseKey(key: string): { name: string; version?: string } {
  const at = key.indexOf("@", 1);
  return at < 0 ? { name: key } : { name: key.slice(0, at), version: key.slice(at + 1) };
}

/** What is wrong with `allowScripts` against the scripted packages; empty when nothing is. */
function problems(allowScripts: Record<string, unknown>, scripted: Scripted[]): string[] {
  const out: string[] = [];
  const keys = Object.entries(allowScripts).map(([key, value]) => ({
    key,
    value,
    ...parseKey(key),
  }));
  for (const { key, value } of keys) {
    if (typeof value !== "boolean")
      out.push(`${key}: the value is ${JSON.stringify(value)}, not true or false`);
  }
  for (const pkg of scripted) {
    const covering = keys.filter(
      (k) => k.name === pkg.name && (k.version === undefined || k.version === pkg.version),
    );
    if (covering.length === 0) {
      out.push(
        `${pkg.name}@${pkg.version} has an install script that is neither approved nor denied`,
      );
    }
  }
  for (const k of keys) {
    const used = scripted.some(
      (pkg) => k.name === pkg.name && (k.version === undefined || k.version === pkg.version),
    );
    if (!used) out.push(`${k.key} names no installed package with an install script`);
  }
  return out;
}

describe("dependencies' install scripts", () => {
  const pkg = readJson("package.json") as { allowScripts?: Record<string, unknown> };
  const lock = readJson("package-lock.json") as { packages: Record<string, LockEntry> };
  const allowScripts = pkg.allowScripts ?? {};
  const scripted = scriptedPackages(lock);

  it("the lock file has scripted packages, so the check below checks something", () => {
    expect(scripted.map((p) => p.name)).toContain("esbuild");
  });

  it("every package with an install script is approved or denied, and no entry is stale", () => {
    expect(problems(allowScripts, scripted)).toEqual([]);
  });

  it("the decisions page gives a reason for each entry", () => {
    const page = readFileSync(
      new URL("docs/decisions/operations-and-performance.md", root),
      "utf8",
    );
    const start = page.indexOf("## Dependencies' install scripts");
    expect(start).toBeGreaterThanOrEqual(0);
    const end = page.indexOf("\n## ", start + 1);
    const section = page.slice(start, end < 0 ? undefined : end);
    for (const key of Object.keys(allowScripts)) {
      expect(section, `${key} is not explained`).toContain(`\`${parseKey(key).name}\``);
    }
  });

  it("the check finds an undecided package, a pin to another version and a stale entry", () => {
    const scriptedHere = [
      { name: "@scope/tool", version: "1.2.3" },
      { name: "native", version: "2.0.0" },
    ];
    expect(problems({ "@scope/tool": false, "native@2.0.0": true }, scriptedHere)).toEqual([]);
    expect(problems({ "@scope/tool@1.2.3": true }, scriptedHere)).toEqual([
      "native@2.0.0 has an install script that is neither approved nor denied",
    ]);
    expect(problems({ "@scope/tool": false, "native@1.0.0": true }, scriptedHere)).toEqual([
      "native@2.0.0 has an install script that is neither approved nor denied",
      "native@1.0.0 names no installed package with an install script",
    ]);
    expect(problems({ "@scope/tool": "yes", native: false }, scriptedHere)).toEqual([
      '@scope/tool: the value is "yes", not true or false',
    ]);
  });
});
