import { randomBytes } from "node:crypto";
import { GatewayError } from "./errors.js";
import { noncePattern } from "../schema/signing.js";

/**
 * The window of a signed challenge: an endpoint registration, a permit authorization, an offer
 * key binding. The gateway hands out typed data naming a nonce and an expiry; the signer sends
 * them back with a signature, and the gateway reads them by the rules here before it checks
 * anything else. What each challenge adds (registration's MAC'd nonces and 15-minute cap, an
 * authorization's `issuedAt` and lifetime cap) stays with it.
 */

/** A nonce the gateway makes for a challenge: 32 random bytes, 0x-hex. */
export function newChallengeNonce(): string {
  return `0x${randomBytes(32).toString("hex")}`;
}

/** A signed challenge's nonce: 1 to 128 printable ASCII characters; 400 `invalid_request` otherwise. */
export function readChallengeNonce(value: unknown): string {
  if (typeof value !== "string" || !noncePattern.test(value)) {
    throw new GatewayError("invalid_request", "nonce must be 1 to 128 printable ASCII characters");
  }
  return value;
}

/** A signed challenge's signature, not yet parsed: a non-empty string; 400 `invalid_request` otherwise. */
export function readChallengeSignature(value: unknown): string {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError("invalid_request", "signature is required");
  }
  return value;
}

/**
 * Unix seconds as a number or a bigint (protobuf int64), and with `decimalStrings` a decimal
 * string of up to 16 digits; a safe integer, 400 `invalid_request` naming `name` otherwise.
 */
export function readUnixSeconds(
  value: unknown,
  name: string,
  opts: { decimalStrings?: boolean } = {},
): number {
  let n = Number.NaN;
  if (typeof value === "number") n = value;
  else if (typeof value === "bigint") n = Number(value);
  else if (opts.decimalStrings === true && typeof value === "string" && /^-?\d{1,16}$/.test(value))
    n = Number(value);
  if (!Number.isSafeInteger(n)) {
    throw new GatewayError("invalid_request", `${name} must be an integer (Unix seconds)`);
  }
  return n;
}

/**
 * A signed request's `expiresAt`: Unix seconds, a safe integer, in the future; 400
 * `invalid_request` otherwise. Permit authorizations and offer key bindings read it alike.
 */
export function readExpiresAt(value: unknown, now: number): number {
  const n = readUnixSeconds(value, "expiresAt");
  if (n <= now) throw new GatewayError("invalid_request", "expiresAt is in the past");
  return n;
}

/**
 * The expiry a new challenge names: `now + defaultLifetime` when the request names none
 * (`undefined`), else what `read` makes of the requested one.
 */
export function challengeExpiry(
  value: unknown,
  now: number,
  defaultLifetime: number,
  read: (value: unknown) => number,
): number {
  return value === undefined ? now + defaultLifetime : read(value);
}
