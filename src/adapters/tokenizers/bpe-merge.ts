import type { ByteVocab } from "./byte-vocab.js";

/**
 * BPE merging of one piece's bytes by rank (tiktoken's algorithm; the rank of a token is its
 * id): the adjacent pair whose concatenation has the lowest rank merges first, the leftmost
 * among equals, until no pair is a token. Short pieces use tiktoken's own loop; long ones a
 * priority queue, O(n log n) (tiktoken's loop is quadratic on a long piece).
 */

/** Below this many bytes tiktoken's quadratic loop beats the priority queue. */
const heapFrom = 48;
/** key = rank * 2^32 + position: exact in a double for ranks below 2^21. */
const positionSpan = 4294967296;

/** The tokens of `piece[0, n)` (pushed to `ids` when given); their count. */
export function mergeBytes(
  vocab: ByteVocab,
  piece: Uint8Array,
  n: number,
  ids: number[] | undefined,
): number {
  return n < heapFrom ? mergeSmall(vocab, piece, n, ids) : mergeHeap(vocab, piece, n, ids);
}

/** tiktoken's loop (quadratic: short pieces only) over the buffer's first `n` bytes. */
function mergeSmall(
  vocab: ByteVocab,
  piece: Uint8Array,
  n: number,
  ids: number[] | undefined,
): number {
  const rank = (start: number, end: number) => {
    const id = vocab.find(piece, start, end);
    return id < 0 ? Infinity : id;
  };
  const starts: number[] = [];
  for (let i = 0; i <= n; i += 1) starts.push(i);
  const ranks: number[] = [];
  for (let i = 0; i + 2 < starts.length; i += 1) ranks.push(rank(i, i + 2));
  for (;;) {
    let lowest = Infinity;
    let at = -1;
    for (let i = 0; i < ranks.length; i += 1) {
      if (ranks[i]! < lowest) {
        lowest = ranks[i]!;
        at = i;
      }
    }
    if (at < 0) break;
    starts.splice(at + 1, 1);
    ranks.splice(at, 1);
    if (at < ranks.length) ranks[at] = rank(starts[at]!, starts[at + 2]!);
    if (at > 0) ranks[at - 1] = rank(starts[at - 1]!, starts[at + 1]!);
  }
  if (ids !== undefined) {
    for (let i = 0; i + 1 < starts.length; i += 1) ids.push(rank(starts[i]!, starts[i + 1]!));
  }
  return starts.length - 1;
}

/**
 * The same merges as {@link mergeSmall} in O(n log n): tokens as a linked list over their
 * start bytes, candidate pairs in a binary heap keyed by (rank, start) so the leftmost of the
 * lowest rank merges first; entries made stale by a merge are skipped when they surface.
 */
function mergeHeap(
  vocab: ByteVocab,
  piece: Uint8Array,
  n: number,
  ids: number[] | undefined,
): number {
  const rank = (start: number, end: number) => {
    const id = vocab.find(piece, start, end);
    return id < 0 ? Infinity : id;
  };
  const next = new Int32Array(n + 1);
  const prev = new Int32Array(n + 1);
  const pairRank = new Float64Array(n).fill(Infinity);
  const dead = new Uint8Array(n);
  for (let i = 0; i <= n; i += 1) {
    next[i] = i + 1;
    prev[i] = i - 1;
  }
  const heap: number[] = [];
  const push = (key: number) => {
    let i = heap.length;
    heap.push(key);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent]! <= key) break;
      heap[i] = heap[parent]!;
      i = parent;
    }
    heap[i] = key;
  };
  const pop = (): number => {
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length > 0) {
      let i = 0;
      const size = heap.length;
      for (;;) {
        let child = 2 * i + 1;
        if (child >= size) break;
        if (child + 1 < size && heap[child + 1]! < heap[child]!) child += 1;
        if (heap[child]! >= last) break;
        heap[i] = heap[child]!;
        i = child;
      }
      heap[i] = last;
    }
    return top;
  };
  const update = (i: number) => {
    const second = next[i]!;
    const pair = second < n ? rank(i, next[second]!) : Infinity;
    pairRank[i] = pair;
    if (pair !== Infinity) push(pair * positionSpan + i);
  };
  for (let i = 0; i + 1 < n; i += 1) update(i);
  let tokens = n;
  while (heap.length > 0) {
    const key = pop();
    const rank = Math.floor(key / positionSpan);
    const i = key - rank * positionSpan;
    if (dead[i] === 1 || pairRank[i] !== rank) continue;
    const second = next[i]!;
    const third = next[second]!;
    dead[second] = 1;
    next[i] = third;
    if (third <= n) prev[third] = i;
    tokens -= 1;
    update(i);
    if (prev[i]! >= 0) update(prev[i]!);
  }
  if (ids !== undefined) {
    for (let i = 0; i < n; i = next[i]!) ids.push(rank(i, next[i]!));
  }
  return tokens;
}
