import { endianness } from "node:os";
import { gunzipSync, gzipSync } from "node:zlib";
import { BaseError } from "../../../domain/base-error.js";

/**
 * Everything the Gemma 3 engine needs from a tokenizer.json, in typed arrays: a few MB that load
 * in milliseconds, where the JSON is 33 MB and takes longer than the engine's load budget just
 * to parse. The vocabulary's strings are not kept: BPE over characters needs only the ids of the
 * single characters, the byte-fallback ids, the merges as (left id, right id) -> (rank, result
 * id), the added tokens, and (for `split`) which adjacent characters a merge can ever join.
 */
export interface GemmaTable {
  /** Ids are 0..vocabSize-1 in the model's vocabulary (added tokens may lie beyond it). */
  readonly vocabSize: number;
  /** The vocabulary's single-character tokens: code points, ascending, and their ids. */
  readonly charCodePoints: Uint32Array;
  readonly charIds: Uint32Array;
  /** `<0x00>`..`<0xFF>`: the ids a character outside the vocabulary falls back to, byte by byte. */
  readonly byteIds: Uint32Array;
  /** Merges in rank order (rank = index): left id, right id, the id of their concatenation. */
  readonly mergeLeft: Uint32Array;
  readonly mergeRight: Uint32Array;
  readonly mergeResult: Uint32Array;
  /**
   * Adjacent code points (x, y) that some merge joins, x the last character of its left side
   * and y the first of its right side, ascending by (x, y): between two adjacent characters not
   * listed, no merge ever applies, so the text splits there exactly.
   */
  readonly joinLeft: Uint32Array;
  readonly joinRight: Uint32Array;
  /** Added tokens in file order; all are matched on the raw text (checked at derivation). */
  readonly addedTokens: readonly { readonly content: string; readonly id: number }[];
  /** The longest token of the vocabulary, in code points. */
  readonly maxTokenLength: number;
  /**
   * Characters c (of the BMP) whose runs merge greedily from the left into chunks of `length`:
   * (c, c) is a merge, each (c^k, c) for 2 <= k < length is a merge of a lower rank than (c, c),
   * c^length is `id`, and no merge has c^length on its left and a side starting with c on its
   * right. A run of c that starts a word then tokenizes as chunks of `length` from its start,
   * except within `maxTokenLength` of its end (see engine.ts).
   */
  readonly runs: readonly { readonly char: number; readonly length: number; readonly id: number }[];
}

/** A tokenizer.json this engine cannot reproduce exactly, or a table that is not one. */
export class GemmaTableError extends BaseError {
  override readonly name = "GemmaTableError";
  readonly reason = "gemma_table_invalid";
}

const spaceMark = "\u2581";

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function fail(message: string): never {
  throw new GemmaTableError(`gemma tokenizer: ${message}`);
}

/** Only the pipeline the engine implements: anything else would be counted differently. */
function checkPipeline(json: Record<string, unknown>): Record<string, unknown> {
  const normalizer = json["normalizer"];
  if (
    !isObject(normalizer) ||
    normalizer["type"] !== "Replace" ||
    !isObject(normalizer["pattern"]) ||
    normalizer["pattern"]["String"] !== " " ||
    normalizer["content"] !== spaceMark
  ) {
    fail('the normalizer must be Replace " " -> "\u2581"');
  }
  // Splitting on " " after every " " became "\u2581" never splits: the text is one word.
  const pre = json["pre_tokenizer"];
  const noOpSplit =
    isObject(pre) &&
    pre["type"] === "Split" &&
    isObject(pre["pattern"]) &&
    pre["pattern"]["String"] === " " &&
    pre["invert"] === false;
  if (pre !== null && !noOpSplit) fail('the pre-tokenizer must be absent or Split on " "');
  const model = json["model"];
  if (!isObject(model) || model["type"] !== "BPE") fail("the model must be BPE");
  const empty = (v: unknown) => v === null || v === undefined || v === "";
  if (!empty(model["dropout"])) fail("dropout is not supported");
  if (!empty(model["continuing_subword_prefix"]) || !empty(model["end_of_word_suffix"])) {
    fail("subword prefixes and suffixes are not supported");
  }
  if (model["byte_fallback"] !== true) fail("byte_fallback must be true");
  if (model["ignore_merges"] === true) fail("ignore_merges is not supported");
  return model;
}

function vocabularyOf(model: Record<string, unknown>): Map<string, number> {
  const vocab = model["vocab"];
  if (!isObject(vocab)) fail("model.vocab must be an object");
  const map = new Map<string, number>();
  for (const [token, id] of Object.entries(vocab)) {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0) fail(`bad id for ${token}`);
    map.set(token, id);
  }
  const seen = new Uint8Array(map.size);
  for (const id of map.values()) {
    if (id >= map.size || seen[id] === 1) fail("vocabulary ids must be 0..size-1, each once");
    seen[id] = 1;
  }
  return map;
}

function mergePair(entry: unknown): [string, string] {
  if (Array.isArray(entry) && entry.length === 2) {
    const [a, b] = entry as unknown[];
    if (typeof a === "string" && typeof b === "string") return [a, b];
  }
  if (typeof entry === "string") {
    const parts = entry.split(" ");
    if (parts.length === 2) return [parts[0]!, parts[1]!];
  }
  return fail(`bad merge ${JSON.stringify(entry)}`);
}

function lastCodePoint(s: string): number {
  const cp = s.codePointAt(s.length - 1)!;
  return cp >= 0xdc00 && cp <= 0xdfff && s.length >= 2 ? s.codePointAt(s.length - 2)! : cp;
}

function derivedMerges(model: Record<string, unknown>, vocab: Map<string, number>) {
  const merges = model["merges"];
  if (!Array.isArray(merges)) fail("model.merges must be an array");
  const count = merges.length;
  const left = new Uint32Array(count);
  const right = new Uint32Array(count);
  const result = new Uint32Array(count);
  const pairs = new Map<number, number>();
  const joins = new Set<number>();
  const byteToken = /^<0x[0-9A-F]{2}>$/;
  for (let rank = 0; rank < count; rank++) {
    const [a, b] = mergePair(merges[rank]);
    // Byte-fallback tokens stand for bytes, not for their own characters: a merge of one would
    // make the join analysis (below) wrong, so it is refused rather than mis-split.
    if (byteToken.test(a) || byteToken.test(b)) fail(`merge ${a} ${b} joins a byte token`);
    const l = vocab.get(a);
    const r = vocab.get(b);
    const x = vocab.get(a + b);
    if (l === undefined || r === undefined || x === undefined)
      fail(`merge ${a} ${b}: not in vocab`);
    // HF's merge map keeps the last rank of a pair listed twice; so does this table (below).
    const key = l * 0x40000 + r;
    const earlier = pairs.get(key);
    if (earlier !== undefined) left[earlier] = right[earlier] = result[earlier] = 0xffffffff;
    pairs.set(key, rank);
    left[rank] = l;
    right[rank] = r;
    result[rank] = x;
    joins.add(lastCodePoint(a) * 0x110000 + b.codePointAt(0)!);
  }
  const sorted = [...joins].sort((p, q) => p - q);
  const joinLeft = Uint32Array.from(sorted, (k) => Math.floor(k / 0x110000));
  const joinRight = Uint32Array.from(sorted, (k) => k % 0x110000);
  return { left, right, result, joinLeft, joinRight };
}

function derivedAddedTokens(json: Record<string, unknown>) {
  const added = json["added_tokens"];
  if (!Array.isArray(added)) fail("added_tokens must be an array");
  return added.map((token: unknown) => {
    if (!isObject(token) || typeof token["content"] !== "string" || token["content"] === "") {
      return fail("bad added token");
    }
    const { content, id } = token;
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0) fail(`bad id for ${content}`);
    // Matched on the raw text, leftmost-longest, as plain substrings: the only kind implemented.
    for (const flag of ["normalized", "lstrip", "rstrip", "single_word"]) {
      if (token[flag] !== false) fail(`added token ${content}: ${flag} must be false`);
    }
    return { content, id };
  });
}

function derivedRuns(model: Record<string, unknown>, vocab: Map<string, number>) {
  const ranks = new Map<string, number>();
  const blocked = new Set<string>(); // left sides of a merge whose right side starts with their character
  const merges = model["merges"] as unknown[];
  for (let rank = 0; rank < merges.length; rank++) {
    const [a, b] = mergePair(merges[rank]);
    ranks.set(`${a}\u0000${b}`, rank);
    const c = a.codePointAt(0)!;
    if (b.codePointAt(0) === c && [...a].every((x) => x.codePointAt(0) === c)) blocked.add(a);
  }
  const runs: { char: number; length: number; id: number }[] = [];
  for (const token of vocab.keys()) {
    if (token.length !== 1) continue;
    const pair = ranks.get(`${token}\u0000${token}`);
    if (pair === undefined) continue;
    let length = 2;
    let greedy = vocab.has(token.repeat(2));
    for (;;) {
      const rank = ranks.get(`${token.repeat(length)}\u0000${token}`);
      if (rank === undefined) break;
      if (rank >= pair || !vocab.has(token.repeat(length + 1))) greedy = false;
      if (!greedy) break;
      length++;
    }
    if (greedy && !blocked.has(token.repeat(length))) {
      runs.push({ char: token.charCodeAt(0), length, id: vocab.get(token.repeat(length))! });
    }
  }
  return runs.sort((p, q) => p.char - q.char);
}

/** The table of a parsed tokenizer.json; throws {@link GemmaTableError} for any other pipeline. */
export function deriveGemmaTable(tokenizerJson: unknown): GemmaTable {
  if (!isObject(tokenizerJson)) fail("not a tokenizer.json object");
  const model = checkPipeline(tokenizerJson);
  const vocab = vocabularyOf(model);
  if (vocab.size > 0x40000) fail("more than 2^18 tokens");
  const byteIds = new Uint32Array(256);
  for (let b = 0; b < 256; b++) {
    const id = vocab.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    // With every byte present, no character is ever unknown (fuse_unk and unk never apply).
    if (id === undefined) fail(`byte token ${b} missing`);
    byteIds[b] = id;
  }
  const chars: [number, number][] = [];
  for (const [token, id] of vocab) {
    const cp = token.codePointAt(0)!;
    if (token.length === (cp > 0xffff ? 2 : 1)) chars.push([cp, id]);
  }
  chars.sort((p, q) => p[0] - q[0]);
  const merges = derivedMerges(model, vocab);
  return {
    vocabSize: vocab.size,
    charCodePoints: Uint32Array.from(chars, (c) => c[0]),
    charIds: Uint32Array.from(chars, (c) => c[1]),
    byteIds,
    mergeLeft: merges.left,
    mergeRight: merges.right,
    mergeResult: merges.result,
    joinLeft: merges.joinLeft,
    joinRight: merges.joinRight,
    addedTokens: derivedAddedTokens(tokenizerJson),
    maxTokenLength: [...vocab.keys()].reduce((max, t) => Math.max(max, [...t].length), 0),
    runs: derivedRuns(model, vocab),
  };
}

const magic = 0x31544d47; // "GMT1"
/** The arrays in the order they are written; merges as 3-byte planes (ids < 2^24). */
const planes = ["mergeLeft", "mergeRight", "mergeResult"] as const;
const words = ["charCodePoints", "charIds", "byteIds", "joinLeft", "joinRight"] as const;

/**
 * The table as one gzip file: a JSON header (sizes, added tokens), then the arrays. The merges'
 * results are stored as differences from the previous rank's (they mostly ascend), and every
 * merge array as byte planes, which roughly halves the compressed size.
 */
export function serializeGemmaTable(table: GemmaTable): Buffer {
  const header = Buffer.from(
    JSON.stringify({
      vocabSize: table.vocabSize,
      merges: table.mergeLeft.length,
      chars: table.charIds.length,
      joins: table.joinLeft.length,
      addedTokens: table.addedTokens.map((t) => [t.content, t.id]),
      maxTokenLength: table.maxTokenLength,
      runs: table.runs.map((r) => [r.char, r.length, r.id]),
    }),
  );
  const parts: Buffer[] = [];
  const prefix = Buffer.alloc(8);
  prefix.writeUInt32LE(magic, 0);
  prefix.writeUInt32LE(header.length, 4);
  parts.push(prefix, header, Buffer.alloc((4 - (header.length % 4)) % 4));
  for (const name of words) parts.push(Buffer.from(Uint32Array.from(table[name]).buffer));
  const m = table.mergeLeft.length;
  for (const name of planes) {
    const values = table[name];
    const out = Buffer.alloc(m * 3);
    let previous = 0;
    for (let i = 0; i < m; i++) {
      let v = values[i]!;
      if (name === "mergeResult" && v !== 0xffffffff) {
        const d = v - previous;
        previous = v;
        v = d >= 0 ? 2 * d : -2 * d - 1; // zigzag
      }
      if (v === 0xffffffff) v = 0xffffff; // a pair listed again later: never looked up
      for (let b = 0; b < 3; b++) out[b * m + i] = (v >>> (8 * b)) & 0xff;
    }
    parts.push(out);
  }
  return gzipSync(Buffer.concat(parts), { level: 9 });
}

/** The inverse of {@link serializeGemmaTable}. */
export function parseGemmaTable(file: Uint8Array): GemmaTable {
  // The arrays are read as they lie: little-endian (every platform Node ships for today).
  if (endianness() !== "LE") fail("a big-endian host is not supported");
  const bytes = gunzipSync(file);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 8 || view.getUint32(0, true) !== magic) fail("not a Gemma table");
  const headerLength = view.getUint32(4, true);
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString()) as {
    vocabSize: number;
    merges: number;
    chars: number;
    joins: number;
    addedTokens: [string, number][];
    maxTokenLength: number;
    runs: [number, number, number][];
  };
  let offset = 8 + headerLength + ((4 - (headerLength % 4)) % 4);
  const takeWords = (n: number) => {
    // A copy: aligned, and not holding the whole decompressed buffer alive.
    const out = new Uint32Array(n);
    new Uint8Array(out.buffer).set(bytes.subarray(offset, offset + 4 * n));
    offset += 4 * n;
    return out;
  };
  const m = header.merges;
  const takePlanes = (zigzag: boolean) => {
    const out = new Uint32Array(m);
    let previous = 0;
    for (let i = 0; i < m; i++) {
      let v =
        bytes[offset + i]! | (bytes[offset + m + i]! << 8) | (bytes[offset + 2 * m + i]! << 16);
      if (v === 0xffffff) v = 0xffffffff;
      else if (zigzag) {
        previous += v & 1 ? -(v + 1) / 2 : v / 2;
        v = previous;
      }
      out[i] = v;
    }
    offset += 3 * m;
    return out;
  };
  const charCodePoints = takeWords(header.chars);
  const charIds = takeWords(header.chars);
  const byteIds = takeWords(256);
  const joinLeft = takeWords(header.joins);
  const joinRight = takeWords(header.joins);
  const mergeLeft = takePlanes(false);
  const mergeRight = takePlanes(false);
  const mergeResult = takePlanes(true);
  if (offset !== bytes.length) fail("table length does not match its header");
  return {
    vocabSize: header.vocabSize,
    charCodePoints,
    charIds,
    byteIds,
    mergeLeft,
    mergeRight,
    mergeResult,
    joinLeft,
    joinRight,
    addedTokens: header.addedTokens.map(([content, id]) => ({ content, id })),
    maxTokenLength: header.maxTokenLength,
    runs: header.runs.map(([char, length, id]) => ({ char, length, id })),
  };
}
