import { createAddedTokenMatcher } from "./added-tokens.js";
import { createMerger, indexMerges } from "./bpe.js";
import type { TokenizerEngine } from "../engine.js";
import { deriveGemmaTable, type GemmaTable } from "./table.js";
import { createRunChunks } from "./runs.js";
import { createWordCache } from "./word-cache.js";

/**
 * An exact engine for Gemma 3's tokenizer.json (and any with the same pipeline, checked when the
 * table is derived): added tokens matched on the raw text; the rest normalized (" " -> "\u2581")
 * and, the pre-tokenizer never splitting, merged as one BPE word with byte fallback, exactly as
 * Hugging Face's `tokenizers` does.
 *
 * One word can be the whole text, but between two adjacent characters that no merge joins
 * (the table's join pairs: most "x\u2581" boundaries, so most words of prose and code) no merge
 * ever applies, and the tokens on either side are those of each side alone. The engine splits
 * there: a word is merged alone (and cached), a long run that no boundary breaks (CJK, a run of
 * one character) with a priority queue in O(n log n).
 */
export function createGemmaEngine(tokenizerJson: unknown): TokenizerEngine {
  return createGemmaEngineFromTable(deriveGemmaTable(tokenizerJson));
}

const space = 0x20;
const spaceMark = 0x2581;
const replacement = 0xfffd;
/** Words up to this many UTF-16 code units are cached by their text. */
const cachedWordLength = 32;
/** Words whose counts are cached. */
const cacheSlots = 1 << 16;

/** The ids of the vocabulary's characters: a table for the BMP, a map for the rest. */
function characterIds(table: GemmaTable) {
  const bmp = new Int32Array(0x10000).fill(-1);
  const astral = new Map<number, number>();
  for (let i = 0; i < table.charIds.length; i++) {
    const cp = table.charCodePoints[i]!;
    if (cp < 0x10000) bmp[cp] = table.charIds[i]!;
    else astral.set(cp, table.charIds[i]!);
  }
  return { bmp, astral };
}

export function createGemmaEngineFromTable(table: GemmaTable): TokenizerEngine {
  const { bmp, astral } = characterIds(table);
  const byteIds = Int32Array.from(table.byteIds);
  const joins = createJoinSet(table.joinLeft, table.joinRight);
  const merger = createMerger(indexMerges(table));
  const added = createAddedTokenMatcher(table.addedTokens);
  const runs = createRunChunks(table);
  const tokenStart = new Uint8Array(0x10000);
  for (const { content } of table.addedTokens) tokenStart[content.charCodeAt(0)] = 1;

  const shared = new Int32Array(3 * 4096);
  /** The symbols of the last word read by `symbols` (a long word's own array, not kept). */
  let sym = shared;
  /** The word text[a..b) as initial symbols in `sym`; returns their number. */
  function symbols(text: string, a: number, b: number): number {
    // At most 3 symbols per UTF-16 code unit (3 bytes of a BMP character outside the vocabulary).
    sym = 3 * (b - a) <= shared.length ? shared : new Int32Array(3 * (b - a));
    let n = 0;
    for (let i = a; i < b;) {
      const cp = codePointAt(text, i, b);
      i += cp > 0xffff ? 2 : 1;
      const c = cp === space ? spaceMark : cp;
      const id = c < 0x10000 ? bmp[c]! : (astral.get(c) ?? -1);
      if (id >= 0) sym[n++] = id;
      else n = pushUtf8Bytes(c, byteIds, sym, n);
    }
    return n;
  }

  const cache = createWordCache(cacheSlots);
  function countWord(text: string, a: number, b: number): number {
    const cacheable = b - a <= cachedWordLength;
    if (cacheable) {
      const cached = cache.get(text, a, b);
      if (cached >= 0) return cached;
    }
    const length = symbols(text, a, b);
    const n = merger.merge(sym, length);
    if (cacheable) cache.set(text, a, b, n);
    return n;
  }

  /**
   * The end of the piece that starts at `start`: an added token's end, negated (-end), when one
   * starts there; else the end of the word, where the next character is one no merge joins to
   * the word's last, or an added token starts.
   */
  function pieceEnd(text: string, start: number, to: number): number {
    if (tokenStart[text.charCodeAt(start)] === 1) {
      const length = added.longestAt(text, start);
      if (length > 0) return -(start + length);
    }
    let prev = codePointAt(text, start, to);
    let i = start + (prev > 0xffff ? 2 : 1);
    while (i < to) {
      const code = text.charCodeAt(i);
      if (tokenStart[code] === 1 && added.longestAt(text, i) > 0) return i;
      const cp = code < 0xd800 || code > 0xdfff ? code : codePointAt(text, i, to);
      if (!joins.has(prev, cp)) return i;
      prev = cp;
      i += cp > 0xffff ? 2 : 1;
    }
    return to;
  }

  function count(text: string): number {
    let total = 0;
    for (let i = 0; i < text.length;) {
      const end = pieceEnd(text, i, text.length);
      if (end < 0) {
        total += 1;
        i = -end;
      } else {
        const chunks = runs.leading(text, i, end);
        total += chunks + countWord(text, i + chunks * runs.length(text.charCodeAt(i)), end);
        i = end;
      }
    }
    return total;
  }

  function encode(text: string): number[] {
    const ids: number[] = [];
    for (let i = 0; i < text.length;) {
      const end = pieceEnd(text, i, text.length);
      if (end < 0) {
        ids.push(added.matchedId());
        i = -end;
      } else {
        const chunks = runs.leading(text, i, end);
        for (let k = 0; k < chunks; k++) ids.push(runs.id(text.charCodeAt(i)));
        const length = symbols(text, i + chunks * runs.length(text.charCodeAt(i)), end);
        const n = merger.merge(sym, length);
        for (let k = 0; k < n; k++) ids.push(sym[k]!);
        i = end;
      }
    }
    return ids;
  }

  /**
   * Pieces: added tokens and words, as `count` sees them. Each counts alone as it does in the
   * text: no added token starts inside a word (it would have been matched there), and no merge
   * crosses a word's end (no merge's sides end and start with those two characters).
   *
   * Appending text changes no piece but the last: a match of an added token that starts before
   * the first position p where text[p..] is a proper prefix of an added token is the same after
   * any append (leftmost-longest cannot reach further back), so no boundary up to p moves.
   * Boundaries after p are not used (that tail stays one piece), nor the one before a final lone
   * high surrogate, whose low half may arrive next and make it another character.
   */
  function split(text: string): string[] {
    if (text.length === 0) return [];
    // A suffix that may still become an added token stays in the last piece, and so does a
    // final lone high surrogate (its pair may follow): no boundary after `hold`.
    const pending = added.pendingFrom(text, 0);
    let hold = pending < 0 ? text.length - 1 : pending;
    const last = text.charCodeAt(text.length - 1);
    if (last >= 0xd800 && last <= 0xdbff) hold = Math.min(hold, text.length - 2);
    const pieces: string[] = [];
    let start = 0;
    for (let i = 0; i < text.length;) {
      const signed = pieceEnd(text, i, text.length);
      const end = Math.abs(signed);
      // Only the run before `hold`: an added token may yet start there and end the word.
      const runEnd = pending < 0 ? end : Math.min(end, pending);
      const chunks = signed > 0 ? runs.leading(text, i, runEnd) : 0;
      const chunk = runs.length(text.charCodeAt(i));
      for (let k = 1; k <= chunks && i + k * chunk <= hold; k++) {
        pieces.push(text.slice(start, i + k * chunk));
        start = i + k * chunk;
      }
      if (end > hold) break;
      pieces.push(text.slice(start, end));
      start = i = end;
    }
    pieces.push(text.slice(start));
    return pieces;
  }

  return { encode, count, split, addedTokens: added.contents };
}

/** The code point at i (a lone surrogate reads as U+FFFD, as the native binding converts it). */
function codePointAt(text: string, i: number, end: number): number {
  const c = text.charCodeAt(i);
  if (c < 0xd800 || c > 0xdfff) return c;
  if (c <= 0xdbff && i + 1 < end) {
    const d = text.charCodeAt(i + 1);
    if (d >= 0xdc00 && d <= 0xdfff) return ((c - 0xd800) << 10) + (d - 0xdc00) + 0x10000;
  }
  return replacement;
}

function pushUtf8Bytes(cp: number, byteIds: Int32Array, sym: Int32Array, n: number): number {
  if (cp < 0x80) sym[n++] = byteIds[cp]!;
  else if (cp < 0x800) {
    sym[n++] = byteIds[0xc0 | (cp >> 6)]!;
    sym[n++] = byteIds[0x80 | (cp & 0x3f)]!;
  } else if (cp < 0x10000) {
    sym[n++] = byteIds[0xe0 | (cp >> 12)]!;
    sym[n++] = byteIds[0x80 | ((cp >> 6) & 0x3f)]!;
    sym[n++] = byteIds[0x80 | (cp & 0x3f)]!;
  } else {
    sym[n++] = byteIds[0xf0 | (cp >> 18)]!;
    sym[n++] = byteIds[0x80 | ((cp >> 12) & 0x3f)]!;
    sym[n++] = byteIds[0x80 | ((cp >> 6) & 0x3f)]!;
    sym[n++] = byteIds[0x80 | (cp & 0x3f)]!;
  }
  return n;
}

/**
 * The join pairs as a set: a table for pairs of Latin-1 characters and "\u2581" (most text),
 * an open-addressing hash for the rest. `has` takes raw code points (" " reads as "\u2581").
 */
function createJoinSet(left: Uint32Array, right: Uint32Array) {
  // " " never remains after normalization, so its slot stands for "\u2581".
  const small = (cp: number) =>
    cp < 0x100 ? (cp === space ? -1 : cp) : cp === spaceMark ? space : -1;
  const latin = new Uint8Array(0x10000);
  let bits = 4;
  while (1 << bits < 2 * left.length) bits++;
  const mask = (1 << bits) - 1;
  const keys = new Float64Array(1 << bits).fill(-1);
  const slot = (x: number, y: number) =>
    ((Math.imul(x, 0x9e3779b1) ^ Math.imul(y + 0x7f4a7c15, 0x85ebca6b)) >>> (32 - bits)) & mask;
  for (let i = 0; i < left.length; i++) {
    const x = left[i]!;
    const y = right[i]!;
    const sx = small(x);
    const sy = small(y);
    if (sx >= 0 && sy >= 0) latin[(sx << 8) | sy] = 1;
    const key = x * 0x110000 + y;
    let s = slot(x, y);
    while (keys[s] !== -1 && keys[s] !== key) s = (s + 1) & mask;
    keys[s] = key;
  }
  return {
    has(x: number, y: number): boolean {
      if (x < 0x100 && y < 0x100) return latin[(x << 8) | y] === 1;
      if (x === space) x = spaceMark;
      if (y === space) y = spaceMark;
      const key = x * 0x110000 + y;
      for (let s = slot(x, y); ; s = (s + 1) & mask) {
        const k = keys[s]!;
        if (k === key) return true;
        if (k === -1) return false;
      }
    },
  };
}
