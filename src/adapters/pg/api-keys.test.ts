import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import {
  AmbiguousApiKeyPrefixError,
  createApiKey,
  listApiKeys,
  revokeApiKey,
  type Queryable,
} from "./api-keys.js";
import { findApiKeyWithAuthorizations } from "./permit-authorizations.js";
import { apiKeyIdOf } from "../../domain/api-key-check.js";

/** The gateway's lookup of a key (with its permit authorizations, none here). */
const findActiveApiKey = (db: Queryable, key: string) =>
  findApiKeyWithAuthorizations(db, key, 1_800_000_000);

const test = useTestDatabase();

describe("api keys", () => {
  it("creates a key that can be found, and lists it without the key", async () => {
    const created = await createApiKey(test.db.pool, "ci");
    expect(created.key).toMatch(/^gw_[0-9A-Za-z]{40}$/);
    expect(created.id).toMatch(/^key_[0-9a-f]{24}$/);
    expect(created.prefix).toBe(created.key.slice(0, 8));
    expect(created.name).toBe("ci");
    expect(created.createdAt).toBeInstanceOf(Date);

    expect(await findActiveApiKey(test.db.pool, created.key)).toEqual({
      id: created.id,
      authorizations: [],
    });

    const listed = (await listApiKeys(test.db.pool)).find((k) => k.id === created.id);
    expect(listed).toEqual({
      id: created.id,
      name: "ci",
      prefix: created.prefix,
      createdAt: created.createdAt,
      revokedAt: null,
    });
  });

  it("derives a key's id from the key: the prefix of the hash the database keeps", async () => {
    // A fixed vector (sha256sum of the key's bytes, its first 24 hex digits).
    expect(apiKeyIdOf(`gw_${"0".repeat(40)}`)).toBe("key_56542952ab7be07298eb896f");
    expect(apiKeyIdOf(`gw_${"a".repeat(40)}`)).toBe(
      `key_${createHash("sha256")
        .update(`gw_${"a".repeat(40)}`)
        .digest("hex")
        .slice(0, 24)}`,
    );
    const created = await createApiKey(test.db.pool, "derived");
    expect(created.id).toBe(apiKeyIdOf(created.key));
    const { rows } = await test.db.pool.query<{ derived: string }>(
      "SELECT 'key_' || substr(encode(key_hash, 'hex'), 1, 24) AS derived FROM api_keys WHERE id = $1",
      [created.id],
    );
    expect(rows[0]!.derived).toBe(created.id);
  });

  it("never stores the plaintext key", async () => {
    const created = await createApiKey(test.db.pool, "secret holder");
    const secret = created.key.slice(created.prefix.length);
    const { rows } = await test.db.pool.query<Record<string, unknown>>(
      "SELECT *, api_keys::text AS whole_row FROM api_keys",
    );
    const rendered = rows.flatMap((row) =>
      Object.values(row).flatMap((v) =>
        Buffer.isBuffer(v)
          ? [v.toString("hex"), v.toString("utf8"), v.toString("latin1"), v.toString("base64")]
          : [String(v)],
      ),
    );
    expect(rendered.length).toBeGreaterThan(0);
    for (const text of rendered) {
      expect(text).not.toContain(created.key);
      expect(text).not.toContain(secret);
    }
  });

  it("does not find a wrong key", async () => {
    const created = await createApiKey(test.db.pool, "real");
    const last = created.key.at(-1) === "a" ? "b" : "a";
    expect(await findActiveApiKey(test.db.pool, created.key.slice(0, -1) + last)).toBeNull();
    expect(await findActiveApiKey(test.db.pool, "gw_" + "0".repeat(40))).toBeNull();
    expect(await findActiveApiKey(test.db.pool, created.prefix)).toBeNull();
    expect(await findActiveApiKey(test.db.pool, "")).toBeNull();
    expect(await findActiveApiKey(test.db.pool, "Bearer " + created.key)).toBeNull();
  });

  it("revokes by id: the key is no longer found but still listed", async () => {
    const created = await createApiKey(test.db.pool, "to revoke");
    expect(await revokeApiKey(test.db.pool, created.id)).toBe(true);
    expect(await findActiveApiKey(test.db.pool, created.key)).toBeNull();
    const listed = (await listApiKeys(test.db.pool)).find((k) => k.id === created.id);
    expect(listed?.revokedAt).toBeInstanceOf(Date);
    // A second revocation changes nothing.
    expect(await revokeApiKey(test.db.pool, created.id)).toBe(false);
  });

  it("revokes by display prefix", async () => {
    const created = await createApiKey(test.db.pool, "by prefix");
    expect(await revokeApiKey(test.db.pool, created.prefix)).toBe(true);
    expect(await findActiveApiKey(test.db.pool, created.key)).toBeNull();
  });

  it("revokes nothing for an unknown id or prefix", async () => {
    expect(await revokeApiKey(test.db.pool, "key_000000000000000000000000")).toBe(false);
    expect(await revokeApiKey(test.db.pool, "gw_zzzzz")).toBe(false);
  });

  it("refuses a prefix shared by several active keys", async () => {
    const a = await createApiKey(test.db.pool, "a");
    const b = await createApiKey(test.db.pool, "b");
    // Prefixes are random; force a clash to exercise the guard.
    await test.db.pool.query("UPDATE api_keys SET prefix = $1 WHERE id = $2", [a.prefix, b.id]);
    await expect(revokeApiKey(test.db.pool, a.prefix)).rejects.toBeInstanceOf(
      AmbiguousApiKeyPrefixError,
    );
    expect(await findActiveApiKey(test.db.pool, a.key)).not.toBeNull();
    expect(await findActiveApiKey(test.db.pool, b.key)).not.toBeNull();
  });

  it("works on a client inside a transaction", async () => {
    const client = await test.db.pool.connect();
    try {
      await client.query("BEGIN");
      const created = await createApiKey(client, "rolled back");
      expect(await findActiveApiKey(client, created.key)).not.toBeNull();
      await client.query("ROLLBACK");
      expect(await findActiveApiKey(client, created.key)).toBeNull();
    } finally {
      client.release();
    }
  });
});
