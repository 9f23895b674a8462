import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { vocabFromJson, type TokenizerJson } from "./byte-level-bpe.js";
import { ByteVocab } from "./byte-vocab.js";

/**
 * Derived rank tables (issue 35: a tokenizer loads in well under 0.5 s): what the byte-level
 * engine reads of a tokenizer.json (its pre-tokenizer, normalizer, added tokens, and the
 * vocabulary as bytes by id), written ahead of time by `scripts/derive-tokenizers.ts` for the
 * embedded tokenizers, so a load reads a few megabytes of bytes instead of parsing 8 to 27 MB of
 * JSON (the merges the engine never needs). Each file is pinned by its own SHA-256 in the
 * manifest, keyed by the SHA-256 of the tokenizer.json it was derived from, and
 * derived.test.ts derives each again from the pinned tokenizer.json and compares. A tokenizer
 * with no derived table (an operator's) is derived at load.
 *
 * Format: "BPE1", the header's length (u32 LE) and the header (JSON: the tokenizer.json without
 * its vocabulary and merges), the number of ids (u32 LE), each id's length in bytes (u16 LE; 0:
 * no byte-level token has the id), then the tokens' bytes end to end.
 */

const magic = "BPE1";

/** The folder of the embedded derived tables and their manifest. */
export const derivedDir = fileURLToPath(new URL("./default/derived/", import.meta.url));

/** The manifest: tokenizer.json SHA-256 -> its derived table's file and SHA-256. */
export type DerivedManifest = Record<string, { readonly file: string; readonly sha256: string }>;

export function readManifest(): DerivedManifest {
  try {
    return JSON.parse(readFileSync(`${derivedDir}manifest.json`, "utf8")) as DerivedManifest;
  } catch {
    return {};
  }
}

/** The derived table of a parsed tokenizer.json. */
export function deriveTable(json: TokenizerJson): Buffer {
  const header = Buffer.from(
    JSON.stringify({
      added_tokens: json.added_tokens,
      normalizer: json.normalizer,
      pre_tokenizer: json.pre_tokenizer,
      model: {
        type: json.model.type,
        ignore_merges: json.model.ignore_merges,
        byte_fallback: json.model.byte_fallback,
      },
    }),
  );
  const vocab = vocabFromJson(json.model.vocab);
  const count = vocab.ends.length - 1;
  const lengths = Buffer.alloc(2 * count);
  for (let id = 0; id < count; id += 1)
    lengths.writeUInt16LE(vocab.ends[id + 1]! - vocab.ends[id]!, 2 * id);
  const sizes = Buffer.alloc(8);
  sizes.writeUInt32LE(header.length, 0);
  const countBytes = Buffer.alloc(4);
  countBytes.writeUInt32LE(count, 0);
  return Buffer.concat([
    Buffer.from(magic),
    sizes.subarray(0, 4),
    header,
    countBytes,
    lengths,
    Buffer.from(vocab.bytes.buffer, vocab.bytes.byteOffset, vocab.bytes.byteLength),
  ]);
}

/** A derived table read back: the tokenizer.json's parts and its vocabulary. */
export function readTable(table: Buffer): { json: TokenizerJson; vocab: ByteVocab } {
  if (table.toString("latin1", 0, 4) !== magic) throw new Error("not a derived rank table");
  const headerLength = table.readUInt32LE(4);
  let at = 8;
  const header = JSON.parse(table.toString("utf8", at, at + headerLength)) as Omit<
    TokenizerJson,
    "model"
  > & { model: Omit<TokenizerJson["model"], "vocab"> };
  at += headerLength;
  const count = table.readUInt32LE(at);
  at += 4;
  const ends = new Uint32Array(count + 1);
  for (let id = 0; id < count; id += 1) ends[id + 1] = ends[id]! + table.readUInt16LE(at + 2 * id);
  at += 2 * count;
  const bytes = new Uint8Array(table.subarray(at, at + ends[count]!));
  return {
    json: { ...header, model: { ...header.model, vocab: {} } },
    vocab: ByteVocab.of(bytes, ends),
  };
}

/**
 * The embedded derived table of the tokenizer.json with this SHA-256, checked against the
 * manifest's pin; undefined when there is none.
 */
export async function loadDerived(
  tokenizerSha256: string,
  manifest: DerivedManifest = readManifest(),
): Promise<{ json: TokenizerJson; vocab: ByteVocab } | undefined> {
  const pin = manifest[tokenizerSha256];
  if (pin === undefined) return undefined;
  const table = await readFile(`${derivedDir}${pin.file}`);
  const actual = createHash("sha256").update(table).digest("hex");
  if (actual !== pin.sha256) {
    throw new Error(
      `derived rank table ${pin.file} has sha256 ${actual}, the manifest pins ${pin.sha256}`,
    );
  }
  return readTable(table);
}
