import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { BaseError } from "../../domain/base-error.js";

/**
 * Authenticated encryption for secrets the gateway must store but never show: provider endpoint
 * URLs and tokens. AES-256-GCM with a fresh 96-bit IV per message; the layout is
 * `version (1) | iv (12) | tag (16) | ciphertext`, so a future key or algorithm can be told
 * apart by its first byte.
 */
export interface Sealer {
  /**
   * Encrypts `plain`. `aad` (additional authenticated data) is not stored but must be given
   * again to {@link Sealer.open}: binding a sealed value to its row (e.g. the offer id) stops
   * a sealed blob copied to another row from opening there.
   */
  seal(plain: Buffer | string, aad?: Buffer | string): Buffer;
  /** Decrypts what {@link Sealer.seal} made with the same key and `aad`; throws {@link SealerError} otherwise. */
  open(sealed: Buffer, aad?: Buffer | string): Buffer;
}

/** Sealing or opening failed. The message never contains key material or plaintext. */
export class SealerError extends BaseError {
  readonly reason = "sealed_data_invalid";
  override readonly name = "SealerError";
}

export const SEALED_VERSION = 1;
const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;
const HEADER_BYTES = 1 + IV_BYTES + TAG_BYTES;

/** A sealer on a 32-byte AES-256 key (see {@link parseEncryptionKey}). */
export function createSealer(key: Buffer): Sealer {
  if (key.length !== KEY_BYTES) {
    throw new SealerError(`encryption key must be ${KEY_BYTES} bytes, got ${key.length}`);
  }
  // Our own copy: a caller zeroing or reusing its buffer must not change the key under us.
  const secret = Buffer.from(key);
  return {
    seal(plain, aad) {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv("aes-256-gcm", secret, iv, { authTagLength: TAG_BYTES });
      if (aad !== undefined) cipher.setAAD(toBuffer(aad));
      const ciphertext = Buffer.concat([cipher.update(toBuffer(plain)), cipher.final()]);
      return Buffer.concat([Buffer.of(SEALED_VERSION), iv, cipher.getAuthTag(), ciphertext]);
    },
    open(sealed, aad) {
      if (sealed.length < HEADER_BYTES) throw new SealerError("sealed value is truncated");
      if (sealed[0] !== SEALED_VERSION) {
        throw new SealerError(`sealed value has unknown version ${String(sealed[0])}`);
      }
      const iv = sealed.subarray(1, 1 + IV_BYTES);
      const tag = sealed.subarray(1 + IV_BYTES, HEADER_BYTES);
      const decipher = createDecipheriv("aes-256-gcm", secret, iv, { authTagLength: TAG_BYTES });
      decipher.setAuthTag(tag);
      if (aad !== undefined) decipher.setAAD(toBuffer(aad));
      try {
        return Buffer.concat([decipher.update(sealed.subarray(HEADER_BYTES)), decipher.final()]);
      } catch {
        // GCM gives one verdict for all of these; there is nothing more to say safely.
        throw new SealerError("sealed value could not be opened (wrong key, or altered)");
      }
    },
  };
}

const hexKey = /^[0-9a-fA-F]{64}$/;
const base64Key = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const base64UrlKey = /^[A-Za-z0-9_-]{43}=?$/;

/**
 * Reads a configured key: 64 hex characters, or the base64 (standard or URL-safe) of exactly
 * 32 bytes. Surrounding whitespace is ignored. The error never repeats the value, which is a
 * secret even when it is malformed (it may be a real key pasted with one character wrong).
 */
export function parseEncryptionKey(text: string): Buffer {
  const value = text.trim();
  if (hexKey.test(value)) return Buffer.from(value, "hex");
  let key: Buffer | undefined;
  if (value.length > 0 && base64Key.test(value)) key = Buffer.from(value, "base64");
  else if (base64UrlKey.test(value)) key = Buffer.from(value, "base64url");
  if (key?.length === KEY_BYTES) return key;
  throw new SealerError(
    "encryption key must be 64 hex characters or the base64 of 32 bytes " +
      "(generate one with: openssl rand -hex 32)",
  );
}

/** A fresh random 32-byte key; `.toString("hex")` gives the form {@link parseEncryptionKey} reads. */
export function generateEncryptionKey(): Buffer {
  return randomBytes(KEY_BYTES);
}

function toBuffer(value: Buffer | string): Buffer {
  return typeof value === "string" ? Buffer.from(value, "utf8") : value;
}
