/**
 * A byte-level vocabulary as typed arrays (issue 35: a tokenizer's live heap at most 20 MB, and
 * nothing every major GC has to mark token by token): the tokens' bytes end to end, their ends,
 * and an open-addressing hash table of ids keyed by bytes (FNV-1a, linear probing). A lookup
 * hashes the bytes of a slice of the piece being merged: no string is made per candidate pair.
 */
export class ByteVocab {
  /** The longest token, in bytes: a longer slice is never a token. */
  readonly maxTokenBytes: number;
  private readonly mask: number;

  private constructor(
    /** Every token's bytes, by id, end to end. */
    readonly bytes: Uint8Array,
    /** ends[id + 1] - ends[id]: the length of token `id` (0: no token has the id). */
    readonly ends: Uint32Array,
    private readonly slots: Int32Array,
  ) {
    this.mask = slots.length - 1;
    let longest = 0;
    for (let id = 0; id + 1 < ends.length; id += 1) {
      longest = Math.max(longest, ends[id + 1]! - ends[id]!);
    }
    this.maxTokenBytes = longest;
  }

  /** From tokens' bytes and ends (a vocabulary's ids are its indexes). */
  static of(bytes: Uint8Array, ends: Uint32Array): ByteVocab {
    const count = ends.length - 1;
    let capacity = 1;
    while (capacity < count * 2) capacity *= 2;
    const slots = new Int32Array(capacity).fill(-1);
    const vocab = new ByteVocab(bytes, ends, slots);
    for (let id = 0; id < count; id += 1) {
      const start = ends[id]!;
      const end = ends[id + 1]!;
      if (end === start) continue;
      let slot = hash(bytes, start, end) & vocab.mask;
      while (slots[slot] !== -1) slot = (slot + 1) & vocab.mask;
      slots[slot] = id;
    }
    return vocab;
  }

  /** The id of the token whose bytes are `piece[start, end)`, or -1. */
  find(piece: Uint8Array, start: number, end: number): number {
    const length = end - start;
    if (length > this.maxTokenBytes) return -1;
    const { bytes, ends, slots, mask } = this;
    let slot = hash(piece, start, end) & mask;
    for (;;) {
      const id = slots[slot]!;
      if (id === -1) return -1;
      const from = ends[id]!;
      if (ends[id + 1]! - from === length) {
        let same = true;
        for (let i = 0; i < length; i += 1) {
          if (bytes[from + i] !== piece[start + i]) {
            same = false;
            break;
          }
        }
        if (same) return id;
      }
      slot = (slot + 1) & mask;
    }
  }
}

function hash(bytes: Uint8Array, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i += 1) h = Math.imul(h ^ bytes[i]!, 0x01000193);
  return h >>> 0;
}
