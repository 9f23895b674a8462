/**
 * The gateway's self-authenticating challenge nonces (see `createRegistrationService` in
 * service.ts): what tells altered fields from a wrong signer when a signature fails.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { Address, Hex } from "viem";
import { GatewayError } from "../errors.js";

// v2: the MAC also covers the endpoint token's hash (typed data version "3").
const nonceMacLabel = Buffer.from("model-market-gateway/register-endpoint-nonce/v2", "utf8");
const gatewayNonceShape = /^0x[0-9a-fA-F]{64}$/;

/** What a gateway nonce's MAC covers. */
export interface NonceMacFields {
  chainId: number;
  market: Address;
  offerId: Hex;
  urlHash: Hex;
  tokenHash: Hex;
  expiresAt: number;
}

/**
 * The MAC half of a gateway nonce: HMAC-SHA256 over the chain, the market and the challenge
 * fields (the endpoint token's hash among them, so a token swapped after the challenge reads as
 * altered fields, 401, not as a wrong signer), truncated to 16 bytes. The operator is left out on purpose: when the chain's
 * operator changes between challenge and registration, a signature by the former operator
 * is a wrong signer (403), not tampering.
 */
function nonceMac(secret: Buffer, f: NonceMacFields, random: Buffer): Buffer {
  const expires = Buffer.alloc(8);
  expires.writeBigUInt64BE(BigInt(f.expiresAt));
  const chainId = Buffer.alloc(8);
  chainId.writeBigUInt64BE(BigInt(f.chainId));
  return createHmac("sha256", secret)
    .update(nonceMacLabel)
    .update(chainId)
    .update(Buffer.from(f.market.slice(2), "hex"))
    .update(Buffer.from(f.offerId.slice(2), "hex"))
    .update(Buffer.from(f.urlHash.slice(2), "hex"))
    .update(Buffer.from(f.tokenHash.slice(2), "hex"))
    .update(expires)
    .update(random)
    .digest()
    .subarray(0, 16);
}

/** A new gateway nonce: `0x || random(16) || MAC(random)[0..16]`, lower-case hex. */
export function newGatewayNonce(secret: Buffer, fields: NonceMacFields): string {
  const random = randomBytes(16);
  const mac = nonceMac(secret, fields, random);
  return `0x${random.toString("hex")}${mac.toString("hex")}`;
}

/** Whether `nonce` is exactly a gateway nonce whose MAC matches `fields`. */
export function isAuthenticNonce(secret: Buffer, nonce: string, fields: NonceMacFields): boolean {
  if (!/^0x[0-9a-f]{64}$/.test(nonce)) return false;
  const random = Buffer.from(nonce.slice(2, 34), "hex");
  const mac = Buffer.from(nonce.slice(34), "hex");
  return timingSafeEqual(mac, nonceMac(secret, fields, random));
}

/** The refusal of a signature that is not the operator's (steps 2 and 3 of the service's rule). */
export function classifyFailure(f: {
  nonce: string;
  authentic: () => boolean;
  operator: Address;
  recovered: Address;
}): GatewayError {
  if (gatewayNonceShape.test(f.nonce)) {
    if (!f.authentic()) {
      return new GatewayError(
        "invalid_signature",
        "signature does not match the challenge fields (offerId, endpointUrl, endpointToken, nonce, expiresAt)",
      );
    }
    return new GatewayError(
      "not_offer_operator",
      `challenge was signed by ${f.recovered}, not by the offer's operator ${f.operator}`,
    );
  }
  return new GatewayError(
    "not_offer_operator",
    `signature is not from the offer's operator ${f.operator}`,
  );
}
