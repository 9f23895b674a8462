import { describe, expect, it } from "vitest";
import { randomHex } from "./random-id.js";

describe("randomHex", () => {
  it("gives lower-case hex of the asked length, never the same twice across pool refills", () => {
    const seen = new Set<string>();
    for (let i = 0; i < 1000; i++) {
      const id = randomHex(32);
      expect(id).toMatch(/^[0-9a-f]{64}$/);
      seen.add(id);
    }
    expect(seen.size).toBe(1000);
    expect(randomHex(12)).toMatch(/^[0-9a-f]{24}$/);
    expect(() => randomHex(4097)).toThrow(RangeError);
  });
});
