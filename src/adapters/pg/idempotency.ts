import type pg from "pg";
import type { ChatEvent, IdempotencyClaim, IdempotencyStore } from "../../domain/chat/index.js";
import { databaseNow } from "./ledger/index.js";

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
 *
 * A claim is a lease of the process `instanceId` (its `gateway_instances` heartbeat): when the
 * process dies, {@link releaseOrphanedClaims} frees the key. Only the holder completes or
 * releases its claim, and only while it is `in_progress`, so a process that comes back after
 * its claim was released and taken by a retry changes nothing, and a stored result is final.
 */
export function createPgIdempotencyStore(
  db: Queryable,
  options: { readonly instanceId: string },
): IdempotencyStore {
  const { instanceId } = options;
  return {
    async claim({ apiKeyId, key, fingerprint, now, expiresAt }): Promise<IdempotencyClaim> {
      // `created_at` is the database's clock, as heartbeats are: the orphan rule compares the
      // two (releaseOrphanedClaims). Expiry stays the gateway's clock, `now` against `expiresAt`.
      const inserted = await db.query(
        `INSERT INTO idempotency_keys
           (api_key_id, key, fingerprint, state, created_at, expires_at, instance_id)
         VALUES ($1, $2, $3, 'in_progress', extract(epoch from clock_timestamp())::bigint, $5, $6)
         ON CONFLICT (api_key_id, key) DO UPDATE
           SET fingerprint = EXCLUDED.fingerprint, state = 'in_progress', request_id = NULL,
               messages = NULL, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
               instance_id = EXCLUDED.instance_id
           WHERE idempotency_keys.expires_at <= $4
         RETURNING key`,
        [apiKeyId, key, fingerprint, now, expiresAt, instanceId],
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
    async begin({ apiKeyId, key, requestId }) {
      await db.query(
        `UPDATE idempotency_keys SET request_id = $3
         WHERE api_key_id = $1 AND key = $2 AND state = 'in_progress' AND instance_id = $4`,
        [apiKeyId, key, requestId, instanceId],
      );
    },
    async complete({ apiKeyId, key, requestId, events }) {
      // Never over a stored result, nor over another process's claim (ours was released).
      await db.query(
        `UPDATE idempotency_keys SET state = 'completed', request_id = $3, messages = $4
         WHERE api_key_id = $1 AND key = $2 AND state = 'in_progress' AND instance_id = $5`,
        [apiKeyId, key, requestId, events.map(encodeEvent), instanceId],
      );
    },
    async release({ apiKeyId, key }) {
      await db.query(
        `DELETE FROM idempotency_keys
         WHERE api_key_id = $1 AND key = $2 AND state = 'in_progress' AND instance_id = $3`,
        [apiKeyId, key, instanceId],
      );
    },
  };
}

export interface ReleaseOrphanedClaimsInput {
  /** Unix seconds; absent (as in production): the database's clock, the one heartbeats use. */
  readonly now?: number;
  readonly staleAfterSeconds: number;
  /** At most this many claims per call (default 1000); call again for more. */
  readonly limit?: number;
}

/**
 * The orphan rule for idempotency claims (docs/decisions/chat-quotes-and-money.md, "Orphans"): an `in_progress` claim
 * whose holder's last sign of life, the later of its heartbeat (none if its `gateway_instances`
 * row is missing) and the claim's own creation (both on the database's clock), is more than
 * `staleAfterSeconds` old is deleted, so the client's retry claims the key anew instead of
 * getting 409 `idempotency_in_progress` until the key expires. The dead process's request, if it made one, is closed `failed`,
 * `void`, `orphaned` by `reconcileOrphans` (ledger.ts) in the same round: its client never got a
 * complete answer and was not charged, so there is nothing to replay. Stored results
 * (`completed`) are never touched, nor claims from before migration 009 (no holder).
 *
 * Idempotent and safe to run from every process at once: a released claim is gone, and a
 * claim taken anew meanwhile survives.
 *
 * @returns how many claims this call released.
 */
export async function releaseOrphanedClaims(
  db: Queryable,
  input: ReleaseOrphanedClaimsInput,
): Promise<number> {
  const now = input.now ?? (await databaseNow(db));
  const cutoff = now - input.staleAfterSeconds;
  // The claim is matched on its holder and creation as well: one taken anew meanwhile is
  // another claim (the DELETE re-checks the row it waited for against them) and survives.
  // A claim whose request was closed with a charge (its result could not be stored, then its
  // holder died) is kept until it expires: a retry is refused 409 idempotency_in_progress,
  // never served and charged again. One whose request never began, or was voided (the orphan
  // rule voids the open requests of dead processes), is released: the client may retry.
  const released = await db.query(
    `DELETE FROM idempotency_keys k
     WHERE k.state = 'in_progress' AND (k.api_key_id, k.key, k.instance_id, k.created_at) IN (
       SELECT o.api_key_id, o.key, o.instance_id, o.created_at FROM idempotency_keys o
       LEFT JOIN gateway_instances g ON g.instance_id = o.instance_id
       WHERE o.state = 'in_progress' AND o.instance_id IS NOT NULL
         AND GREATEST(g.heartbeat_at, o.created_at) < $1
         AND NOT EXISTS (
           SELECT 1 FROM inference_requests r
           WHERE r.id = o.request_id AND r.status IN ('completed', 'failed', 'cancelled')
             AND r.billing IS DISTINCT FROM 'void')
       ORDER BY o.created_at
       LIMIT $2)`,
    [cutoff, input.limit ?? 1000],
  );
  return released.rowCount ?? 0;
}
