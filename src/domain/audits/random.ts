/**
 * Deterministic randomness for the audits' statistics (issue 39): a permutation test must give
 * the same p-value in every process that computes it from the same samples, so its permutations
 * come from a PRNG seeded by a hash of what it tests (the offer, the test, the batch), never
 * from `Math.random`. Not for anything secret.
 */

/** FNV-1a (32 bits) of a string: a seed from a name. */
export function hashSeed(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return hash >>> 0;
}

/** Mixes several 32-bit integers into one (murmur3's finaliser after each): cheap, well spread. */
export function mixSeed(...parts: readonly number[]): number {
  let h = 0x9e3779b9;
  for (const part of parts) {
    h = Math.imul(h ^ (part >>> 0), 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
  }
  return h >>> 0;
}

/** A uniform number in [0, 1) from a 32-bit integer hash. */
export function unitOf(hash: number): number {
  return (hash >>> 0) / 4294967296;
}

/** A PRNG (mulberry32) returning uniform numbers in [0, 1): the same seed, the same sequence. */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [0, n) from a PRNG. */
export function randomInt(random: () => number, n: number): number {
  return Math.floor(random() * n);
}
