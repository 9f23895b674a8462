import { createHash, randomBytes } from "node:crypto";
import { BaseError } from "../../domain/base-error.js";
import { apiKeyIdOf, apiKeyPrefix, newApiKey } from "../../domain/api-key-check.js";
import type pg from "pg";

/** Anything that can run a query: the pool, or a client inside a transaction. */
export type Queryable = Pick<pg.Pool, "query">;

export const API_KEY_PREFIX = apiKeyPrefix;
const DISPLAY_PREFIX_LENGTH = 8;
/** `gateway_secrets` row of the key the API keys' check is made under (migration 029). */
const checkSecretName = "api_key_check";

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
 * The deployment's secret the API keys' check is made under (src/domain/api-key-check.ts): 32
 * random bytes kept in `gateway_secrets`, made by the first process that asks, the same for
 * every process (and `gateway keys create`) on the database. Never logged or answered.
 */
export async function apiKeyCheckSecret(db: Queryable): Promise<Buffer> {
  await db.query(
    "INSERT INTO gateway_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
    [checkSecretName, randomBytes(32)],
  );
  // A statement of its own: a concurrent first insert is visible to it once committed.
  const { rows } = await db.query<{ value: Buffer }>(
    "SELECT value FROM gateway_secrets WHERE name = $1",
    [checkSecretName],
  );
  const value = rows[0]?.value;
  if (value === undefined || value.length < 32)
    throw new Error("gateway_secrets has no api_key_check");
  return value;
}

/**
 * Issues a new key: `gw_` followed by 32 random base62 characters (about 190 bits) and an 8
 * character check under the deployment's secret ({@link apiKeyCheckSecret}), which lets every
 * gateway refuse a made-up key without a query. Its id is derived from it ({@link apiKeyIdOf}). The caller must show `key` now; it cannot be
 * recovered later.
 */
export async function createApiKey(db: Queryable, name: string): Promise<CreatedApiKey> {
  const key = newApiKey(await apiKeyCheckSecret(db));
  // Derived from the key (the prefix of its stored hash): its holder computes it alone.
  const id = apiKeyIdOf(key);
  const prefix = key.slice(0, DISPLAY_PREFIX_LENGTH);
  const { rows } = await db.query<{ created_at: Date }>(
    `INSERT INTO api_keys (id, name, key_hash, prefix, key_check) VALUES ($1, $2, $3, $4, true)
     RETURNING created_at`,
    [id, name, hashApiKey(key), prefix],
  );
  const row = rows[0];
  if (!row) throw new Error("INSERT INTO api_keys returned no row");
  return { id, name, key, prefix, createdAt: row.created_at };
}

/**
 * The SHA-256 (base64) of every active key issued without a check (before migration 029): a
 * gateway holds them, so a made-up key of their shape is refused without a query.
 */
export async function uncheckedApiKeyHashes(db: Queryable): Promise<string[]> {
  const { rows } = await db.query<{ key_hash: Buffer }>(
    "SELECT key_hash FROM api_keys WHERE NOT key_check AND revoked_at IS NULL",
  );
  return rows.map((r) => r.key_hash.toString("base64"));
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
 * SHA-256 of the key. A fast hash is the right tool here: the keys are 190 random bits or more, so
 * there is nothing to brute-force, and slow password hashes (bcrypt, scrypt, argon2) would only
 * cost CPU on every request and rule out finding the key by its hash.
 */
export function hashApiKey(key: string): Buffer {
  return createHash("sha256").update(key, "utf8").digest();
}
