import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";

/**
 * Every shell command the docs show is run by a test (issue 30, item 8). The commands are those of
 * the fenced `sh`, `bash`, `shell` and `console` blocks of README.md and docs/**\/*.md (in a
 * `console` block, the lines after `$ `). Each must match a row of RUNNERS below, which names the
 * test file (or CI's script) that runs it, and that file must hold the invocation:
 *
 * - the CLI (`npm run gateway -- ...`, `gateway ...`, `node dist/src/cli/main.js ...`): the
 *   command group, its subcommand and every flag the doc shows, each as a quoted string (tests
 *   pass arguments as arrays); and the built CLI's own help (run here, a few processes) names the
 *   subcommand and every flag;
 * - curl: the route the doc calls (its ids as placeholders), each query parameter, and
 *   `stream: true` when the doc streams;
 * - a read of `npm start`'s manifest (`X=$(node -p "require('./.gateway/dev.json').field")`): the
 *   field, as the test that checks the manifest names it;
 * - anything else: the row's own needles (checked for every kind; for the CLI they replace the
 *   quoted words, for a command the tests run another way, e.g. `gateway serve` through the bin).
 *
 * `export` lines set the environment of the commands below them and are not commands. A command
 * no row matches fails this file: add a test that runs it and a row that names that test. The
 * few commands no test runs yet are NOT_RUN_YET, each a `todo` in every run's report until a
 * test runs it.
 */

interface DocCommand {
  /** README.md or docs/..., and the line the command starts on. */
  readonly where: string;
  /** The command as the doc shows it, continuation lines joined, comments stripped. */
  readonly text: string;
}

interface Runner {
  /** The commands of this row, matched against the normalised command (see `normalise`). */
  readonly shows: RegExp;
  /** The file that runs them, from the repository's root. */
  readonly test: string;
  /** What that file must contain, besides what the command's kind requires. */
  readonly needles?: readonly (string | RegExp)[];
}

const root = resolve(".");

/** The CLI's invocations, each written as `gateway ...` once normalised. */
const cliPrefixes = [
  /^npm run gateway -- /,
  /^node dist\/src\/cli\/main\.js /,
  /^bin\/gateway\.js /,
];

const RUNNERS: readonly Runner[] = [
  // The sandbox, the suites and the build.
  // No test runs `npm install` on a fresh clone: build.test.ts links the checkout's node_modules
  // into one (what `npm install` leaves) and runs `npm start` there; CI runs `npm ci`.
  { shows: /^npm install$/, test: "test/e2e/build.test.ts", needles: ["`npm install`", '"start"'] },
  { shows: /^npm start$/, test: "test/e2e/build.test.ts", needles: ['spawn("npm", ["start"'] },
  { shows: /^npm test$/, test: ".ci/run", needles: ["\nnpm test -- "] },
  { shows: /^npm run test:e2e$/, test: ".ci/run", needles: ["\nnpm run test:e2e -- "] },
  // `npm run test:all` is both projects: CI runs them as two steps, on each Node line.
  {
    shows: /^npm run test:all$/,
    test: ".ci/run",
    needles: ["\nnpm test -- ", "\nnpm run test:e2e -- "],
  },
  { shows: /^npm run check$/, test: ".ci/run", needles: ["npm run check:static", "npm test"] },
  // `npm run test:pg` is vitest with TEST_DATABASE_URL set (scripts/test-pg.mjs): CI's second run.
  {
    shows: /^npm run test:pg$/,
    test: ".ci/run",
    needles: ["the suite against the real PostgreSQL", "TEST_DATABASE_URL"],
  },
  { shows: /^npm run test:pgbouncer$/, test: ".ci/run", needles: ["npm run test:pgbouncer"] },
  { shows: /^npm run soak$/, test: ".ci/run", needles: ["npm run soak"] },
  { shows: /^npm ci$/, test: ".ci/run", needles: ["npm ci"] },
  { shows: /^npm run build$/, test: ".ci/run", needles: ["\nnpm run build\n"] },
  // `npm run serve` is `node dist/src/cli/main.js serve`, which is what the bin runs.
  {
    shows: /^npm run serve$/,
    test: "test/e2e/build.test.ts",
    needles: ['"bin/gateway.js", "serve"'],
  },
  {
    shows: /^gateway serve$/,
    test: "test/e2e/build.test.ts",
    needles: ['"bin/gateway.js", "serve"'],
  },
  {
    shows: /^npm prune --omit=dev$/,
    test: "test/e2e/build.test.ts",
    needles: ['"prune", "--omit=dev"'],
  },
  {
    shows: /^npx buf curl --protocol grpc --http2-prior-knowledge --schema proto .*ListModels$/,
    test: "test/catalog.test.ts",
    needles: [
      '"node_modules/.bin/buf"',
      '"--http2-prior-knowledge"',
      "/gateway.v1.CatalogService/ListModels",
    ],
  },
  {
    shows: /^npx buf curl --protocol connect --schema proto .*GetModel$/,
    test: "test/catalog.test.ts",
    needles: ['"node_modules/.bin/buf"', '"connect"', "/gateway.v1.CatalogService/GetModel"],
  },

  // What `npm start` writes: test/e2e/cli.test.ts runs `gateway dev` and checks every field.
  { shows: /^manifest /, test: "test/e2e/cli.test.ts", needles: ["dev.json"] },

  // The CLI.
  { shows: /^gateway (keys|settle|migrate|x402)\b/, test: "test/e2e/cli.test.ts" },
  // The subcommand's function is called with its flags (it needs only the database).
  {
    shows: /^gateway audits export-reference\b/,
    test: "test/audit-export.test.ts",
    needles: ["runAuditsExport(", '"--model"', '"--out"'],
  },
  { shows: /^gateway audits\b/, test: "test/audit-standing.test.ts" },
  { shows: /^gateway permit (open|balance|close|finalize)\b/, test: "test/e2e/permit-cli.test.ts" },
  { shows: /^gateway permit authorize\b/, test: "test/e2e/wallet-guard.test.ts" },
  {
    shows: /^gateway permit revoke (--key|--permit|--all)\b/,
    test: "test/e2e/payer-control.test.ts",
  },
  { shows: /^gateway permit revoke\b/, test: "test/e2e/cli.test.ts" },
  { shows: /^gateway permit authorizations\b/, test: "test/e2e/payer-control.test.ts" },
  { shows: /^gateway permit audit\b/, test: "test/receipts.test.ts" },
  { shows: /^gateway provider (register|verify|health)\b/, test: "test/provider.test.ts" },
  { shows: /^gateway provider bind-key\b/, test: "test/e2e/wallet-guard.test.ts" },
  { shows: /^gateway provider earnings\b/, test: "test/earnings.test.ts" },
  { shows: /^gateway audits budget\b/, test: "test/audit-budget.test.ts" },

  // The REST routes, called with curl.
  { shows: /^curl .*\/health\b/, test: "test/e2e/cli.test.ts" },
  { shows: /^curl .*\/v1\/models\b/, test: "test/catalog.test.ts" },
  { shows: /^curl .*\/v1\/quotes\b/, test: "test/chat.test.ts" },
  { shows: /^curl .*\/v1\/chat\/completions\b/, test: "test/chat.test.ts" },
  { shows: /^curl .*\/v1\/(responses|messages)\b/, test: "test/dialects.test.ts" },
  { shows: /^curl .*\/v1\/requests\/\S+\/receipt\b/, test: "test/receipts.test.ts" },
  { shows: /^curl .*\/v1\/requests\//, test: "test/chat.test.ts" },
  { shows: /^curl .*\/v1\/permits\/\S+\/receipts\b/, test: "test/receipts.test.ts" },
  { shows: /^curl .*\/v1\/permits\//, test: "test/permit-balance.test.ts" },
  { shows: /^curl .*\/v1\/gateway\b/, test: "test/receipts.test.ts" },
  { shows: /^curl .*\/v1\/provider-offers\/\S+\/earnings\b/, test: "test/earnings.test.ts" },
  { shows: /^curl .*\/audits\/standings\b/, test: "test/audit-standing.test.ts" },
];

/** Commands the docs show that no test runs yet: each is a `todo` until one does. */
const NOT_RUN_YET: readonly { shows: RegExp; why: string }[] = [];

/** README.md and every Markdown file under docs/. */
function docFiles(): string[] {
  const found = [join(root, "README.md")];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith(".md")) found.push(path);
    }
  };
  walk(join(root, "docs"));
  return found.sort();
}

/** A line without its shell comment (a `#` starting a word, outside quotes). */
function stripComment(line: string): string {
  let quote: string | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quote) {
      if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === "#" && (i === 0 || /\s/.test(line[i - 1]!))) return line.slice(0, i);
  }
  return line;
}

/** Splits on `&&` and `;` outside quotes. */
function splitCompound(text: string): string[] {
  const parts: string[] = [];
  let quote: string | undefined;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote) {
      if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === ";" || (c === "&" && text[i + 1] === "&")) {
      parts.push(text.slice(start, i));
      start = c === ";" ? i + 1 : i + 2;
      if (c === "&") i++;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim()).filter((p) => p !== "");
}

/** The shell commands of one Markdown text. */
function shellCommands(markdown: string, file: string): DocCommand[] {
  const commands: DocCommand[] = [];
  let fence: string | undefined;
  let pending: { text: string; line: number } | undefined;
  markdown.split("\n").forEach((raw, index) => {
    const opening = /^```\s*(\w*)/.exec(raw);
    if (opening) {
      fence = fence === undefined ? opening[1]! : undefined;
      pending = undefined;
      return;
    }
    if (fence === undefined || !["sh", "bash", "shell", "console"].includes(fence)) return;
    let line = raw;
    if (fence === "console" && !pending) {
      if (!line.startsWith("$ ")) return;
      line = line.slice(2);
    }
    const code = stripComment(line).trimEnd();
    if (code.trim() === "" && !pending) return;
    const joined = pending ? `${pending.text} ${code.trim()}` : code.trim();
    const startLine = pending?.line ?? index + 1;
    if (joined.endsWith("\\")) {
      pending = { text: joined.slice(0, -1).trimEnd(), line: startLine };
      return;
    }
    pending = undefined;
    for (const text of splitCompound(joined)) {
      commands.push({ where: `${relative(root, file) || file}:${startLine}`, text });
    }
  });
  return commands;
}

/** Shell words, quotes removed. */
function words(text: string): string[] {
  const out: string[] = [];
  const pattern = /"([^"]*)"|'([^']*)'|(\S+)/g;
  for (const m of text.matchAll(pattern)) out.push(m[1] ?? m[2] ?? m[3]!);
  return out;
}

/**
 * The command as RUNNERS match it: the CLI as `gateway ...`, a read of the manifest as
 * `manifest <field>`, `export` lines as undefined (environment, not a command).
 */
function normalise(text: string): string | undefined {
  if (/^export\s/.test(text)) return undefined;
  const manifest = /^\w+=\$\(node -p "require\('\.\/\.gateway\/dev\.json'\)\.(\w+)"\)$/.exec(text);
  if (manifest) return `manifest ${manifest[1]}`;
  for (const prefix of cliPrefixes) {
    if (prefix.test(text)) return `gateway ${text.replace(prefix, "")}`;
  }
  return text;
}

/** The CLI's words: group, subcommand (if any) and the flags shown (brackets dropped). */
function cliParts(command: string): { group: string; sub?: string; flags: string[] } {
  const args = words(command.replace(/[[\]]/g, " ")).slice(1);
  const group = args[0]!;
  const sub =
    ["keys", "permit", "provider", "settle"].includes(group) && /^[a-z][a-z-]*$/.test(args[1] ?? "")
      ? args[1]
      : undefined;
  const flags = [...new Set(args.filter((a) => a.startsWith("--")))];
  return sub === undefined ? { group, flags } : { group, sub, flags };
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const quoted = (word: string) => new RegExp(`["'\`]${escape(word)}["'\`]`);

/** What a curl command's test must hold: its route, its query's names, streaming. */
function curlNeedles(command: string): RegExp[] {
  const url = words(command).find((w) => w.startsWith("$BASE"));
  if (!url) return [/^$/]; // a curl without the gateway's URL: no test can be named for it
  const [path, query] = url.slice("$BASE".length).split("?") as [string, string | undefined];
  const segments = path
    .split("/")
    .map((segment) => (/^(0x|\$)/.test(segment) ? String.raw`[^/\s"'\`?]+` : escape(segment)));
  const needles = [new RegExp(segments.join("/"))];
  for (const pair of query?.split("&") ?? [])
    needles.push(new RegExp(`${escape(pair.split("=")[0]!)}=`));
  // Streamed: the test asks for a stream, in the body or through an SDK's `.stream(...)`.
  if (/"stream":\s*true/.test(command)) needles.push(/["']?stream["']?:\s*true|\.stream\(/);
  return needles;
}

/** Everything the runner's file must contain for this command. */
function needlesOf(command: string, runner: Runner): (string | RegExp)[] {
  const needles: (string | RegExp)[] = [...(runner.needles ?? [])];
  if (command.startsWith("gateway ") && runner.needles === undefined) {
    const { group, sub, flags } = cliParts(command);
    needles.push(quoted(group), ...(sub ? [quoted(sub)] : []), ...flags.map(quoted));
  } else if (command.startsWith("curl ")) {
    needles.push(...curlNeedles(command));
  } else if (command.startsWith("manifest ")) {
    needles.push(quoted(command.slice("manifest ".length)));
  }
  return needles;
}

interface Finding {
  readonly command: DocCommand;
  readonly problem: string;
}

/** Each command a runner cannot vouch for, and why; the commands NOT_RUN_YET. */
function audit(commands: readonly DocCommand[]): {
  findings: Finding[];
  notRunYet: DocCommand[];
} {
  const findings: Finding[] = [];
  const notRunYet: DocCommand[] = [];
  for (const command of commands) {
    const normal = normalise(command.text);
    if (normal === undefined) continue;
    if (NOT_RUN_YET.some((gap) => gap.shows.test(normal))) {
      notRunYet.push(command);
      continue;
    }
    const runner = RUNNERS.find((r) => r.shows.test(normal));
    if (!runner) {
      findings.push({
        command,
        problem: "no test runs it (no row of RUNNERS in test/docs.test.ts)",
      });
      continue;
    }
    const path = join(root, runner.test);
    if (!existsSync(path)) {
      findings.push({ command, problem: `${runner.test}, which should run it, does not exist` });
      continue;
    }
    const source = readFileSync(path, "utf8");
    for (const needle of needlesOf(normal, runner)) {
      const found = typeof needle === "string" ? source.includes(needle) : needle.test(source);
      if (!found)
        findings.push({ command, problem: `${runner.test} does not hold ${String(needle)}` });
    }
  }
  return { findings, notRunYet };
}

const report = (findings: readonly Finding[]) =>
  findings.map((f) => `${f.command.where}: ${f.command.text}\n  ${f.problem}`).join("\n");

const commands = docFiles().flatMap((file) => shellCommands(readFileSync(file, "utf8"), file));
const cli = join(root, "dist/src/cli/main.js");

describe("the commands the docs show", () => {
  it("finds the docs' shell commands", () => {
    expect(commands.length).toBeGreaterThan(40);
    expect(commands.map((c) => c.text)).toContain("npm start");
  });

  it("are each run by a named test", () => {
    const { findings } = audit(commands);
    expect(findings, report(findings)).toEqual([]);
  });

  it("fails for a command no test runs", () => {
    const doc = "```sh\nnpm run gateway -- permit frobnicate 0xPERMIT --wobble   # new\n```\n";
    const { findings } = audit(shellCommands(doc, join(root, "docs/example.md")));
    expect(findings.map((f) => f.problem)).toEqual([
      "no test runs it (no row of RUNNERS in test/docs.test.ts)",
    ]);
    const flag =
      "```sh\nnpm run gateway -- permit open demo-chat --deposit 1 --no-such-flag\n```\n";
    const missing = audit(shellCommands(flag, join(root, "docs/example.md"))).findings;
    expect(missing.map((f) => f.problem)).toEqual([
      `test/e2e/permit-cli.test.ts does not hold ${String(quoted("--no-such-flag"))}`,
    ]);
  });

  it("keeps no row of NOT_RUN_YET that the docs no longer show", () => {
    const normal = commands.map((c) => normalise(c.text)).filter((c) => c !== undefined);
    for (const gap of NOT_RUN_YET)
      expect(
        normal.some((c) => gap.shows.test(c)),
        String(gap.shows),
      ).toBe(true);
  });

  for (const command of audit(commands).notRunYet) {
    const gap = NOT_RUN_YET.find((g) => g.shows.test(normalise(command.text)!))!;
    it.todo(`no test runs \`${command.text}\` (${command.where}) yet: ${gap.why}`);
  }

  // The built CLI's own help names every subcommand and flag the docs show (vitest's global setup
  // builds dist/; without a build there is nothing to ask).
  it.skipIf(!existsSync(cli))("name only subcommands and flags the CLI's help lists", async () => {
    const shown = commands
      .map((command) => ({ command, normal: normalise(command.text) }))
      .filter(
        (c): c is { command: DocCommand; normal: string } => !!c.normal?.startsWith("gateway "),
      )
      .map(({ command, normal }) => ({ command, ...cliParts(normal) }));
    const helpArgs = (group: string) =>
      ({ permit: ["permit"], provider: ["provider"], settle: ["settle", "help"] })[group] ?? [];
    const keys = [...new Set(shown.map((c) => helpArgs(c.group).join(" ")))];
    expect(keys.length).toBeLessThanOrEqual(4);
    const help = new Map(
      await Promise.all(keys.map(async (key) => [key, await helpText(key)] as const)),
    );
    const unknown: string[] = [];
    for (const { command, group, sub, flags } of shown) {
      const text = help.get(helpArgs(group).join(" "))!;
      for (const name of [sub ?? group, ...flags]) {
        if (!new RegExp(`(^|[\\s[|])${escape(name)}(?![\\w-])`, "m").test(text)) {
          unknown.push(`${command.where}: ${command.text}: the help of '${group}' has no ${name}`);
        }
      }
    }
    expect(unknown).toEqual([]);
  });
});

/** What the built CLI prints for `gateway <args>` (its usage, on stdout or stderr). */
function helpText(args: string): Promise<string> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      [cli, ...(args === "" ? [] : args.split(" "))],
      { cwd: root, env: { PATH: process.env.PATH ?? "" }, encoding: "utf8", timeout: 30_000 },
      (_error, stdout, stderr) => done(`${stdout}\n${stderr}`),
    );
  });
}
