import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ByteLevelBpe, byteLevelBpeUnsupported, type TokenizerJson } from "./byte-level-bpe.js";
import { deriveTable, derivedDir, loadDerived, readManifest } from "./derived.js";
import { loadTokenizerRegistry } from "./registry.js";

/**
 * The embedded derived rank tables are what their pinned tokenizer.json gives (derived again
 * here: `node --import tsx scripts/derive-tokenizers.ts` writes them), pinned by their own
 * SHA-256, and an engine over one encodes as an engine over the JSON does.
 */

const manifest = readManifest();
const entries = [...loadTokenizerRegistry().tokenizers.values()].filter(
  (entry, i, all) => all.findIndex((e) => e.sha256 === entry.sha256) === i,
);

describe.each(entries.map((entry) => ({ name: entry.name, entry })))("$name", ({ entry }) => {
  it("has a derived table exactly when its tokenizer is byte-level, equal to one derived now", async () => {
    const json = JSON.parse(readFileSync(entry.tokenizer, "utf8")) as TokenizerJson;
    const pin = manifest[entry.sha256];
    if (byteLevelBpeUnsupported(json) !== undefined) {
      expect(pin).toBeUndefined();
      return;
    }
    expect(pin).toBeDefined();
    const table = deriveTable(json);
    const committed = readFileSync(`${derivedDir}${pin!.file}`);
    expect(createHash("sha256").update(table).digest("hex")).toBe(pin!.sha256);
    expect(createHash("sha256").update(committed).digest("hex")).toBe(pin!.sha256);
    const derived = (await loadDerived(entry.sha256, manifest))!;
    const fromTable = new ByteLevelBpe(derived.json, {}, derived.vocab);
    const fromJson = new ByteLevelBpe(json);
    const text = 'Hello, world! 你好 <|im_end|> 12345 don\'t  \r\n\t{"a":[1,2]} 👩‍👩‍👧';
    expect(fromTable.encode(text)).toEqual(fromJson.encode(text));
    expect(fromTable.addedTokens).toEqual(fromJson.addedTokens);
  }, 60_000);
});

it("refuses a derived table whose bytes are not the ones pinned", async () => {
  const [sha256, pin] = Object.entries(manifest)[0]!;
  await expect(
    loadDerived(sha256, { [sha256]: { ...pin, sha256: "0".repeat(64) } }),
  ).rejects.toThrow(/has sha256 [0-9a-f]{64}, the manifest pins 0{64}/);
});
