/** The checks of what a request to the authorization service names (shapes, times, caps). */
import { getAddress, isAddress, type Address, type Hex } from "viem";
import { readExpiresAt, readUnixSeconds } from "../challenge-window.js";
import { GatewayError } from "../errors.js";
import { isHex32, normalizeHex } from "../hex.js";
import { capPeriods, isAuthorizationPeriod, type AuthorizationPeriod } from "./periods.js";
import {
  anyPermit,
  listSignatureMaxLifetimeSeconds,
  revokeBeforeMaxAgeSeconds,
  revokeBeforeSkewSeconds,
} from "./typed-data.js";

/** A payer's listing: authorizations per page by default, and at most. */
export const payerListDefaultLimit = 50;
export const payerListMaxLimit = 100;

/** An API key's public id (adapters/pg/api-keys.ts makes them). */
export const apiKeyIdShape = /^key_[0-9a-f]{24}$/;

export const authorizationIdShape = /^pauth_[0-9a-f]{24}$/;

/** The deployment a payer signed for: this one, else 403 `wrong_deployment`. */
export function readDeployment(value: unknown, deployment: string): void {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError(
      "invalid_request",
      "deployment is required: the gateway deployment signed for (GET /v1/gateway)",
    );
  }
  if (value !== deployment) {
    throw new GatewayError(
      "wrong_deployment",
      `this signature was made for gateway deployment ${value.slice(0, 80)}; ` +
        `this is ${deployment} (GET /v1/gateway)`,
    );
  }
}

/** A ListAuthorizations `expiresAt`: in the future, at most 10 minutes ahead. */
export function readSignatureExpiry(value: unknown, now: number): number {
  const n = readUnixSeconds(value, "expiresAt");
  if (n <= now) {
    throw new GatewayError(
      "signature_expired",
      `this signature expired at ${n} (the gateway's clock says ${now}): sign a new one`,
    );
  }
  if (n > now + listSignatureMaxLifetimeSeconds) {
    throw new GatewayError(
      "invalid_request",
      `expiresAt may be at most ${listSignatureMaxLifetimeSeconds} seconds ahead (${now + listSignatureMaxLifetimeSeconds})`,
    );
  }
  return n;
}

/**
 * A RevokeAuthorizations `before`: at most a minute ahead of the gateway's clock, and at most
 * {@link revokeBeforeMaxAgeSeconds} behind it (401 `signature_expired`: an old revocation is
 * signed again, and a replay can stretch a revocation by that much at most).
 */
export function readBefore(value: unknown, now: number): number {
  const n = readUnixSeconds(value, "before");
  if (n <= 0) throw new GatewayError("invalid_request", "before must be positive (Unix seconds)");
  if (n < now - revokeBeforeMaxAgeSeconds) {
    throw new GatewayError(
      "signature_expired",
      `this revocation's before (${n}) is more than ${revokeBeforeMaxAgeSeconds} seconds behind the gateway's clock (${now}): ` +
        "sign a new one (and check this machine's clock)",
    );
  }
  if (n > now + revokeBeforeSkewSeconds) {
    throw new GatewayError(
      "invalid_request",
      `before may be at most ${revokeBeforeSkewSeconds} seconds ahead of the gateway's clock (${now})`,
    );
  }
  return n;
}

export function readLimit(value: number | undefined): number {
  if (value === undefined || value === 0) return payerListDefaultLimit;
  if (!Number.isInteger(value) || value < 1 || value > payerListMaxLimit) {
    throw new GatewayError(
      "invalid_request",
      `limit must be an integer from 1 to ${payerListMaxLimit}`,
    );
  }
  return value;
}

export function readPayer(value: unknown): Address {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError("invalid_request", "payer is required");
  }
  if (!isAddress(value, { strict: false })) {
    throw new GatewayError(
      "invalid_hex",
      "payer must be an address (0x followed by 40 hex digits)",
    );
  }
  return getAddress(value);
}

export function readPermitId(value: unknown, required: boolean): Hex {
  if (value === undefined || value === null || value === "") {
    if (required) throw new GatewayError("invalid_request", "permitId is required");
    return anyPermit;
  }
  if (typeof value !== "string" || !isHex32(value)) {
    throw new GatewayError(
      "invalid_hex",
      "permitId must be a Hex32 (0x followed by 64 hex digits)",
    );
  }
  return normalizeHex(value);
}

/**
 * How far in the future a challenge's `issuedAt` may be (clocks of gateway processes differ by
 * a little), and how old it may be when submitted: a challenge is answered in minutes, and an
 * old unsubmitted signature is a liability to its payer.
 */
export const issuedAtSkewSeconds = 60;
export const challengeMaxAgeSeconds = 24 * 3600;

export function readIssuedAt(value: unknown, now: number): number {
  let n = Number.NaN;
  if (typeof value === "number") n = value;
  else if (typeof value === "bigint") n = Number(value);
  if (!Number.isSafeInteger(n) || n <= 0) {
    throw new GatewayError(
      "invalid_request",
      "issuedAt must be the challenge's issuedAt (Unix seconds)",
    );
  }
  if (n > now + issuedAtSkewSeconds) {
    throw new GatewayError("invalid_request", "issuedAt is in the future");
  }
  if (n < now - challengeMaxAgeSeconds) {
    throw new GatewayError(
      "challenge_expired",
      `this challenge was issued more than ${challengeMaxAgeSeconds / 3600} hours ago: ask for a new one`,
    );
  }
  return n;
}

/**
 * An authorization's expiry: in the future, and at most `maxLifetime` seconds after it was
 * issued (400 `authorization_expiry_too_far` otherwise, naming the cap).
 */
export function readAuthorizationExpiry(
  value: unknown,
  now: number,
  issuedAt: number,
  maxLifetime: number,
): number {
  const expiresAt = readExpiresAt(value, now);
  if (expiresAt > issuedAt + maxLifetime) {
    throw new GatewayError(
      "authorization_expiry_too_far",
      `expiresAt may be at most ${maxLifetime} seconds after the challenge (${issuedAt + maxLifetime}); ` +
        "this gateway's AUTHORIZATION_MAX_EXPIRY_SECONDS",
    );
  }
  return expiresAt;
}

const uint256Max = (1n << 256n) - 1n;

function readCredits(value: unknown, name: string): bigint {
  if (value === undefined || value === null || value === "") return 0n;
  if (typeof value !== "string" || !/^(0|[1-9][0-9]{0,77})$/.test(value)) {
    throw new GatewayError(
      "invalid_request",
      `${name} must be a decimal string of credits (the permit's smallest unit; "0": no cap)`,
    );
  }
  const n = BigInt(value);
  if (n > uint256Max) throw new GatewayError("invalid_request", `${name} is above 2^256 - 1`);
  return n;
}

/** An authorization's caps, as signed (typed-data.ts `AuthorizeKey`). */
export interface AuthorizationCaps {
  readonly totalCap: bigint;
  readonly perRequestCap: bigint;
  /** The periodic cap's period (issue 38); "": none. */
  readonly period: AuthorizationPeriod;
  /** Credits per period; 0n: none (exactly when `period` is ""). */
  readonly periodCap: bigint;
  /**
   * The soft threshold (issue 38): credits of use (the current period's with a periodic cap,
   * else the total's) from which answers carry a warning; 0n: none.
   */
  readonly warnAt: bigint;
}

/**
 * An authorization's caps (issue 28, item 7; issue 38): credits in the permit's smallest unit, 0
 * for none. A cap names one permit, whose token is its unit; a per-request cap above the total
 * (or above the periodic cap) could never be reached, and is refused. A periodic cap names its
 * period and its credits, both or neither. A soft threshold (`warnAt`) is measured on the
 * ledger a cap keeps, so it needs a total or periodic cap and is at most the cap it is measured
 * against (the periodic one when there is one): one above it would never be reached.
 */
export function readCaps(
  totalValue: unknown,
  perRequestValue: unknown,
  permitId: Hex,
  periodValue?: unknown,
  periodCapValue?: unknown,
  warnAtValue?: unknown,
): AuthorizationCaps {
  const totalCap = readCredits(totalValue, "totalCap");
  const perRequestCap = readCredits(perRequestValue, "perRequestCap");
  const period = periodValue === undefined || periodValue === null ? "" : periodValue;
  if (!isAuthorizationPeriod(period)) {
    throw new GatewayError(
      "authorization_cap_invalid",
      `period must be one of ${capPeriods.join(", ")} (UTC calendar periods), or "" for none`,
    );
  }
  const periodCap = readCredits(periodCapValue, "periodCap");
  if ((period === "") !== (periodCap === 0n)) {
    throw new GatewayError(
      "authorization_cap_invalid",
      "a periodic cap names both its period and its credits (periodCap), or neither",
    );
  }
  if ((totalCap !== 0n || perRequestCap !== 0n || periodCap !== 0n) && permitId === anyPermit) {
    throw new GatewayError(
      "authorization_cap_invalid",
      "a credit cap needs one permit (permitId): its token is the cap's unit",
    );
  }
  if (totalCap !== 0n && perRequestCap > totalCap) {
    throw new GatewayError("authorization_cap_invalid", "perRequestCap is above totalCap");
  }
  if (periodCap !== 0n && perRequestCap > periodCap) {
    throw new GatewayError("authorization_cap_invalid", "perRequestCap is above periodCap");
  }
  const warnAt = readCredits(warnAtValue, "warnAt");
  const measured = periodCap !== 0n ? periodCap : totalCap;
  if (warnAt !== 0n && measured === 0n) {
    throw new GatewayError(
      "authorization_cap_invalid",
      "a soft threshold (warnAt) is measured against a total or periodic cap: set one",
    );
  }
  if (warnAt > measured) {
    throw new GatewayError(
      "authorization_cap_invalid",
      `warnAt is above ${periodCap !== 0n ? "periodCap" : "totalCap"}, which it is measured against`,
    );
  }
  return { totalCap, perRequestCap, period, periodCap, warnAt };
}
