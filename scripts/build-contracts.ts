/**
 * Compiles the market contracts with solc-js (standard JSON, pinned compiler from npm) and
 * writes `gen/contracts/json/<Name>.json` plus `gen/contracts/artifacts.ts`. Uniswap's Permit2
 * (for x402 on local chains) is compiled from `@uniswap/v4-periphery`'s copy with solc 0.8.17
 * (the `solc-0.8.17` npm alias) and Permit2's own settings (via IR, optimizer 1,000,000 runs).
 *
 * The build is reproducible: the same sources and compiler give byte-identical files (no
 * metadata hash in the bytecode, no absolute paths, deterministic ordering), so CI can run
 * `--check` to catch artifacts that drifted from the Solidity sources.
 *
 * Usage: node --import tsx scripts/build-contracts.ts [--check]
 */
import { readdirSync, readFileSync, writeFileSync, mkdirSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { format, resolveConfig } from "prettier";

const require = createRequire(import.meta.url);
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const sourceDir = join(root, "contracts", "src");
const artifactDir = join(root, "gen", "contracts", "json");
const tsArtifactPath = join(root, "gen", "contracts", "artifacts.ts");

/** The contracts that get artifacts, by source unit and the TS export prefix. */
const targets = [
  { source: "contracts/src/Market.sol", name: "Market", exportName: "market" },
  { source: "contracts/src/CreditToken.sol", name: "CreditToken", exportName: "creditToken" },
  {
    source: "contracts/src/test/ERC1271Wallet.sol",
    name: "ERC1271Wallet",
    exportName: "erc1271Wallet",
  },
  {
    source: "contracts/src/x402/X402UptoPermit2Proxy.sol",
    name: "x402UptoPermit2Proxy",
    exportName: "x402UptoPermit2Proxy",
  },
] as const;

/** Permit2 as shipped in `@uniswap/v4-periphery` (its `lib/permit2`), with its foundry.toml. */
const permit2 = {
  package: "@uniswap/v4-periphery",
  dir: "lib/permit2",
  source: "permit2/src/Permit2.sol",
  name: "Permit2",
  exportName: "permit2",
  solc: "solc-0.8.17",
  settings: {
    remappings: ["solmate/=permit2/lib/solmate/"],
    viaIR: true,
    optimizer: { enabled: true, runs: 1_000_000 },
    evmVersion: "london",
    metadata: { bytecodeHash: "none" },
  },
} as const;

interface SolcDiagnostic {
  severity: "error" | "warning" | "info";
  type: string;
  formattedMessage?: string;
  message: string;
}

interface SolcContractOutput {
  abi: unknown[];
  evm: { bytecode: { object: string } };
}

interface SolcOutput {
  errors?: SolcDiagnostic[];
  contracts?: Record<string, Record<string, SolcContractOutput>>;
}

interface Solc {
  version(): string;
  compile(input: string, callbacks: { import: (path: string) => ImportResult }): string;
}

type ImportResult = { contents: string } | { error: string };

function listSources(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...listSources(full));
    else if (entry.name.endsWith(".sol")) out.push(full);
  }
  return out.sort();
}

/** Source unit name as solc sees it: repository-relative with forward slashes. */
function unitName(file: string): string {
  return relative(root, file).split(sep).join("/");
}

/** Resolves `@scope/package/...` imports (OpenZeppelin) from node_modules; nothing else. */
function importFromNodeModules(path: string): ImportResult {
  const match = /^(@[^/]+\/[^/]+)\/(.+\.sol)$/.exec(path);
  if (!match || path.includes("..")) return { error: `unsupported import path: ${path}` };
  const [, pkg, rest] = match;
  try {
    const pkgDir = dirname(require.resolve(`${pkg}/package.json`));
    return { contents: readFileSync(join(pkgDir, rest ?? ""), "utf8") };
  } catch (err) {
    return { error: `cannot read ${path}: ${(err as Error).message}` };
  }
}

/** Resolves `permit2/...` to `@uniswap/v4-periphery`'s `lib/permit2/...`; nothing else. */
function importFromPermit2(path: string): ImportResult {
  if (!path.startsWith("permit2/") || path.includes("..")) {
    return { error: `unsupported import path: ${path}` };
  }
  try {
    const pkgDir = dirname(require.resolve(`${permit2.package}/package.json`));
    return {
      contents: readFileSync(join(pkgDir, permit2.dir, path.slice("permit2/".length)), "utf8"),
    };
  } catch (err) {
    return { error: `cannot read ${path}: ${(err as Error).message}` };
  }
}

/** Runs one standard-JSON compilation; warnings go to stderr, errors throw. */
function runSolc(solc: Solc, input: unknown, importer: (path: string) => ImportResult): SolcOutput {
  const output = JSON.parse(
    solc.compile(JSON.stringify(input), { import: importer }),
  ) as SolcOutput;
  const diagnostics = output.errors ?? [];
  for (const d of diagnostics.filter((d) => d.severity !== "error")) {
    process.stderr.write(`${d.formattedMessage ?? d.message}\n`);
  }
  const errors = diagnostics.filter((d) => d.severity === "error");
  if (errors.length > 0) {
    const text = errors.map((d) => d.formattedMessage ?? `${d.type}: ${d.message}`).join("\n");
    throw new Error(`solc ${solc.version()} reported ${errors.length} error(s):\n${text}`);
  }
  return output;
}

function contractOf(output: SolcOutput, source: string, name: string): SolcContractOutput {
  const contract = output.contracts?.[source]?.[name];
  if (!contract || !contract.evm.bytecode.object) {
    throw new Error(`solc produced no bytecode for ${source}:${name}`);
  }
  return contract;
}

interface Compiled {
  solcVersion: string;
  permit2SolcVersion: string;
  contracts: Map<string, SolcContractOutput>;
}

function compile(): Compiled {
  const solc = require("solc") as Solc;
  const sources: Record<string, { content: string }> = {};
  for (const file of listSources(sourceDir)) {
    sources[unitName(file)] = { content: readFileSync(file, "utf8") };
  }
  const output = runSolc(
    solc,
    {
      language: "Solidity",
      sources,
      settings: {
        optimizer: { enabled: true, runs: 200 },
        evmVersion: "cancun",
        metadata: { bytecodeHash: "none" },
        outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } },
      },
    },
    importFromNodeModules,
  );
  const contracts = new Map<string, SolcContractOutput>();
  for (const target of targets) {
    contracts.set(target.name, contractOf(output, target.source, target.name));
  }

  const permit2Solc = require(permit2.solc) as Solc;
  const permit2Source = importFromPermit2(permit2.source);
  if (!("contents" in permit2Source)) throw new Error(permit2Source.error);
  const permit2Output = runSolc(
    permit2Solc,
    {
      language: "Solidity",
      sources: { [permit2.source]: { content: permit2Source.contents } },
      settings: {
        ...permit2.settings,
        outputSelection: { [permit2.source]: { [permit2.name]: ["abi", "evm.bytecode.object"] } },
      },
    },
    importFromPermit2,
  );
  contracts.set(permit2.name, contractOf(permit2Output, permit2.source, permit2.name));
  return { solcVersion: solc.version(), permit2SolcVersion: permit2Solc.version(), contracts };
}

async function render(): Promise<Map<string, string>> {
  const { solcVersion, permit2SolcVersion, contracts } = compile();
  const files = new Map<string, string>();
  const ts: string[] = [
    "// generated by scripts/build-contracts.ts; do not edit",
    `// solc ${solcVersion}, optimizer runs 200, evm cancun, sources: contracts/src`,
    `// Permit2: solc ${permit2SolcVersion}, via IR, optimizer runs 1000000, evm london,`,
    `// source: ${permit2.package} ${permit2.dir}/src/Permit2.sol`,
    "",
  ];
  for (const target of [...targets, permit2]) {
    const contract = contracts.get(target.name);
    if (!contract) throw new Error(`missing ${target.name}`);
    const bytecode = `0x${contract.evm.bytecode.object}`;
    const artifact = { contractName: target.name, abi: contract.abi, bytecode };
    files.set(join(artifactDir, `${target.name}.json`), `${JSON.stringify(artifact, null, 2)}\n`);
    ts.push(
      `export const ${target.exportName}Abi = ${JSON.stringify(contract.abi)} as const;`,
      "",
      `export const ${target.exportName}Bytecode: \`0x\${string}\` = ${JSON.stringify(bytecode)};`,
      "",
    );
  }
  const prettierOptions = (await resolveConfig(tsArtifactPath)) ?? {};
  files.set(
    tsArtifactPath,
    await format(ts.join("\n"), { ...prettierOptions, filepath: tsArtifactPath }),
  );
  return files;
}

async function main(): Promise<void> {
  const check = process.argv.includes("--check");
  const files = await render();
  if (check) {
    const drifted = [...files]
      .filter(([path, content]) => !existsSync(path) || readFileSync(path, "utf8") !== content)
      .map(([path]) => relative(root, path));
    const expected = new Set(files.keys());
    const extra = existsSync(artifactDir)
      ? readdirSync(artifactDir)
          .map((name) => join(artifactDir, name))
          .filter((path) => !expected.has(path))
          .map((path) => `${relative(root, path)} (not produced by the build)`)
      : [];
    if (drifted.length + extra.length > 0) {
      process.stderr.write(
        "contract artifacts differ from the Solidity sources:\n" +
          [...drifted, ...extra].map((f) => `  ${f}\n`).join("") +
          "run: node --import tsx scripts/build-contracts.ts\n",
      );
      process.exit(1);
    }
    process.stdout.write("contract artifacts are up to date\n");
    return;
  }
  mkdirSync(artifactDir, { recursive: true });
  for (const [path, content] of files) {
    const changed = !existsSync(path) || readFileSync(path, "utf8") !== content;
    if (changed) writeFileSync(path, content);
    process.stdout.write(`${changed ? "wrote" : "unchanged"} ${relative(root, path)}\n`);
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`build-contracts: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
