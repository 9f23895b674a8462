import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, normalize, posix } from "node:path";
import { describe, expect, it } from "vitest";

/**
 * docs/architecture.md is the newcomer's map; a map naming a file that moved, or leaving a
 * folder out, sends them the wrong way. These checks read the page as written: every repository
 * path it names exists (a `path#name` names something that occurs in that file), and every
 * folder of src/ is named.
 */

const root = join(import.meta.dirname, "..");
const docPath = "docs/architecture.md";
const doc = readFileSync(join(root, docPath), "utf8");

/** The prefixes of a backticked span that is a path from the repository's root. */
const rootPrefixes = [
  "src/",
  "test/",
  "bench/",
  "proto/",
  "gen/",
  "contracts/",
  "scripts/",
  "docs/",
];

/** A span made only of path characters that names a folder (`/`) or a file (an extension). */
const pathLike = /^[\w.\-<>*/]+(#\w+)?$/;
const hasExtension = /\.\w+(#\w+)?$/;

/** The code spans of a piece of markdown, in order (runs of one or more backticks). */
function codeSpans(text: string): string[] {
  return [...text.matchAll(/(`+)(.+?)\1(?!`)/g)].map((match) => match[2]!.trim());
}

/**
 * What `path` names, relative to the repository's root: a file or folder that exists, else
 * nothing. `<name>` and `*` stand for any part of one file name (a template such as
 * `src/connect/<service>-service.ts` names every file it fits, and needs at least one).
 */
function resolve(path: string): string[] {
  const clean = normalize(path).replace(/\/$/, "");
  if (!/[<*]/.test(clean)) return exists(clean) ? [clean] : [];
  const folder = dirname(clean);
  if (/[<*]/.test(folder) || !exists(folder)) return [];
  const template = posix.basename(clean);
  const fits = new RegExp(
    `^${template
      .split(/<[^>]*>|\*/)
      .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&"))
      .join("[^/]+")}$`,
  );
  return readdirSync(join(root, folder))
    .filter((name) => fits.test(name))
    .map((name) => posix.join(folder, name));
}

function exists(path: string): boolean {
  try {
    statSync(join(root, path));
    return true;
  } catch {
    return false;
  }
}

function isFolder(path: string): boolean {
  return statSync(join(root, path)).isDirectory();
}

/** Whether the file at `path` holds `name` as a whole word (a folder holds no name). */
function holds(path: string, name: string): boolean {
  if (isFolder(path)) return false;
  return new RegExp(`\\b${name}\\b`).test(readFileSync(join(root, path), "utf8"));
}

/** Splits `path#name` into the path and the name it says occurs in that file. */
function splitName(span: string): { path: string; name?: string } {
  const [path, name] = span.split("#");
  return { path: path!, name };
}

interface Mention {
  readonly span: string;
  /** The folders the span may be relative to, the repository's root first. */
  readonly bases: readonly string[];
}

/**
 * The layers table's rows: a row's first cell names its folders (`src/domain/`), and a path in
 * its second cell (`chat/ports.ts`, `pg/migrations/`) is relative to one of them or to their
 * parent (`cli/main.ts` in the row of `src/cli/`, `src/clients/`).
 */
function layerRows(): { folders: string[]; spans: string[] }[] {
  const section = doc.split(/^## /m).find((part) => part.startsWith("The layers"));
  if (section === undefined) throw new Error(`${docPath} has no "The layers" section`);
  return section
    .split("\n")
    .filter((line) => line.startsWith("|") && !/^\|\s*-/.test(line))
    .slice(1)
    .map((line) => {
      const [first = "", ...rest] = line.split("|").slice(1, -1);
      const folders = codeSpans(first)
        .filter((span) => span.endsWith("/"))
        .map((span) => span.replace(/\/$/, ""));
      return { folders, spans: codeSpans(rest.join("|")) };
    });
}

function mentions(): Mention[] {
  const found: Mention[] = [];
  for (const span of codeSpans(doc)) {
    if (rootPrefixes.some((prefix) => span.startsWith(prefix)) && pathLike.test(span))
      found.push({ span, bases: ["."] });
  }
  // Relative links resolve from the page's folder.
  for (const [, target] of doc.matchAll(/\]\(([^)\s]+)\)/g)) {
    if (/^[a-z]+:|^#/.test(target!)) continue;
    found.push({ span: posix.join("docs", target!.replace(/#.*$/, "")), bases: ["."] });
  }
  for (const { folders, spans } of layerRows()) {
    const bases = [...new Set(folders.flatMap((folder) => [folder, dirname(folder)]))];
    for (const span of spans) {
      if (rootPrefixes.some((prefix) => span.startsWith(prefix))) continue;
      // A URL path (`/v1`) is no file.
      if (span.startsWith("/") || !pathLike.test(span)) continue;
      if (!(span.includes("/") || hasExtension.test(span))) continue;
      found.push({ span, bases });
    }
  }
  return found;
}

/** Where a mention leads: the existing files and folders it names from its first fitting base. */
function targets(mention: Mention): string[] {
  const { path } = splitName(mention.span);
  for (const base of mention.bases) {
    const hits = resolve(posix.join(base, path));
    if (hits.length > 0) return hits;
  }
  return [];
}

/**
 * The folders of src/ a clone holds: those of its tracked files and of new ones not ignored (a
 * build output such as src/console/vendor/ is no folder of the sources).
 */
function sourceFolders(): string[] {
  const files = execFileSync("git", ["ls-files", "-z", "-co", "--exclude-standard", "src"], {
    cwd: root,
    encoding: "utf8",
  })
    .split("\0")
    .filter((file) => file !== "" && exists(file));
  const folders = new Set<string>();
  for (const file of files) {
    for (let folder = dirname(file); folder !== "."; folder = dirname(folder)) folders.add(folder);
  }
  return [...folders].sort();
}

describe(docPath, () => {
  it("names only paths that exist, and a path#name's name occurs in its file", () => {
    const all = mentions();
    expect(all.length).toBeGreaterThan(50);
    const wrong: string[] = [];
    for (const mention of all) {
      const hits = targets(mention);
      if (hits.length === 0) {
        wrong.push(`${mention.span}: no such file or folder`);
        continue;
      }
      const { name } = splitName(mention.span);
      if (name === undefined) continue;
      const inFile = hits.some((hit) => holds(hit, name));
      if (!inFile) wrong.push(`${mention.span}: ${name} does not occur in the file`);
    }
    expect(wrong).toEqual([]);
  });

  it("names every folder of src/", () => {
    const named = new Set(
      mentions()
        .flatMap(targets)
        .filter((path) => isFolder(path)),
    );
    const missing = sourceFolders().filter((folder) => !named.has(folder));
    expect(missing).toEqual([]);
  });

  // The checks above must be able to fail: a made-up path and a made-up function are refused.
  it("refuses a path that does not exist and a name a file does not hold", () => {
    expect(resolve("src/domain/no-such-module.ts")).toEqual([]);
    expect(resolve("src/connect/<service>-service.ts")).toContain(
      "src/connect/inference-service.ts",
    );
    expect(resolve("src/connect/<name>-nothing.ts")).toEqual([]);
    expect(holds("src/domain/leases/closes.ts", "finalize")).toBe(true);
    expect(holds("src/domain/leases/closes.ts", "finalizeNothing")).toBe(false);
    expect(holds("src/domain/leases", "finalize")).toBe(false);
  });
});
