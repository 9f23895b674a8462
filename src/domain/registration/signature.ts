/** How the gateway reads a signature it is given: shape, recovery byte, canonical (low) s. */
import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { normalizeHex } from "../hex.js";
import type { ParsedSignature } from "../signatures.js";

/** secp256k1's group order n, and n / 2: a canonical ECDSA signature has s <= n / 2. */
const secp256k1N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const secp256k1HalfN = secp256k1N / 2n;

/**
 * Reads a registration signature: 0x-hex of 65 bytes (`r | s | v`, v in {0, 1, 27, 28}) or
 * 64 bytes (EIP-2098 `r | yParityAndS`). Refuses a non-canonical (high-s) signature: its
 * twin `(r, n - s)` is equally valid, so accepting both would let anyone mint a second
 * signature for the same challenge. Throws `invalid_signature`.
 */
export function parseRegistrationSignature(signature: string): ParsedSignature {
  if (!/^0x(?:[0-9a-fA-F]{128}|[0-9a-fA-F]{130})$/.test(signature)) {
    throw new GatewayError(
      "invalid_signature",
      "signature must be 0x-hex of 65 bytes, or 64 bytes (EIP-2098 compact)",
    );
  }
  const r = BigInt(`0x${signature.slice(2, 66)}`);
  const word = BigInt(`0x${signature.slice(66, 130)}`);
  let s: bigint;
  let yParity: number;
  let compact: Hex | undefined;
  if (signature.length === 132) {
    s = word;
    const v = Number.parseInt(signature.slice(130, 132), 16);
    if (v === 0 || v === 1) yParity = v;
    else if (v === 27 || v === 28) yParity = v - 27;
    else throw new GatewayError("invalid_signature", "signature has an invalid recovery byte v");
  } else {
    yParity = Number(word >> 255n);
    s = word & ((1n << 255n) - 1n);
    compact = normalizeHex(signature);
  }
  if (r === 0n || r >= secp256k1N || s === 0n || s >= secp256k1N) {
    throw new GatewayError("invalid_signature", "signature is not a valid ECDSA signature");
  }
  if (s > secp256k1HalfN) {
    throw new GatewayError(
      "invalid_signature",
      "signature is not canonical (high s); sign again with a library that produces low-s signatures",
    );
  }
  const full = `0x${hex32(r)}${hex32(s)}${(27 + yParity).toString(16)}` as Hex;
  return compact === undefined ? { full } : { full, compact };
}

function hex32(value: bigint): string {
  return value.toString(16).padStart(64, "0");
}
