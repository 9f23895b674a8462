import { mergeBytes } from "./bpe-merge.js";
import { ByteVocab } from "./byte-vocab.js";
import { mayNormalize, nfcBlocks } from "./nfc-blocks.js";
import type { TokenizerEngine } from "./engine.js";

/**
 * The counting engine of the byte-level BPE tokenizers (Llama 3, Qwen 3, DeepSeek V3, gpt-oss;
 * issue 35): tiktoken's algorithm over a tokenizer.json. The rank of a token is its id, its
 * bytes come from the GPT-2 byte map (the vocabulary's keys are those bytes, mapped), and the
 * text is cut first at the added tokens (as Hugging Face's tokenizers does: the text between two
 * of them is tokenized on its own), then normalized (Qwen 3: NFC), then split by the file's own
 * pre-tokenizer regular expressions (several in sequence for DeepSeek), and each piece is merged
 * pair by pair, lowest rank first. No token crosses a piece, so count(text) is the sum of its
 * pieces' counts: pieces are cached across requests, and so is the text between two added tokens
 * when it is long (an agent's history repeats from one request to the next).
 *
 * Merging is a priority queue over a linked list of the piece's tokens: O(n log n) in the
 * piece's bytes, for every text (tiktoken's own loop is quadratic on a long piece: a megabyte of
 * one CJK run, of one letter, of spaces). Short pieces, the common case, use tiktoken's loop,
 * faster below a few dozen bytes; both pick the same merges (the lowest rank, leftmost first).
 *
 * The native `tokenizers` binding is the tests' reference (byte-level-bpe.test.ts): ids equal on
 * the corpus and under a property over random texts.
 */

/** The parts of a tokenizer.json this engine reads. */
export interface TokenizerJson {
  readonly added_tokens?: readonly AddedTokenJson[];
  readonly normalizer?: { readonly type: string; readonly normalizers?: readonly unknown[] } | null;
  readonly pre_tokenizer?: PreTokenizerJson | null;
  readonly model: {
    readonly type: string;
    readonly vocab: Readonly<Record<string, number>>;
    readonly ignore_merges?: boolean;
    readonly byte_fallback?: boolean;
  };
}

interface AddedTokenJson {
  readonly id: number;
  readonly content: string;
  readonly single_word?: boolean;
  readonly lstrip?: boolean;
  readonly rstrip?: boolean;
}

interface PreTokenizerJson {
  readonly type: string;
  readonly pretokenizers?: readonly PreTokenizerJson[];
  readonly pattern?: { readonly Regex?: string; readonly String?: string };
  readonly behavior?: string;
  readonly invert?: boolean;
  readonly use_regex?: boolean;
  readonly add_prefix_space?: boolean;
}

/** Why a tokenizer.json is not one this engine counts exactly (undefined: it is). */
export function byteLevelBpeUnsupported(json: TokenizerJson): string | undefined {
  if (json.model.type !== "BPE") return `model ${json.model.type}`;
  if (json.model.byte_fallback === true) return "byte_fallback";
  const normalizer = json.normalizer;
  if (
    normalizer != null &&
    normalizer.type !== "NFC" &&
    !(normalizer.type === "Sequence" && (normalizer.normalizers ?? []).length === 0)
  ) {
    return `normalizer ${normalizer.type}`;
  }
  const pre = json.pre_tokenizer;
  if (pre == null || pre.type !== "Sequence") return "pre-tokenizer other than a Sequence";
  const steps = pre.pretokenizers ?? [];
  const last = steps[steps.length - 1];
  if (last?.type !== "ByteLevel" || last.use_regex !== false || last.add_prefix_space === true) {
    return "no ByteLevel step (without its own regex) last";
  }
  for (const step of steps.slice(0, -1)) {
    if (
      step.type !== "Split" ||
      step.pattern?.Regex === undefined ||
      step.behavior !== "Isolated" ||
      step.invert === true
    ) {
      return `pre-tokenizer step ${step.type} (${step.behavior ?? ""})`;
    }
  }
  for (const token of json.added_tokens ?? []) {
    if (token.lstrip === true || token.rstrip === true || token.single_word === true) {
      return `added token ${token.content} strips or matches single words`;
    }
  }
  return undefined;
}

/** GPT-2's map of bytes to printable characters: the vocabulary's keys are bytes so mapped. */
function byteToChar(): string[] {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b += 1) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b += 1) printable.push(b);
  for (let b = 0xae; b <= 0xff; b += 1) printable.push(b);
  const chars = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b += 1) {
    chars[b] = String.fromCharCode(printable.includes(b) ? b : 256 + extra++);
  }
  return chars;
}

const byteChars = byteToChar();

/** The vocabulary's keys (bytes through the GPT-2 map) as bytes, by id, in typed arrays. */
export function vocabFromJson(vocab: Readonly<Record<string, number>>): ByteVocab {
  const charToByte = new Map(byteChars.map((char, byte) => [char.charCodeAt(0), byte]));
  const isBytes = (key: string) => {
    for (let i = 0; i < key.length; i += 1) if (!charToByte.has(key.charCodeAt(i))) return false;
    return true;
  };
  let maxId = -1;
  const keys: (string | undefined)[] = [];
  for (const [key, id] of Object.entries(vocab)) {
    maxId = Math.max(maxId, id);
    // A key that is no bytes through the map (DeepSeek's added tokens, also in its vocabulary)
    // is never made by merging: it is matched as an added token, before merging.
    if (isBytes(key)) keys[id] = key;
  }
  const ends = new Uint32Array(maxId + 2);
  for (let id = 0; id <= maxId; id += 1) ends[id + 1] = ends[id]! + (keys[id]?.length ?? 0);
  const bytes = new Uint8Array(ends[maxId + 1]!);
  for (let id = 0; id <= maxId; id += 1) {
    const key = keys[id];
    if (key === undefined) continue;
    for (let i = 0; i < key.length; i += 1)
      bytes[ends[id]! + i] = charToByte.get(key.charCodeAt(i))!;
  }
  return ByteVocab.of(bytes, ends);
}

/**
 * A Hugging Face (Oniguruma) pattern as a JavaScript one: inline case-insensitive groups
 * (`(?i:'s|'t)`), which Node 20's V8 rejects, spelled out letter by letter with every character
 * that folds to the letter (`'[sSſ]`), as Oniguruma's Unicode case folding matches them.
 */
export function toJsPattern(pattern: string): string {
  return pattern.replace(/\(\?i:((?:[^()\\]|\\.)*)\)/g, (_, body: string) => {
    let out = "(?:";
    for (let i = 0; i < body.length; i += 1) {
      const char = body[i]!;
      if (char === "\\") {
        out += body.slice(i, i + 2);
        i += 1;
      } else if (/\p{L}/u.test(char)) {
        const folds = new Set([char, char.toLowerCase(), char.toUpperCase()]);
        for (const other of ["ſ", "K", "ı", "İ", "Å", "ß", "ẞ"]) {
          if (new RegExp(`^${char}$`, "iu").test(other)) folds.add(other);
        }
        out += folds.size === 1 ? char : `[${[...folds].join("")}]`;
      } else {
        out += char;
      }
    }
    return `${out})`;
  });
}

/**
 * A cache that forgets the least recently used entries roughly: two generations, the current
 * one promoted from the previous on a hit; once the current one is full, the previous is
 * dropped. Bounded by twice its capacity (entries, or a weight such as characters).
 */
class GenerationCache<V> {
  private current = new Map<string, V>();
  private previous = new Map<string, V>();
  private weight = 0;
  constructor(
    private readonly capacity: number,
    private readonly weigh: (key: string) => number = () => 1,
  ) {}

  get(key: string): V | undefined {
    const hit = this.current.get(key);
    if (hit !== undefined) return hit;
    const old = this.previous.get(key);
    if (old !== undefined) this.set(key, old);
    return old;
  }

  set(key: string, value: V): void {
    if (this.weight >= this.capacity) {
      this.previous = this.current;
      this.current = new Map();
      this.weight = 0;
    }
    this.current.set(key, value);
    this.weight += this.weigh(key);
  }
}

/** Sizes of a {@link ByteLevelBpe}'s caches. */
export interface BpeCacheOptions {
  /** Distinct pieces whose counts are kept (per generation: up to twice as many). */
  readonly pieces?: number;
  /** Characters of text between added tokens whose counts are kept (likewise). */
  readonly segmentChars?: number;
  /** Text between added tokens shorter than this is not cached whole (its pieces are). */
  readonly segmentMinChars?: number;
}

/** Pieces longer than this (in characters) are not cached one by one. */
const maxCachedPiece = 256;

export class ByteLevelBpe implements TokenizerEngine {
  readonly addedTokens: readonly string[];
  private readonly vocab: ByteVocab;
  /** The piece being merged, as UTF-8 (grown as needed). */
  private buffer = new Uint8Array(1024);
  private readonly ignoreMerges: boolean;
  private readonly nfc: boolean;
  private readonly patterns: readonly RegExp[];
  private readonly addedIds: Map<string, number>;
  /** Added tokens by their first UTF-16 unit, longest first (leftmost-longest matching). */
  private readonly addedByFirst = new Map<number, string[]>();
  /** 1 for a UTF-16 unit some added token starts with (the scan's fast test). */
  private readonly addedFirst = new Uint8Array(65536);
  private readonly pieceCounts: GenerationCache<number>;
  private readonly segmentCounts: GenerationCache<number>;
  private readonly segmentMinChars: number;

  constructor(
    json: TokenizerJson,
    cache: BpeCacheOptions = {},
    /** The vocabulary already as bytes (a derived table, derived.ts): json's is not read. */
    vocab?: ByteVocab,
  ) {
    const why = byteLevelBpeUnsupported(json);
    if (why !== undefined) throw new Error(`not a byte-level BPE tokenizer: ${why}`);
    this.vocab = vocab ?? vocabFromJson(json.model.vocab);
    this.ignoreMerges = json.model.ignore_merges === true;
    this.nfc = json.normalizer?.type === "NFC";
    this.patterns = (json.pre_tokenizer?.pretokenizers ?? [])
      .filter((step) => step.type === "Split")
      .map((step) => new RegExp(toJsPattern(step.pattern!.Regex!), "gu"));
    this.addedIds = new Map((json.added_tokens ?? []).map((t) => [t.content, t.id]));
    this.addedTokens = [...this.addedIds.keys()];
    for (const token of [...this.addedTokens].sort((a, b) => b.length - a.length)) {
      if (token === "") continue;
      const first = token.charCodeAt(0);
      const list = this.addedByFirst.get(first) ?? [];
      list.push(token);
      this.addedByFirst.set(first, list);
      this.addedFirst[first] = 1;
    }
    this.pieceCounts = new GenerationCache(cache.pieces ?? 32_768);
    this.segmentCounts = new GenerationCache(
      cache.segmentChars ?? 2 * 1024 * 1024,
      (k) => k.length,
    );
    this.segmentMinChars = cache.segmentMinChars ?? 512;
  }

  encode(text: string): number[] {
    const ids: number[] = [];
    this.forEachSegment(text, (segment, added) => {
      if (added !== undefined) {
        ids.push(this.addedIds.get(added)!);
        return;
      }
      for (const piece of this.prePieces(this.normalize(segment))) this.mergePiece(piece, ids);
    });
    return ids;
  }

  count(text: string): number {
    let total = 0;
    this.forEachSegment(text, (segment, added) => {
      total += added !== undefined ? 1 : this.countSegment(segment);
    });
    return total;
  }

  split(text: string): string[] {
    const out: string[] = [];
    this.forEachSegment(text, (segment, added) => {
      if (added !== undefined) out.push(added);
      else if (!this.nfc || !mayNormalize.test(segment)) out.push(...this.prePieces(segment));
      else {
        const normal = segment.normalize("NFC");
        if (normal === segment) out.push(...this.prePieces(segment));
        else out.push(...this.normalizedPieces(segment));
      }
    });
    return out;
  }

  /** Calls `each` with the text between added tokens and with each added token, in order. */
  private forEachSegment(text: string, each: (segment: string, added?: string) => void): void {
    let from = 0;
    if (this.addedByFirst.size > 0) {
      const first = this.addedFirst;
      for (let i = 0; i < text.length; i += 1) {
        if (first[text.charCodeAt(i)] === 0) continue;
        const candidates = this.addedByFirst.get(text.charCodeAt(i))!;
        const token = candidates.find((t) => text.startsWith(t, i));
        if (token === undefined) continue;
        if (i > from) each(text.slice(from, i));
        each(token, token);
        from = i + token.length;
        i = from - 1;
      }
    }
    if (from < text.length) each(from === 0 ? text : text.slice(from));
  }

  private normalize(segment: string): string {
    return this.nfc && mayNormalize.test(segment) ? segment.normalize("NFC") : segment;
  }

  private countSegment(segment: string): number {
    const long = segment.length >= this.segmentMinChars;
    if (long) {
      const hit = this.segmentCounts.get(segment);
      if (hit !== undefined) return hit;
    }
    const text = this.normalize(segment);
    let total = 0;
    if (this.patterns.length === 1) {
      // One Split regex (all but DeepSeek): pieces counted as they are matched, no array.
      const pattern = this.patterns[0]!;
      let last = 0;
      pattern.lastIndex = 0;
      for (let match = pattern.exec(text); match !== null; match = pattern.exec(text)) {
        const found = match[0];
        if (match.index > last) total += this.countPiece(text.slice(last, match.index));
        if (found === "") {
          pattern.lastIndex += 1;
          continue;
        }
        total += this.countPiece(found);
        last = match.index + found.length;
      }
      if (last < text.length) total += this.countPiece(text.slice(last));
    } else {
      for (const piece of this.prePieces(text)) total += this.countPiece(piece);
    }
    if (long) this.segmentCounts.set(segment, total);
    return total;
  }

  /** The pre-tokenizer's pieces of normalized text (each Split regex, isolated, in turn). */
  private prePieces(text: string): string[] {
    let pieces = [text];
    for (const pattern of this.patterns) {
      const next: string[] = [];
      for (const piece of pieces) {
        let last = 0;
        pattern.lastIndex = 0;
        for (let match = pattern.exec(piece); match !== null; match = pattern.exec(piece)) {
          const start = match.index;
          const found = match[0];
          if (start > last) next.push(piece.slice(last, start));
          if (found === "") {
            pattern.lastIndex += 1;
            continue;
          }
          next.push(found);
          last = start + found.length;
        }
        if (last < piece.length) next.push(last === 0 ? piece : piece.slice(last));
      }
      pieces = next;
    }
    return pieces;
  }

  /**
   * Pieces of raw text that is not in NFC: the pieces of its normalization, mapped back to the
   * raw text where a boundary maps exactly (at a block NFC leaves alone, or between blocks;
   * {@link nfcBlocks}); pieces whose boundary falls inside a changed block are joined.
   */
  private normalizedPieces(segment: string): string[] {
    const blocks = nfcBlocks(segment);
    const normal = blocks.map((b) => b.normal).join("");
    const out: string[] = [];
    let rawFrom = 0;
    let block = 0;
    let normalAt = 0;
    for (const piece of this.prePieces(normal)) {
      normalAt += piece.length;
      while (block < blocks.length && blocks[block]!.normalEnd < normalAt) block += 1;
      const b = blocks[block];
      let rawAt: number | undefined;
      if (b === undefined) rawAt = segment.length;
      else if (b.normalEnd === normalAt) rawAt = b.rawEnd;
      else if (!b.changed) rawAt = b.rawEnd - (b.normalEnd - normalAt);
      if (rawAt !== undefined && rawAt > rawFrom) {
        out.push(segment.slice(rawFrom, rawAt));
        rawFrom = rawAt;
      }
    }
    if (rawFrom < segment.length) out.push(segment.slice(rawFrom));
    return out;
  }

  private countPiece(piece: string): number {
    if (piece.length === 1 && piece.charCodeAt(0) < 0x80) return 1;
    const long = piece.length > maxCachedPiece;
    if (!long) {
      const hit = this.pieceCounts.get(piece);
      if (hit !== undefined) return hit;
    }
    const count = this.merge(piece, undefined);
    if (!long) this.pieceCounts.set(piece, count);
    return count;
  }

  private mergePiece(piece: string, ids: number[]): void {
    this.merge(piece, ids);
  }

  /** The piece's tokens (pushed to `ids` when given); their count. */
  private merge(piece: string, ids: number[] | undefined): number {
    if (this.buffer.length < piece.length * 3) this.buffer = new Uint8Array(piece.length * 3);
    const n = encoder.encodeInto(piece, this.buffer).written;
    if (this.ignoreMerges) {
      const whole = this.vocab.find(this.buffer, 0, n);
      if (whole >= 0) {
        ids?.push(whole);
        return 1;
      }
    }
    return mergeBytes(this.vocab, this.buffer, n, ids);
  }
}

const encoder = new TextEncoder();
