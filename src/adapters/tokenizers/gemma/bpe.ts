import type { GemmaTable } from "./table.js";

/**
 * The merges of a BPE model, indexed for lookup: for each left id, its merges sorted by right id
 * (compressed sparse rows), so `(left, right)` is a binary search in a short row.
 */
export interface MergeIndex {
  /** Row of left id `l`: positions start[l] .. start[l+1]-1 of the arrays below. */
  readonly start: Uint32Array;
  readonly right: Uint32Array;
  readonly rank: Uint32Array;
  readonly result: Uint32Array;
}

/** The rank-ordered merges of a table as rows by left id, by two stable counting sorts. */
export function indexMerges(table: GemmaTable): MergeIndex {
  const { mergeLeft, mergeRight, mergeResult, vocabSize } = table;
  const ranks = mergeLeft.length;
  // By right id first, then (stably) by left id: rows by left, each sorted by right.
  const counts = new Uint32Array(vocabSize + 1);
  const start = new Uint32Array(vocabSize + 1);
  let n = 0;
  for (let r = 0; r < ranks; r++) {
    const l = mergeLeft[r]!;
    if (l === 0xffffffff) continue; // a pair listed again at a later rank
    counts[mergeRight[r]! + 1] = counts[mergeRight[r]! + 1]! + 1;
    start[l + 1] = start[l + 1]! + 1;
    n++;
  }
  for (let i = 0; i < vocabSize; i++) {
    counts[i + 1] = counts[i + 1]! + counts[i]!;
    start[i + 1] = start[i + 1]! + start[i]!;
  }
  const byRight = new Uint32Array(n);
  for (let r = 0; r < ranks; r++) {
    if (mergeLeft[r] !== 0xffffffff) byRight[counts[mergeRight[r]!]!++] = r;
  }
  const cursor = start.slice(0, vocabSize);
  const right = new Uint32Array(n);
  const rank = new Uint32Array(n);
  const result = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const r = byRight[i]!;
    const at = cursor[mergeLeft[r]!]!++;
    right[at] = mergeRight[r]!;
    rank[at] = r;
    result[at] = mergeResult[r]!;
  }
  return { start, right, rank, result };
}

const none = 0x7fffffff;
const scratchSymbols = 4096;
const shift = 2 ** 32;

/**
 * Hugging Face's BPE merge of one word (tokenizers' `Word::merge_all`): repeatedly merge the
 * adjacent pair of lowest merge rank, the leftmost among equals, until no adjacent pair has a
 * merge. Symbols live in `sym[0..n)`; the merged symbols are left in `sym[0..count)`.
 *
 * Short words (most words) scan their pairs directly; long ones use a priority queue of
 * (rank, position) over a linked list, skipping entries whose pair has changed since, so the
 * worst case is O(n log n) (1 MiB of one repeated character is one word).
 */
export function createMerger(index: MergeIndex) {
  const { start, right, rank, result } = index;
  let pairRank = new Int32Array(64);
  let pairResult = new Int32Array(64);

  /** The position of merge (l, r) in the index, or -1. */
  function find(l: number, r: number): number {
    let lo = start[l]!;
    let hi = start[l + 1]!;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      const v = right[mid]!;
      if (v < r) lo = mid + 1;
      else if (v > r) hi = mid;
      else return mid;
    }
    return -1;
  }

  function setPair(sym: Int32Array, i: number): void {
    const k = find(sym[i]!, sym[i + 1]!);
    if (k < 0) pairRank[i] = none;
    else {
      pairRank[i] = rank[k]!;
      pairResult[i] = result[k]!;
    }
  }

  function mergeShort(sym: Int32Array, length: number): number {
    if (pairRank.length < length) {
      pairRank = new Int32Array(length * 2);
      pairResult = new Int32Array(length * 2);
    }
    let n = length;
    for (let i = 0; i + 1 < n; i++) setPair(sym, i);
    while (n > 1) {
      let best = none;
      let at = -1;
      for (let i = 0; i + 1 < n; i++) {
        if (pairRank[i]! < best) {
          best = pairRank[i]!;
          at = i;
        }
      }
      if (at < 0) break;
      sym[at] = pairResult[at]!;
      for (let i = at + 1; i + 1 < n; i++) {
        sym[i] = sym[i + 1]!;
        pairRank[i] = pairRank[i + 1]!;
        pairResult[i] = pairResult[i + 1]!;
      }
      n--;
      if (at + 1 < n) setPair(sym, at);
      if (at > 0) setPair(sym, at - 1);
    }
    return n;
  }

  // Kept for words up to `scratchSymbols`; a longer word's arrays are its own, and not kept.
  const scratchNext = new Int32Array(scratchSymbols);
  const scratchPrev = new Int32Array(scratchSymbols);
  const scratchQueue = createQueue(2 * scratchSymbols);

  function mergeLong(sym: Int32Array, n: number): number {
    const small = n <= scratchSymbols;
    const next = small ? scratchNext : new Int32Array(n);
    const prev = small ? scratchPrev : new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1;
      prev[i] = i - 1;
    }
    const queue = small ? scratchQueue : createQueue(2 * n);
    queue.clear();
    for (let i = 0; i + 1 < n; i++) {
      const k = find(sym[i]!, sym[i + 1]!);
      if (k >= 0) queue.add(rank[k]! * shift + i);
    }
    queue.heapify();
    let count = n;
    while (queue.size() > 0) {
      const key = queue.pop();
      const r = Math.floor(key / shift);
      const pos = key - r * shift;
      const nx = next[pos]!;
      if (sym[pos]! < 0 || nx >= n) continue;
      const k = find(sym[pos]!, sym[nx]!);
      // A stale entry: the pair at `pos` has changed since it was queued.
      if (k < 0 || rank[k] !== r) continue;
      sym[pos] = result[k]!;
      sym[nx] = -1;
      const after = next[nx]!;
      next[pos] = after;
      if (after < n) prev[after] = pos;
      count--;
      const before = prev[pos]!;
      if (before >= 0) {
        const kb = find(sym[before]!, sym[pos]!);
        if (kb >= 0) queue.push(rank[kb]! * shift + before);
      }
      if (after < n) {
        const ka = find(sym[pos]!, sym[after]!);
        if (ka >= 0) queue.push(rank[ka]! * shift + pos);
      }
    }
    let out = 0;
    for (let i = 0; i < n; i++) if (sym[i]! >= 0) sym[out++] = sym[i]!;
    if (out !== count) throw new Error("gemma bpe: lost a symbol");
    return count;
  }

  return {
    /** Merges `sym[0..n)` in place; returns the number of tokens left in `sym[0..]`. */
    merge(sym: Int32Array, n: number): number {
      return n <= 48 ? mergeShort(sym, n) : mergeLong(sym, n);
    },
  };
}

/**
 * A 4-ary min-heap of numbers (rank * 2^32 + position: lowest rank, then leftmost): half the
 * depth of a binary heap, and a node's children share a cache line.
 */
function createQueue(capacity: number) {
  let heap = new Float64Array(Math.max(16, capacity));
  let size = 0;
  function down(i: number): void {
    const v = heap[i]!;
    for (;;) {
      const first = 4 * i + 1;
      if (first >= size) break;
      let c = first;
      let m = heap[first]!;
      const last = Math.min(first + 4, size);
      for (let k = first + 1; k < last; k++) {
        if (heap[k]! < m) {
          m = heap[k]!;
          c = k;
        }
      }
      if (m >= v) break;
      heap[i] = m;
      i = c;
    }
    heap[i] = v;
  }
  return {
    size: () => size,
    clear(): void {
      size = 0;
    },
    /** Appends without ordering; call heapify before the first pop. */
    add(v: number): void {
      heap[size++] = v;
    },
    heapify(): void {
      for (let i = (size - 2) >> 2; i >= 0; i--) down(i);
    },
    push(v: number): void {
      if (size === heap.length) {
        const grown = new Float64Array(size * 2);
        grown.set(heap);
        heap = grown;
      }
      let i = size++;
      while (i > 0) {
        const p = (i - 1) >> 2;
        if (heap[p]! <= v) break;
        heap[i] = heap[p]!;
        i = p;
      }
      heap[i] = v;
    },
    pop(): number {
      const top = heap[0]!;
      size--;
      if (size > 0) {
        heap[0] = heap[size]!;
        down(0);
      }
      return top;
    },
  };
}
