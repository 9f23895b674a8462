/**
 * The bound of the gateway's in-memory caches and tables (issue 36): a `Map` iterates in
 * insertion order, so an entry set anew goes last and the first key is the one set or touched
 * longest ago. One rule for every cache, so none grows without bound under keys a client makes
 * up (API keys, addresses, permits, digests).
 */

/**
 * Sets `key` to `value` as the newest entry of `map`, then drops the oldest entries while the
 * map holds more than `max` (0: it keeps nothing).
 */
export function setBounded<K, V>(map: Map<K, V>, key: K, value: V, max: number): void {
  map.delete(key);
  map.set(key, value);
  while (map.size > max) {
    const oldest = map.keys().next();
    if (oldest.done === true) break;
    map.delete(oldest.value);
  }
}
