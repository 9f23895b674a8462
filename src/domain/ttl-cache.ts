import { setBounded } from "./bounded-cache.js";
/**
 * A map whose entries are served for `ttlMs` after they were set, holding at most `maxEntries`
 * (the oldest goes first). The gateway's hot-path caches are all this shape: a short, bounded
 * reuse of something the database or the chain answered. `ttlMs` 0 disables it (nothing kept).
 */
export interface TtlCache<K, V> {
  get(key: K): V | undefined;
  set(key: K, value: V): void;
  delete(key: K): void;
  clear(): void;
  readonly size: number;
}

export function createTtlCache<K, V>(options: {
  readonly ttlMs: number;
  readonly maxEntries?: number;
  /** Milliseconds clock (tests inject one). */
  readonly now?: () => number;
}): TtlCache<K, V> {
  const { ttlMs } = options;
  const maxEntries = options.maxEntries ?? 10_000;
  const now = options.now ?? Date.now;
  if (ttlMs < 0 || maxEntries < 1) throw new RangeError("ttlMs >= 0 and maxEntries >= 1");
  // Map iteration order is insertion order: the first key is the oldest entry.
  const entries = new Map<K, { value: V; at: number }>();
  return {
    get(key) {
      const entry = entries.get(key);
      if (entry === undefined) return undefined;
      if (now() - entry.at >= ttlMs) {
        entries.delete(key);
        return undefined;
      }
      return entry.value;
    },
    set(key, value) {
      if (ttlMs === 0) return;
      setBounded(entries, key, { value, at: now() }, maxEntries);
    },
    delete: (key) => void entries.delete(key),
    clear: () => entries.clear(),
    get size() {
      return entries.size;
    },
  };
}
