import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";

/**
 * The shape of an API key (docs/decisions/authority-and-signing.md "Unknown keys cost nothing"): `gw_` and 40 base62
 * characters. A key issued now is 32 random characters (about 190 bits) followed by an 8
 * character check: a keyed hash (HMAC-SHA256) of the rest under the deployment's secret
 * (`gateway_secrets.api_key_check`, shared by every process on the database). A key made up
 * without the secret passes the check with a chance of 1 in 62^8 (about 2^-47.6), so the gateway
 * refuses it from memory, without asking the database. Keys issued before the check existed have
 * the same shape (40 random characters) and no check: the gateway knows their hashes.
 */
export const apiKeyPrefix = "gw_";
const bodyLength = 40;
const checkLength = 8;
const randomLength = bodyLength - checkLength;
const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const shape = /^gw_[0-9A-Za-z]{40}$/;
const checkSpace = 62n ** BigInt(checkLength);

/** Whether `key` has the shape of an API key (any other value is refused at once). */
export function isApiKeyShaped(key: string): boolean {
  return shape.test(key);
}

/** The check of a key's first part: 8 base62 digits of its HMAC under `secret`. */
function checkOf(secret: Uint8Array, head: string): string {
  const mac = createHmac("sha256", secret).update(head, "utf8").digest();
  // 64 bits reduced to 62^8 (about 2^47.6): the bias is below 2^-16 per digit string.
  let n = mac.readBigUInt64BE(0) % checkSpace;
  let out = "";
  for (let i = 0; i < checkLength; i++) {
    out = base62[Number(n % 62n)]! + out;
    n /= 62n;
  }
  return out;
}

/** Whether `key` is shaped like an API key and carries the check made under `secret`. */
export function carriesCheck(key: string, secret: Uint8Array): boolean {
  if (!shape.test(key)) return false;
  const split = apiKeyPrefix.length + randomLength;
  const expected = Buffer.from(checkOf(secret, key.slice(0, split)), "latin1");
  return timingSafeEqual(expected, Buffer.from(key.slice(split), "latin1"));
}

/** A new key: `gw_`, 32 uniformly random base62 characters, and their check under `secret`. */
export function newApiKey(secret: Uint8Array): string {
  const head = apiKeyPrefix + randomBase62(randomLength);
  return head + checkOf(secret, head);
}

/** Uniform base62: bytes >= 248 (4 * 62) are rejected so that `% 62` has no bias. */
export function randomBase62(length: number): string {
  let out = "";
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      if (byte >= 248) continue;
      out += base62[byte % 62];
      if (out.length === length) break;
    }
  }
  return out;
}

/**
 * An API key's public id, derived from the key itself (issue 37): `key_` and the first 24 hex
 * digits (96 bits) of the key's SHA-256, the hash the database keeps (`api_keys.key_hash`). Whoever
 * holds the key computes its id without asking anyone (the wallet tools do: a gateway cannot make
 * a payer sign for another key), and the id reveals nothing usable about the key (a preimage of a
 * 96-bit hash prefix of 190 random bits). Keys issued before issue 37 keep their random ids
 * (same shape); their holders pin them (`--key-id`).
 */
export function apiKeyIdOf(key: string): string {
  return `key_${createHash("sha256").update(key, "utf8").digest("hex").slice(0, 24)}`;
}
