import { createHash, randomBytes } from "node:crypto";
import { BaseError } from "../../errors.js";
import type pg from "pg";

/** Anything that can run a query: the pool, or a client inside a transaction. */
export type Queryable = Pick<pg.Pool, "query">;

export const API_KEY_PREFIX = "gw_";
const KEY_BODY_LENGTH = 40;
const DISPLAY_PREFIX_LENGTH = 8;
const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

export interface CreatedApiKey {
  id: string;
  name: string;
  /** The plaintext key. It exists only here: the database keeps its hash. */
  key: string;
  prefix: string;
  createdAt: Date;
}

export interface ApiKeyInfo {
  id: string;
  name: string;
  prefix: string;
  createdAt: Date;
  revokedAt: Date | null;
}

/** `revokeApiKey` was given a prefix that several active keys share. */
export class AmbiguousApiKeyPrefixError extends BaseError {
  readonly reason = "api_key_prefix_ambiguous";
  override readonly name = "AmbiguousApiKeyPrefixError";
}

/**
 * Issues a new key: `gw_` followed by 40 base62 characters (about 238 random bits). The caller
 * must show `key` now; it cannot be recovered later.
 */
export async function createApiKey(db: Queryable, name: string): Promise<CreatedApiKey> {
  const key = API_KEY_PREFIX + randomBase62(KEY_BODY_LENGTH);
  const id = "key_" + randomBytes(12).toString("hex");
  const prefix = key.slice(0, DISPLAY_PREFIX_LENGTH);
  const { rows } = await db.query<{ created_at: Date }>(
    `INSERT INTO api_keys (id, name, key_hash, prefix) VALUES ($1, $2, $3, $4)
     RETURNING created_at`,
    [id, name, hashApiKey(key), prefix],
  );
  const row = rows[0];
  if (!row) throw new Error("INSERT INTO api_keys returned no row");
  return { id, name, key, prefix, createdAt: row.created_at };
}

/** Every key, revoked ones included, oldest first; never the key itself. */
export async function listApiKeys(db: Queryable): Promise<ApiKeyInfo[]> {
  const { rows } = await db.query<{
    id: string;
    name: string;
    prefix: string;
    created_at: Date;
    revoked_at: Date | null;
  }>("SELECT id, name, prefix, created_at, revoked_at FROM api_keys ORDER BY created_at, id");
  return rows.map((r) => ({
    id: r.id,
    name: r.name,
    prefix: r.prefix,
    createdAt: r.created_at,
    revokedAt: r.revoked_at,
  }));
}

/**
 * Revokes the active key with this id or display prefix.
 *
 * @returns true when a key was revoked, false when no active key matched (unknown or already
 *   revoked).
 * @throws AmbiguousApiKeyPrefixError when the prefix matches several active keys; revoke by id.
 */
export async function revokeApiKey(db: Queryable, idOrPrefix: string): Promise<boolean> {
  const { rows } = await db.query<{ id: string }>(
    "SELECT id FROM api_keys WHERE (id = $1 OR prefix = $1) AND revoked_at IS NULL",
    [idOrPrefix],
  );
  if (rows.length > 1) {
    throw new AmbiguousApiKeyPrefixError(
      `${rows.length} active keys start with ${idOrPrefix}; revoke one by id`,
    );
  }
  const target = rows[0];
  if (!target) return false;
  const result = await db.query(
    "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
    [target.id],
  );
  return result.rowCount === 1;
}

/**
 * SHA-256 of the key. A fast hash is the right tool here: the keys are ~238 random bits, so
 * there is nothing to brute-force, and slow password hashes (bcrypt, scrypt, argon2) would only
 * cost CPU on every request and rule out finding the key by its hash.
 */
export function hashApiKey(key: string): Buffer {
  return createHash("sha256").update(key, "utf8").digest();
}

/** Uniform base62: bytes >= 248 (4 * 62) are rejected so that `% 62` has no bias. */
function randomBase62(length: number): string {
  let out = "";
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      if (byte >= 248) continue;
      out += BASE62[byte % 62];
      if (out.length === length) break;
    }
  }
  return out;
}
