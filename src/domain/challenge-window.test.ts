import { describe, expect, it } from "vitest";
import {
  challengeExpiry,
  newChallengeNonce,
  readChallengeNonce,
  readChallengeSignature,
  readExpiresAt,
  readUnixSeconds,
} from "./challenge-window.js";

describe("challenge window", () => {
  it("makes 32-byte hex nonces, a new one each time", () => {
    const a = newChallengeNonce();
    expect(a).toMatch(/^0x[0-9a-f]{64}$/);
    expect(newChallengeNonce()).not.toBe(a);
  });

  it("reads a nonce of 1 to 128 printable ASCII characters", () => {
    expect(readChallengeNonce("n 1")).toBe("n 1");
    for (const bad of ["", "x".repeat(129), "é", 7, undefined]) {
      expect(() => readChallengeNonce(bad)).toThrow(
        expect.objectContaining({
          code: "invalid_request",
          message: "nonce must be 1 to 128 printable ASCII characters",
        }),
      );
    }
  });

  it("requires a signature", () => {
    expect(readChallengeSignature("0xab")).toBe("0xab");
    for (const bad of ["", undefined, 1]) {
      expect(() => readChallengeSignature(bad)).toThrow(
        expect.objectContaining({ code: "invalid_request", message: "signature is required" }),
      );
    }
  });

  it("reads Unix seconds from numbers and bigints, decimal strings only when asked", () => {
    expect(readUnixSeconds(5, "t")).toBe(5);
    expect(readUnixSeconds(6n, "t")).toBe(6);
    expect(readUnixSeconds("7", "t", { decimalStrings: true })).toBe(7);
    expect(() => readUnixSeconds("7", "t")).toThrow(
      expect.objectContaining({
        code: "invalid_request",
        message: "t must be an integer (Unix seconds)",
      }),
    );
    expect(() => readUnixSeconds(1.5, "t")).toThrow(
      expect.objectContaining({ code: "invalid_request" }),
    );
  });

  it("reads an expiry in the future, and defaults one that is not named", () => {
    expect(readExpiresAt(101, 100)).toBe(101);
    expect(() => readExpiresAt(100, 100)).toThrow(
      expect.objectContaining({ code: "invalid_request", message: "expiresAt is in the past" }),
    );
    const read = (v: unknown) => readExpiresAt(v, 100);
    expect(challengeExpiry(undefined, 100, 600, read)).toBe(700);
    expect(challengeExpiry(150n, 100, 600, read)).toBe(150);
  });
});
