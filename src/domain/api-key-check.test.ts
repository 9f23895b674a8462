import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import { carriesCheck, isApiKeyShaped, newApiKey, randomBase62 } from "./api-key-check.js";

const secret = randomBytes(32);

describe("API keys that carry their own check", () => {
  it("keeps the shape of every key issued before (gw_ and 40 base62), and passes its own check", () => {
    for (let i = 0; i < 200; i++) {
      const key = newApiKey(secret);
      expect(key).toMatch(/^gw_[0-9A-Za-z]{40}$/);
      expect(isApiKeyShaped(key)).toBe(true);
      expect(carriesCheck(key, secret)).toBe(true);
    }
  });

  it("fails under another deployment's secret, and for any change of one character", () => {
    const key = newApiKey(secret);
    expect(carriesCheck(key, randomBytes(32))).toBe(false);
    for (let at = 3; at < key.length; at++) {
      const c = key[at] === "a" ? "b" : "a";
      expect(carriesCheck(key.slice(0, at) + c + key.slice(at + 1), secret)).toBe(false);
    }
  });

  it("a made-up key of the right shape fails it (100 000 tries: a pass has odds of 1 in 62^8)", () => {
    let passed = 0;
    for (let i = 0; i < 100_000; i++) if (carriesCheck(`gw_${randomBase62(40)}`, secret)) passed++;
    expect(passed).toBe(0);
  });

  it("refuses what does not have the shape, before any hashing", () => {
    for (const key of [
      "",
      "gw_",
      `gw_${"a".repeat(39)}`,
      `gw_${"a".repeat(41)}`,
      `gx_${"a".repeat(40)}`,
      `gw_${"a".repeat(39)}-`,
      ` gw_${"a".repeat(40)}`,
      `gw_${"é".repeat(40)}`,
    ]) {
      expect(isApiKeyShaped(key)).toBe(false);
      expect(carriesCheck(key, secret)).toBe(false);
    }
  });
});
