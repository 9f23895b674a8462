/**
 * Writes the embedded tokenizers' derived rank tables (src/adapters/tokenizers/derived.ts) and
 * their manifest into src/adapters/tokenizers/default/derived/: run after a pinned
 * tokenizer.json changes (derived.test.ts fails until then).
 *
 *   node --import tsx scripts/derive-tokenizers.ts
 */
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import {
  byteLevelBpeUnsupported,
  type TokenizerJson,
} from "../src/adapters/tokenizers/byte-level-bpe.js";
import {
  deriveTable,
  derivedDir,
  type DerivedManifest,
} from "../src/adapters/tokenizers/derived.js";
import { loadTokenizerRegistry } from "../src/adapters/tokenizers/registry.js";

const manifest: Record<string, DerivedManifest[string]> = {};
mkdirSync(derivedDir, { recursive: true });
for (const entry of loadTokenizerRegistry().tokenizers.values()) {
  if (manifest[entry.sha256] !== undefined) continue;
  const json = JSON.parse(readFileSync(entry.tokenizer, "utf8")) as TokenizerJson;
  if (byteLevelBpeUnsupported(json) !== undefined) continue;
  const table = deriveTable(json);
  const file = `${entry.name}.bpe`;
  writeFileSync(`${derivedDir}${file}`, table);
  manifest[entry.sha256] = { file, sha256: createHash("sha256").update(table).digest("hex") };
  process.stdout.write(`${file}: ${table.length} bytes\n`);
}
writeFileSync(`${derivedDir}manifest.json`, `${JSON.stringify(manifest, null, 2)}\n`);
