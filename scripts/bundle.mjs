#!/usr/bin/env node
/**
 * The production processes' entry points as single files: `node scripts/bundle.mjs <built dir>`
 * replaces `<dir>/src/cli/main.js` (what `npm start`, `npm run serve` and `bin/gateway.js`
 * run) and `<dir>/bench/gateway.js` (the benchmark's gateway) with esbuild bundles of
 * themselves, tree-shaken, with source maps as files that lead back to the TypeScript. Run by
 * scripts/build.mjs after tsc; every other module of the build stays as tsc wrote it (tests and
 * outside harnesses import them).
 *
 * Why: a process that loads some 1,500 modules (viem's and OpenTelemetry's index files load
 * everything they export) holds each one's source, module record and namespace; one tree-shaken
 * file holds what the gateway calls. Measured (bench/figures/issue-21-lean-path.md, issue 21
 * item 3): the RSS of a process that has loaded the app, 143 MB as modules, 111 MB as one file.
 *
 * What a bundle must keep working:
 * - `import.meta.url` means the file it was written in (the migrations and SQL functions are
 *   read beside `migrate.js`, anvil is found from `anvil.js`, the tokenizers' tables beside
 *   `derived.js` and `gemma/load.js`, where scripts/build.mjs copies them): each occurrence
 *   becomes the URL of that original file, relative to the bundle, so dist/ can still move as a
 *   whole.
 * - CommonJS dependencies `require` Node's modules: the bundle defines `require`.
 * - PGlite loads its WebAssembly and data files by path: it stays an import from node_modules
 *   (as do `pg-native`, which `pg` only tries, and esbuild itself).
 * - piscina (the count pool, src/adapters/tokenizers/count-pool.ts) starts its threads from its
 *   own `worker.js`, found by `__dirname`, which a bundle does not have: it stays an import too.
 *
 * It also bundles the market console's vendor modules (`consoleVendor`): TypeScript entries in
 * src/console-vendor/ that import libraries (viem's EIP-712 recovery), each made one browser ES
 * module in `<dir>/src/console/vendor/`, served same-origin like the console's own files (its
 * CSP loads no script from elsewhere).
 */
import { readFileSync } from "node:fs";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath, URL } from "node:url";
import { build } from "esbuild";

const external = [
  "@electric-sql/pglite",
  "@electric-sql/pglite-socket",
  "pg-native",
  "esbuild",
  "piscina",
];

/** The bundles: entry files of the built tree, each replaced by its bundle. */
export const bundledEntries = ["src/cli/main.js", "bench/gateway.js"];

/** `import.meta.url` of each bundled file, pointed at the file it came from. */
function originalMetaUrl(bundleDir) {
  return {
    name: "original-import-meta-url",
    setup(b) {
      b.onLoad({ filter: /\.(m?js)$/ }, (args) => {
        const contents = readFileSync(args.path, "utf8");
        if (!contents.includes("import.meta.url")) return undefined;
        const path = relative(bundleDir, args.path).split(sep).join("/");
        const url = `new URL(${JSON.stringify(path.startsWith(".") ? path : `./${path}`)}, import.meta.url).href`;
        return {
          contents: contents.replaceAll("import.meta.url", url),
          loader: "js",
          resolveDir: dirname(args.path),
        };
      });
    },
  };
}

/** The console's vendor modules: entry (from the repository root) -> file under src/console/. */
export const consoleVendor = { "src/console-vendor/eip712.ts": "vendor/eip712.js" };

const root = fileURLToPath(new URL("..", import.meta.url));

/** The console's vendor modules into `<consoleDir>/vendor/` (minified, no source map: served). */
export async function bundleConsoleVendor(consoleDir) {
  for (const [entry, out] of Object.entries(consoleVendor)) {
    await build({
      entryPoints: [join(root, entry)],
      outfile: join(consoleDir, out),
      bundle: true,
      platform: "browser",
      format: "esm",
      target: "es2022",
      minify: true,
      // The libraries' licence comments stay in the file the browser loads.
      legalComments: "inline",
      logLevel: "warning",
    });
  }
}

export async function bundle(dir) {
  await bundleConsoleVendor(join(dir, "src", "console"));
  for (const entry of bundledEntries) {
    const file = join(dir, entry);
    await build({
      entryPoints: [file],
      outfile: file,
      allowOverwrite: true,
      bundle: true,
      platform: "node",
      format: "esm",
      target: "node20",
      sourcemap: "linked",
      // The file's own name stays (stack traces, `ps`); identifiers are kept for profiles.
      minifyWhitespace: true,
      minifySyntax: true,
      legalComments: "linked",
      external,
      banner: {
        js: 'import { createRequire as __gatewayCreateRequire } from "node:module"; const require = __gatewayCreateRequire(import.meta.url);',
      },
      plugins: [originalMetaUrl(dirname(file))],
      logLevel: "warning",
    });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [dir] = process.argv.slice(2);
  if (dir === undefined) {
    process.stderr.write("usage: node scripts/bundle.mjs <built dir>\n");
    process.exit(2);
  }
  await bundle(dir);
}
