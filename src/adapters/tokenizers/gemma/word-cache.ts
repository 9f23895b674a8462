/**
 * A direct-mapped cache of word counts keyed by a hash of the word's text: a hit costs the hash
 * and a comparison, and makes no string; a miss overwrites its slot, so the cache holds at most
 * `slots` short strings (a power of two; a word is about 40 bytes).
 */
export function createWordCache(slots: number) {
  const texts: string[] = new Array<string>(slots).fill("");
  const hashes = new Int32Array(slots);
  const counts = new Int32Array(slots);
  // The slot and hash of the last `get`, which `set` fills.
  let slot = 0;
  let hash = 0;
  return {
    /** The cached count of text[a..b), or -1. */
    get(text: string, a: number, b: number): number {
      let h = 0x811c9dc5; // FNV-1a over UTF-16 code units
      for (let i = a; i < b; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
      hash = h;
      slot = (h ^ (h >>> 15)) & (slots - 1);
      if (hashes[slot] !== h) return -1;
      const cached = texts[slot]!;
      if (cached.length !== b - a) return -1;
      for (let i = 0; i < cached.length; i++) {
        if (cached.charCodeAt(i) !== text.charCodeAt(a + i)) return -1;
      }
      return counts[slot]!;
    },
    /** Caches the count of text[a..b), the text of the `get` just before. */
    set(text: string, a: number, b: number, count: number): void {
      texts[slot] = text.slice(a, b);
      hashes[slot] = hash;
      counts[slot] = count;
    },
  };
}
