import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { createGemmaEngineFromTable } from "./engine.js";
import type { TokenizerEngine } from "../engine.js";
import { GemmaTableError, parseGemmaTable } from "./table.js";

/**
 * The table derived from Gemma 3's tokenizer.json by derive-table.ts, shipped beside this file
 * (read by path: the production build, scripts/build.mjs, copies it beside load.js).
 */
export const gemmaTableFile = fileURLToPath(new URL("./gemma3-table.gz", import.meta.url));
/** The SHA-256 of {@link gemmaTableFile}: a changed table is a load error, not another count. */
export const gemmaTableSha256 = "cbc2852e83869edb574d417fb6c9b301bb576e1f0102756e6b158029ce9fa8ee";
/** The SHA-256 of the tokenizer.json it is derived from (the registry's pin for `gemma3`). */
export const gemmaTableSourceSha256 =
  "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795";

/**
 * The Gemma 3 engine from the shipped table: a few tens of milliseconds, where parsing the
 * 33 MB tokenizer.json alone takes most of a second. `sha256` pins another table file.
 */
export function loadGemmaEngine(
  file: string = gemmaTableFile,
  sha256: string = gemmaTableSha256,
): TokenizerEngine {
  const bytes = readFileSync(file);
  const actual = createHash("sha256").update(bytes).digest("hex");
  if (actual !== sha256) {
    throw new GemmaTableError(`${file}: sha256 ${actual}, pinned ${sha256}`);
  }
  return createGemmaEngineFromTable(parseGemmaTable(bytes));
}
