/** The checks of what a registration request names, and how its failures are reported. */
import { readUnixSeconds } from "../challenge-window.js";
import { GatewayError, type ErrorCode } from "../errors.js";
import { isHex32, normalizeHex } from "../hex.js";
import { endpointTokenPattern } from "../../schema/signing.js";
import type { Hex } from "viem";
import { maxChallengeLifetimeSeconds } from "./typed-data.js";

export function chainError(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  return new GatewayError("chain_unavailable", "the chain could not be read", { cause: err });
}

/**
 * Re-raises a failure of the lead-supplied URL checks with a message that cannot carry the
 * endpoint URL or token, and without its cause (which may name the host): both reach clients
 * or logs.
 */
export function scrubbed(
  err: unknown,
  code: ErrorCode,
  fallback: string,
  secrets: string[],
): GatewayError {
  const hosts = secrets.flatMap((s) => {
    try {
      const host = new URL(s).hostname;
      return host === "" ? [] : [host];
    } catch {
      return [];
    }
  });
  const leaks = [...secrets, ...hosts].filter((s) => s.length > 0);
  if (err instanceof GatewayError) {
    const message = leaks.some((s) => err.message.includes(s)) ? fallback : err.message;
    return new GatewayError(err.code, message);
  }
  return new GatewayError(code, fallback);
}

export function readOfferId(value: unknown): Hex {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError("invalid_request", "offerId is required");
  }
  if (!isHex32(value)) {
    throw new GatewayError("invalid_hex", "offerId must be a Hex32 (0x + 64 hex digits)");
  }
  return normalizeHex(value);
}

export function readEndpointUrl(value: unknown): string {
  if (typeof value !== "string" || value.trim() === "") {
    throw new GatewayError("invalid_request", "endpointUrl is required");
  }
  if (value.length > 2048) throw new GatewayError("invalid_request", "endpointUrl is too long");
  return value;
}

export function readEndpointToken(value: unknown): string | undefined {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string" || !endpointTokenPattern.test(value)) {
    throw new GatewayError(
      "invalid_request",
      "endpointToken must be 1 to 4096 visible ASCII characters (no spaces or control characters)",
    );
  }
  return value;
}

/** Unix seconds as a number, a bigint (protobuf int64) or a decimal string. */
export function readExpiresAt(value: unknown): number {
  return readUnixSeconds(value, "expiresAt", { decimalStrings: true });
}

export function checkExpiry(expiresAt: number, now: number): void {
  if (expiresAt <= now) {
    throw new GatewayError("challenge_expiry_invalid", "expiresAt is in the past");
  }
  if (expiresAt > now + maxChallengeLifetimeSeconds) {
    throw new GatewayError(
      "challenge_expiry_invalid",
      `expiresAt must be at most ${maxChallengeLifetimeSeconds} seconds ahead`,
    );
  }
}
