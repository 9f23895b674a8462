import type pg from "pg";
import type { ChatEvent, IdempotencyClaim, IdempotencyStore } from "../../domain/chat/index.js";

export type Queryable = Pick<pg.Pool, "query">;

/** Events as JSON: bigints as decimal strings, chunk bytes as base64. */
function encodeEvent(event: ChatEvent): Buffer {
  return Buffer.from(
    JSON.stringify(event, (_key, value: unknown) => {
      if (typeof value === "bigint") return { $bigint: value.toString() };
      if (value instanceof Uint8Array) return { $bytes: Buffer.from(value).toString("base64") };
      return value;
    }),
  );
}

function decodeEvent(raw: Buffer): ChatEvent {
  return JSON.parse(raw.toString("utf8"), (_key, value: unknown) => {
    if (typeof value === "object" && value !== null) {
      if ("$bigint" in value) return BigInt((value as { $bigint: string }).$bigint);
      if ("$bytes" in value)
        return new Uint8Array(Buffer.from((value as { $bytes: string }).$bytes, "base64"));
    }
    return value;
  }) as ChatEvent;
}

/**
 * Idempotency keys as the IETF draft and Stripe have them, scoped to the API
 * key: the first request claims the key (one INSERT decides among racing
 * duplicates), its outcome is stored, and later requests with the same key and
 * body replay it; an expired key (24 h) is claimed anew.
 */
export function createPgIdempotencyStore(db: Queryable): IdempotencyStore {
  return {
    async claim({ apiKeyId, key, fingerprint, now, expiresAt }): Promise<IdempotencyClaim> {
      const inserted = await db.query(
        `INSERT INTO idempotency_keys (api_key_id, key, fingerprint, state, created_at, expires_at)
         VALUES ($1, $2, $3, 'in_progress', $4, $5)
         ON CONFLICT (api_key_id, key) DO UPDATE
           SET fingerprint = EXCLUDED.fingerprint, state = 'in_progress', request_id = NULL,
               messages = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
           WHERE idempotency_keys.expires_at <= $4
         RETURNING key`,
        [apiKeyId, key, fingerprint, now, expiresAt],
      );
      if (inserted.rowCount === 1) return { state: "claimed" };
      const { rows } = await db.query<{
        fingerprint: string;
        state: string;
        messages: Buffer[] | null;
      }>(
        "SELECT fingerprint, state, messages FROM idempotency_keys WHERE api_key_id = $1 AND key = $2",
        [apiKeyId, key],
      );
      const row = rows[0];
      // Released between our INSERT and SELECT: the caller may simply retry.
      if (row === undefined) return { state: "in_progress" };
      if (row.fingerprint !== fingerprint) return { state: "mismatch" };
      if (row.state !== "completed" || row.messages === null) return { state: "in_progress" };
      return { state: "completed", events: row.messages.map(decodeEvent) };
    },
    async complete({ apiKeyId, key, requestId, events }) {
      await db.query(
        `UPDATE idempotency_keys SET state = 'completed', request_id = $3, messages = $4
         WHERE api_key_id = $1 AND key = $2`,
        [apiKeyId, key, requestId, events.map(encodeEvent)],
      );
    },
    async release({ apiKeyId, key }) {
      await db.query(
        "DELETE FROM idempotency_keys WHERE api_key_id = $1 AND key = $2 AND state = 'in_progress'",
        [apiKeyId, key],
      );
    },
  };
}
