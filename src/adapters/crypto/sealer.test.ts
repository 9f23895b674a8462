import { randomBytes } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  SEALED_VERSION,
  SealerError,
  createSealer,
  generateEncryptionKey,
  parseEncryptionKey,
} from "./sealer.js";

describe("sealer", () => {
  const key = generateEncryptionKey();
  const sealer = createSealer(key);

  it("round-trips strings and bytes", () => {
    const text = JSON.stringify({ url: "https://provider.example/v1", token: "tok_secret" });
    const sealed = sealer.seal(text);
    expect(sealer.open(sealed).toString("utf8")).toBe(text);
    const bytes = Buffer.from([0, 1, 2, 255]);
    expect(sealer.open(sealer.seal(bytes))).toEqual(bytes);
    expect(sealer.open(sealer.seal("")).length).toBe(0);
  });

  it("lays out version | iv | tag | ciphertext and never repeats an iv", () => {
    const a = sealer.seal("same plaintext");
    const b = sealer.seal("same plaintext");
    expect(a[0]).toBe(SEALED_VERSION);
    expect(a.length).toBe(1 + 12 + 16 + "same plaintext".length);
    expect(a.subarray(1, 13).equals(b.subarray(1, 13))).toBe(false);
    expect(a.toString("latin1")).not.toContain("same plaintext");
  });

  it("detects tampering anywhere in the sealed value", () => {
    const sealed = sealer.seal("https://provider.example/secret-path");
    for (const index of [1, 12, 13, 28, 29, sealed.length - 1]) {
      const altered = Buffer.from(sealed);
      altered[index] = altered[index]! ^ 0x01;
      expect(() => sealer.open(altered)).toThrow(SealerError);
    }
    expect(() => sealer.open(sealed.subarray(0, sealed.length - 1))).toThrow(SealerError);
    expect(() => sealer.open(sealed.subarray(0, 20))).toThrow(/truncated/);
    const otherVersion = Buffer.from(sealed);
    otherVersion[0] = 9;
    expect(() => sealer.open(otherVersion)).toThrow(/version/);
  });

  it("fails with another key, without revealing the plaintext", () => {
    const sealed = sealer.seal("tok_do_not_leak");
    const other = createSealer(generateEncryptionKey());
    let error: unknown;
    try {
      other.open(sealed);
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(SealerError);
    expect(String((error as Error).message)).not.toContain("tok_do_not_leak");
  });

  it("binds additional authenticated data", () => {
    const sealed = sealer.seal("payload", "offer-a");
    expect(sealer.open(sealed, "offer-a").toString()).toBe("payload");
    expect(() => sealer.open(sealed, "offer-b")).toThrow(SealerError);
    expect(() => sealer.open(sealed)).toThrow(SealerError);
  });

  it("refuses keys that are not 32 bytes", () => {
    expect(() => createSealer(Buffer.alloc(16))).toThrow(SealerError);
  });
});

describe("parseEncryptionKey", () => {
  const key = generateEncryptionKey();

  it("reads 64 hex characters, base64 and base64url of 32 bytes", () => {
    expect(parseEncryptionKey(key.toString("hex"))).toEqual(key);
    expect(parseEncryptionKey(key.toString("hex").toUpperCase())).toEqual(key);
    expect(parseEncryptionKey(` ${key.toString("base64")}\n`)).toEqual(key);
    expect(parseEncryptionKey(key.toString("base64url"))).toEqual(key);
  });

  it("refuses anything else without echoing the value", () => {
    const bad = [
      "",
      "not a key",
      key.toString("hex").slice(0, 62),
      `${key.toString("hex")}00`,
      randomBase64(16),
      randomBase64(33),
      `${key.toString("base64").slice(0, -2)}!=`,
    ];
    for (const value of bad) {
      let error: unknown;
      try {
        parseEncryptionKey(value);
      } catch (err) {
        error = err;
      }
      expect(error, value).toBeInstanceOf(SealerError);
      const message = (error as Error).message;
      expect(message).toMatch(/64 hex characters or the base64 of 32 bytes/);
      if (value.length > 0) expect(message).not.toContain(value);
    }
  });
});

function randomBase64(bytes: number): string {
  return randomBytes(bytes).toString("base64");
}
