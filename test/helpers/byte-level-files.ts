import { readFileSync } from "node:fs";
import type { TokenizerJson } from "../../src/adapters/tokenizers/byte-level-bpe.js";
import { loadTokenizerRegistry } from "../../src/adapters/tokenizers/registry.js";

/**
 * The embedded byte-level BPE tokenizers, one entry per file (Llama 3 and 3.1 share theirs):
 * the file's path and the first model's name that uses it. Byte-fallback files (Gemma's) are
 * another engine's.
 */
export function byteLevelTokenizerFiles(): { file: string; name: string }[] {
  const files = new Map<string, string>();
  for (const entry of loadTokenizerRegistry().tokenizers.values()) {
    const json = JSON.parse(readFileSync(entry.tokenizer, "utf8")) as TokenizerJson;
    if (json.model.byte_fallback !== true && !files.has(entry.tokenizer)) {
      files.set(entry.tokenizer, entry.name);
    }
  }
  return [...files].map(([file, name]) => ({ file, name }));
}
