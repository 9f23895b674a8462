import { describe, expect, it } from "vitest";
import { setBounded } from "./bounded-cache.js";

describe("setBounded", () => {
  it("keeps the newest entries, at most the bound", () => {
    const map = new Map<string, number>();
    for (const [i, key] of ["a", "b", "c", "d"].entries()) setBounded(map, key, i, 3);
    expect([...map]).toEqual([
      ["b", 1],
      ["c", 2],
      ["d", 3],
    ]);
  });

  it("makes a key set again the newest: the oldest other goes first", () => {
    const map = new Map<string, number>();
    setBounded(map, "a", 1, 2);
    setBounded(map, "b", 2, 2);
    setBounded(map, "a", 3, 2);
    setBounded(map, "c", 4, 2);
    expect([...map]).toEqual([
      ["a", 3],
      ["c", 4],
    ]);
  });

  it("keeps nothing under a bound of 0, and shrinks a map over a lowered bound", () => {
    const none = new Map<string, number>();
    setBounded(none, "a", 1, 0);
    expect(none.size).toBe(0);
    const map = new Map([
      ["a", 1],
      ["b", 2],
      ["c", 3],
    ]);
    setBounded(map, "d", 4, 2);
    expect([...map.keys()]).toEqual(["c", "d"]);
  });
});
