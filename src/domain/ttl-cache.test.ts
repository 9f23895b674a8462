import { describe, expect, it } from "vitest";
import { createTtlCache } from "./ttl-cache.js";

describe("createTtlCache", () => {
  it("serves an entry for ttlMs, then forgets it", () => {
    let t = 0;
    const cache = createTtlCache<string, number>({ ttlMs: 100, now: () => t });
    cache.set("a", 1);
    t = 99;
    expect(cache.get("a")).toBe(1);
    t = 100;
    expect(cache.get("a")).toBeUndefined();
    expect(cache.size).toBe(0);
  });

  it("keeps at most maxEntries, dropping the oldest; ttlMs 0 keeps nothing", () => {
    const cache = createTtlCache<string, number>({ ttlMs: 1000, maxEntries: 2 });
    cache.set("a", 1);
    cache.set("b", 2);
    cache.set("a", 3); // refreshed: now the newest
    cache.set("c", 4);
    expect([cache.get("a"), cache.get("b"), cache.get("c")]).toEqual([3, undefined, 4]);
    const off = createTtlCache<string, number>({ ttlMs: 0 });
    off.set("a", 1);
    expect(off.get("a")).toBeUndefined();
  });
});
