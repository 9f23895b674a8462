import { utf8Length, type OutputCount } from "../../domain/tokens.js";
import type { TokenizerEngine } from "./engine.js";

/**
 * A text's exact count as it arrives (issue 35, research A.5): finished pieces are committed
 * (their counts summed once), only the tail (the text from the start of the last two pieces, and
 * from any suffix that may still become an added token) is scanned again. count(text) is the sum
 * of its pieces' counts, and appending text changes only the last piece ({@link TokenizerEngine}),
 * so the committed sum never changes; keeping two pieces back is the conservative margin.
 *
 * Costs: `append` is amortized linear in the text appended (the tail is split again only once it
 * has doubled, or grown by {@link rescanChars}, so a tail that stays one long piece, a megabyte of
 * spaces sent a byte at a time, is scanned O(log n) times, not once per chunk). `count` counts the
 * tail. `fit` answers from the UTF-8 bytes (an upper bound of any byte-level count) while they are
 * under the limit, and otherwise walks the pieces of a window of `text` that grows only as far as
 * the limit needs.
 *
 * On the event loop no step counts a long piece: `heavy` says when `fit` or `count` would (a
 * piece over {@link inlinePieceChars}, or a text over {@link inlineScanChars}), and `settle` then
 * asks the count pool's worker (count-worker.ts) for the answer and for the state after it (the
 * tail split again and counted), so the `fit`, `append` and `count` that follow are lookups.
 * `append` itself never splits a tail over {@link inlineScanChars} nor commits a long piece there:
 * such a tail waits for the next `settle`.
 */

/** Text appended before the tail is split again, at least. */
const rescanChars = 256;

/**
 * The event loop's share (issue 35: no step above 5 ms). Measured with Qwen 3's engine on the
 * 2-core development machine: a piece of 4,096 characters counts in about 1.3 ms, one of 8,192
 * in 2.5 to 3.4 ms and is fitted in 20 to 40 ms (a megabyte of one letter takes 0.6 s to count,
 * 3 s to fit); a fit walks up to about 64 prefixes of the piece the limit falls in, so a piece of
 * a few hundred spaces already takes a few milliseconds. So a step whose longest piece (the
 * tail's last joined with the text's first) is over {@link inlinePieceChars}, or whose text is
 * over {@link inlineScanChars} (not even split inline: splitting a megabyte takes about 10 ms),
 * is counted in the worker pool.
 */
export const inlinePieceChars = 512;
export const inlineScanChars = 64 * 1024;

/**
 * What the worker is asked (count-worker.ts): the state of a count (its committed tokens and
 * tail), and `fit(text, limit)` of it (`text` absent: its count).
 */
export interface OutputTask {
  readonly committed: number;
  readonly tail: string;
  readonly text?: string | undefined;
  readonly limit?: bigint | undefined;
}

/**
 * The worker's answer: the fit (`keep`), and the count's state once `text`'s first `keep` units
 * are appended and the tail split again: its committed tokens, the tail's length (a suffix of
 * the old tail and what was appended) and tokens, and when to split it next.
 */
export interface OutputAnswer {
  readonly keep: number;
  readonly committed: number;
  readonly tail: number;
  readonly tailCount: number;
  readonly rescanAt: number;
}

/** Where heavy steps are counted (the count pool; none: inline, in tests). */
export type OutputPool = (task: OutputTask) => Promise<OutputAnswer>;

export function createOutputCount(engine: TokenizerEngine, pool?: OutputPool): OutputCount {
  return new IncrementalCount(engine, pool);
}

/** Answers a task (in the worker; inline when there is no pool). */
export function answerOutput(engine: TokenizerEngine, task: OutputTask): OutputAnswer {
  const count = new IncrementalCount(engine, undefined, false);
  count.restore(task.committed, task.tail);
  const { text, limit } = task;
  let keep = 0;
  if (text !== undefined) {
    keep = limit === undefined ? text.length : count.fit(text, limit);
    count.append(text.slice(0, keep));
  }
  return count.snapshot(keep);
}

/** A settled step: the state it was asked for, and the answer. */
interface Settled {
  readonly committed: number;
  readonly tail: string;
  readonly text: string;
  readonly limit: bigint | undefined;
  readonly answer: OutputAnswer;
}

/** Where an added token might begin at the end of `text` (its suffix a proper prefix of one). */
function addedTokenPrefixStart(text: string, added: readonly string[], longest: number): number {
  for (let i = Math.max(0, text.length - longest + 1); i < text.length; i += 1) {
    const suffix = text.slice(i);
    if (added.some((token) => token.length > suffix.length && token.startsWith(suffix))) return i;
  }
  return text.length;
}

/** The starts of `pieces` (and, last, the end of their text). */
function boundaries(pieces: readonly string[]): number[] {
  const ends = [0];
  for (const piece of pieces) ends.push(ends[ends.length - 1]! + piece.length);
  return ends;
}

class IncrementalCount implements OutputCount {
  private committed = 0;
  private tail = "";
  private tailBytes = 0;
  private tailCount: number | undefined = 0;
  private rescanAt = rescanChars;
  private readonly longestAdded: number;
  /** The last step counted off the event loop, until the count changes otherwise. */
  private settled: Settled | undefined = undefined;

  constructor(
    private readonly engine: TokenizerEngine,
    private readonly pool?: OutputPool,
    /** On the event loop: long pieces are left to {@link IncrementalCount.settle}. */
    private readonly bounded = true,
  ) {
    this.longestAdded = Math.max(0, ...engine.addedTokens.map((t) => t.length));
  }

  append(text: string): void {
    const settled = this.settled;
    this.settled = undefined;
    if (text === "") return;
    if (
      settled !== undefined &&
      this.isState(settled) &&
      text.length === settled.answer.keep &&
      settled.text.startsWith(text)
    ) {
      // The worker split and counted this very append.
      this.tail += text;
      this.apply(settled.answer);
      return;
    }
    this.tail += text;
    this.tailBytes += utf8Length(text);
    this.tailCount = undefined;
    if (this.tail.length >= this.rescanAt && (!this.bounded || this.tail.length <= inlineScanChars))
      this.rescan();
  }

  count(): bigint {
    return BigInt(this.committed + this.tailTokens());
  }

  heavy(text?: string): boolean {
    if (text === undefined) return this.tailCount === undefined && this.longPiece(this.tail);
    const settled = this.settled;
    if (settled !== undefined && settled.text === text && this.isState(settled)) return false;
    return this.longPiece(this.tail + text);
  }

  /** Whether `text` is too long to scan inline, or holds a piece too long to count inline. */
  private longPiece(text: string): boolean {
    if (text.length <= inlinePieceChars) return false;
    if (text.length > inlineScanChars) return true;
    return this.engine.split(text).some((piece) => piece.length > inlinePieceChars);
  }

  async settle(text?: string, limit?: bigint): Promise<void> {
    const task: OutputTask = { committed: this.committed, tail: this.tail, text, limit };
    // A pool that fails (stopping) leaves the count to the event loop: slow, but exact.
    const answer =
      this.pool === undefined
        ? answerOutput(this.engine, task)
        : await this.pool(task).catch(() => answerOutput(this.engine, task));
    const settled = { committed: task.committed, tail: task.tail, text: text ?? "", limit, answer };
    if (!this.isState(settled)) return;
    if (text === undefined) this.apply(answer);
    else this.settled = settled;
  }

  fit(text: string, limit: bigint): number {
    const settled = this.settled;
    if (
      settled !== undefined &&
      settled.text === text &&
      settled.limit === limit &&
      this.isState(settled)
    )
      return settled.answer.keep;
    const room = limit > BigInt(Number.MAX_SAFE_INTEGER) ? Infinity : Number(limit);
    // Bytes bound every count (each token is at least one byte); a count of the tail plus the
    // bytes appended would not (appending may undo a merge of the tail).
    if (this.committed + this.tailBytes + utf8Length(text) <= room) return text.length;
    if (this.committed + this.tailTokens() > room) return 0;
    // A window of text that holds every prefix that may fit: each token is at least one byte,
    // so once the window's pieces pass the limit with two pieces to spare, no longer prefix can
    // fit. Grown by doubling while it does not.
    let window = Math.min(text.length, 4 * (room - this.committed) + 64);
    for (;;) {
      const answer = this.fitWithin(text, window, room);
      if (answer !== undefined || window === text.length) return answer ?? text.length;
      window = Math.min(text.length, window * 2);
    }
  }

  /** Sets the state a task describes (in the worker). */
  restore(committed: number, tail: string): void {
    this.committed = committed;
    this.tail = tail;
    this.tailBytes = utf8Length(tail);
    this.tailCount = undefined;
    this.rescanAt = tail.length + rescanChars;
  }

  /** The answer to a task, once its append is made: the tail split again and counted. */
  snapshot(keep: number): OutputAnswer {
    this.rescan();
    return {
      keep,
      committed: this.committed,
      tail: this.tail.length,
      tailCount: this.tailTokens(),
      rescanAt: this.rescanAt,
    };
  }

  /** Whether the count is still in the state a settled step was asked for. */
  private isState(settled: Settled): boolean {
    return settled.tail === this.tail && settled.committed === this.committed;
  }

  /** Takes the worker's state (the tail already holds what was appended). */
  private apply(answer: OutputAnswer): void {
    this.committed = answer.committed;
    this.tail = this.tail.slice(this.tail.length - answer.tail);
    this.tailBytes = utf8Length(this.tail);
    this.tailCount = answer.tailCount;
    this.rescanAt = answer.rescanAt;
  }

  private tailTokens(): number {
    this.tailCount ??= this.engine.count(this.tail);
    return this.tailCount;
  }

  /** Commits every piece of the tail but the last two, and none an added token may still take. */
  private rescan(): void {
    const pieces = this.engine.split(this.tail);
    const ends = boundaries(pieces);
    let keep = pieces.length - 2;
    const open = addedTokenPrefixStart(this.tail, this.engine.addedTokens, this.longestAdded);
    if (open < this.tail.length) {
      // The text before a token that may still complete ends where it starts: its last two
      // pieces may change then.
      let holding = 0;
      while (holding < pieces.length && ends[holding + 1]! <= open) holding += 1;
      keep = Math.min(keep, holding - 2);
    }
    // On the event loop a long piece is not counted: it stays in the tail, for a settle.
    if (this.bounded && pieces.slice(0, Math.max(0, keep)).some((p) => p.length > inlinePieceChars))
      keep = 0;
    if (keep > 0) {
      for (let i = 0; i < keep; i += 1) this.committed += this.engine.count(pieces[i]!);
      const dropped = this.tail.slice(0, ends[keep]);
      this.tail = this.tail.slice(ends[keep]);
      this.tailBytes -= utf8Length(dropped);
      this.tailCount = undefined;
    }
    this.rescanAt = Math.max(2 * this.tail.length, this.tail.length + rescanChars);
  }

  /**
   * The longest prefix of `text` that fits, looking at its first `window` units; undefined when
   * the window is too short to tell.
   */
  private fitWithin(text: string, window: number, room: number): number | undefined {
    const whole = window === text.length;
    const s = this.tail + text.slice(0, window);
    const pieces = this.engine.split(s);
    const ends = boundaries(pieces);
    const from = this.tail.length;
    // counts[i]: tokens of piece i; before[i]: tokens of the committed text and pieces < i.
    const counts: number[] = [];
    let before = this.committed;
    let best = -1;
    const valueAt = (j: number, position: number): number => {
      const start = ends[Math.max(0, j - 1)]!;
      const prior = j > 0 ? before - counts[j - 1]! : before;
      return prior + this.engine.count(s.slice(start, position));
    };
    for (let j = 0; j < pieces.length; j += 1) {
      // Any prefix ending inside piece j counts at least the pieces before j - 1, plus one.
      const floor = j > 0 ? before - counts[j - 1]! : before;
      if (floor + 1 > room) return Math.max(0, best - from);
      const pieceCount = this.engine.count(pieces[j]!);
      counts.push(pieceCount);
      const end = ends[j + 1]!;
      if (end > from) {
        // A prefix ending where piece j ends is split as its own text: its last two pieces may
        // differ from the window's (Qwen 3 splits " \u3000 \t<" as " \u3000 ", "\t", "<" but
        // " \u3000 \t" as one piece, a token fewer), so its count is read, not summed.
        if (valueAt(j, end) <= room) {
          best = end;
        } else {
          // The limit falls inside piece j: the longest fitting position in it, if any.
          const inside = this.longestInside(
            s,
            Math.max(from, ends[j]!),
            end,
            (p) => valueAt(j, p) <= room,
          );
          if (inside !== undefined) best = Math.max(best, inside);
        }
      }
      before += pieceCount;
      // The last piece of a window that is not the whole text may grow past the window.
      if (!whole && j >= pieces.length - 2) return undefined;
    }
    if (!whole) return undefined;
    return best < 0 ? 0 : best - from;
  }

  /**
   * The largest position in (start, end) (whole characters) that `fits`, or undefined: each
   * position tried from the end for a short piece; a long piece is bisected (counts within a
   * piece grow with its length, up to a token or two), then the positions just above the one
   * found are tried too.
   */
  private longestInside(
    s: string,
    start: number,
    end: number,
    fits: (position: number) => boolean,
  ): number | undefined {
    const positions: number[] = [];
    for (let p = start + 1; p < end; p += 1) {
      const code = s.charCodeAt(p);
      const high = s.charCodeAt(p - 1);
      if (code >= 0xdc00 && code < 0xe000 && high >= 0xd800 && high < 0xdc00) continue;
      positions.push(p);
    }
    if (positions.length <= 64) {
      for (let i = positions.length - 1; i >= 0; i -= 1)
        if (fits(positions[i]!)) return positions[i];
      return undefined;
    }
    let found = -1;
    let low = 0;
    let high = positions.length - 1;
    while (low <= high) {
      const middle = (low + high) >> 1;
      if (fits(positions[middle]!)) {
        found = middle;
        low = middle + 1;
      } else {
        high = middle - 1;
      }
    }
    for (let i = Math.min(positions.length - 1, found + 32); i > found; i -= 1) {
      if (fits(positions[i]!)) return positions[i];
    }
    return found < 0 ? undefined : positions[found];
  }
}
