import type pg from "pg";
import type { Hex } from "viem";
import type {
  InsertOutcome,
  PayerRevocationFilter,
  PermitAuthorization,
  PermitAuthorizationStore,
} from "../../domain/permit-authorization/index.js";
import {
  isAuthorizationPeriod,
  type AuthorizationPeriod,
} from "../../domain/permit-authorization/periods.js";
import { inTransaction } from "./ledger-tx.js";
import { API_KEY_PREFIX, hashApiKey, type Queryable } from "./api-keys.js";

interface Row {
  id: string;
  api_key_id: string;
  payer: string;
  permit_id: string;
  expires_at: string;
  issued_at: string;
  total_cap: string;
  per_request_cap: string;
  period: string;
  period_cap: string;
  warn_at: string;
  created_at: string;
  revoked_at: string | null;
  revoked_by: "key" | "payer" | null;
  /** Present where {@link useColumns} was selected. */
  credits_used?: string;
  credits_reserved?: string;
  last_used_at?: string | null;
  /** A periodic cap's ledger: its period's start and what it holds (null: no ledger yet). */
  period_start?: string | null;
  period_held?: string | null;
}

const columns =
  "id, api_key_id, payer, permit_id, expires_at, issued_at, total_cap, per_request_cap, " +
  "period, period_cap, warn_at, created_at, revoked_at, revoked_by";

/**
 * The use of the authorization `a` (issue 28, item 7), as the columns credits_used,
 * credits_reserved and last_used_at that {@link fromRow} maps: the one definition, for every
 * listing of authorizations. Every request records the authorization that admitted it
 * (inference_requests.authorization_id, migration 030). One with a total cap has its cap's
 * ledger (authorization_ledgers: what its closed requests were charged, what its open ones
 * hold), the figures its admissions are checked against; one without is summed from its
 * requests (their charges once closed, their maxima while open). The last use is its newest
 * request (the index on authorization_id, created_at). A periodic cap's ledger adds the start of
 * the period it last admitted a request in and what that period holds (used and reserved,
 * migration 039); whether that is still the current period is the reader's clock's to say
 * (`periodUse`, authorizations.ts).
 */
export function useColumns(a: string): string {
  const requests = `FROM inference_requests ir WHERE ir.authorization_id = ${a}.id`;
  const ledger = `FROM authorization_ledgers al WHERE al.authorization_id = ${a}.id`;
  return `COALESCE((SELECT al.used ${ledger}), (SELECT COALESCE(sum(ir.credits_charged), 0)
       ${requests} AND ir.status NOT IN ('pending', 'streaming')))::text AS credits_used,
     COALESCE((SELECT al.reserved ${ledger}), (SELECT COALESCE(sum(ir.maximum_credits), 0)
       ${requests} AND ir.status IN ('pending', 'streaming')))::text AS credits_reserved,
     (SELECT max(ir.created_at) ${requests})::text AS last_used_at,
     (SELECT al.period_start::text ${ledger} AND al.period_cap > 0) AS period_start,
     (SELECT (al.period_used + al.period_reserved)::text ${ledger} AND al.period_cap > 0)
       AS period_held`;
}

function fromRow(r: Row): PermitAuthorization {
  return {
    id: r.id,
    apiKeyId: r.api_key_id,
    payer: r.payer as Hex,
    permitId: r.permit_id as Hex,
    expiresAt: Number(r.expires_at),
    issuedAt: Number(r.issued_at),
    totalCap: BigInt(r.total_cap),
    perRequestCap: BigInt(r.per_request_cap),
    period: readPeriod(r.period),
    periodCap: BigInt(r.period_cap),
    warnAt: BigInt(r.warn_at),
    createdAt: Number(r.created_at),
    revokedAt: r.revoked_at === null ? null : Number(r.revoked_at),
    revokedBy: r.revoked_by,
    ...(r.credits_used === undefined
      ? {}
      : {
          use: {
            creditsUsed: BigInt(r.credits_used),
            creditsReserved: BigInt(r.credits_reserved ?? "0"),
            lastUsedAt:
              r.last_used_at === undefined || r.last_used_at === null
                ? null
                : Number(r.last_used_at),
            ...(r.period_start === undefined || r.period_start === null
              ? {}
              : {
                  period: {
                    start: Number(r.period_start),
                    held: BigInt(r.period_held ?? "0"),
                  },
                }),
          },
        }),
  };
}

/** A stored period (a CHECK keeps it one of these). */
function readPeriod(value: string): AuthorizationPeriod {
  if (!isAuthorizationPeriod(value)) throw new Error(`permit_authorizations.period ${value}`);
  return value;
}

/** The zero bytes32 as stored: "any permit". */
const anyPermitText = `0x${"00".repeat(32)}`;

/**
 * Whether a scope epoch row `s` of payer_scope_epochs (migration 033) covers the authorization
 * `a`: same payer, its key or any, its permit exactly or any, issued at or before the epoch.
 */
const scopeCovers = (s: string, a: string) =>
  `${s}.payer = ${a}.payer AND ${s}.epoch >= ${a}.issued_at
   AND (${s}.api_key_id = '' OR ${s}.api_key_id = ${a}.api_key_id)
   AND (${s}.permit_id = '${anyPermitText}' OR ${s}.permit_id = ${a}.permit_id)`;

/**
 * Stores an authorization with the nonce and signature that made it. `ON CONFLICT DO NOTHING`
 * on (payer, nonce) makes claiming the nonce and storing one step: of two submissions of one
 * signed payload, exactly one is stored.
 *
 * Nothing is stored when the payer's epoch (migration 028), or the epoch of a scope (a key, a
 * permit: migration 033) covering the authorization, is at or after `issuedAt`. In one
 * transaction: the payer's epoch row is made (epoch 0) when it has none and locked FOR SHARE;
 * then a later statement (a snapshot taken once the lock is held) reads the scopes' epochs and
 * inserts. Every payer revocation ({@link revokePayerAuthorizations}) locks that row FOR UPDATE
 * before it raises an epoch and marks the rows, so either it waits for this insert and then
 * marks it, or this insert waits for it and reads the raised epoch.
 */
export async function insertPermitAuthorization(
  pool: pg.Pool,
  a: PermitAuthorization,
  proof: { nonce: string; signature: Hex },
): Promise<InsertOutcome> {
  return inTransaction(pool, async (db) => {
    await db.query(
      `INSERT INTO payer_epochs (payer, epoch, updated_at) VALUES ($1, 0, 0)
       ON CONFLICT (payer) DO NOTHING`,
      [a.payer],
    );
    await db.query("SELECT 1 FROM payer_epochs WHERE payer = $1 FOR SHARE", [a.payer]);
    return insertUnlessRevoked(db, a, proof);
  });
}

async function insertUnlessRevoked(
  db: Queryable,
  a: PermitAuthorization,
  proof: { nonce: string; signature: Hex },
): Promise<InsertOutcome> {
  const { rows } = await db.query<{ epoch: string | null; inserted: boolean }>(
    `WITH e AS (
       SELECT max(epoch) AS epoch FROM (
         SELECT epoch FROM payer_epochs WHERE payer = $3
         UNION ALL
         SELECT s.epoch FROM payer_scope_epochs s
          WHERE s.payer = $3 AND (s.api_key_id = '' OR s.api_key_id = $2)
            AND (s.permit_id = '${anyPermitText}' OR s.permit_id = $4)
       ) epochs
     ), ins AS (
       INSERT INTO permit_authorizations
         (id, api_key_id, payer, permit_id, expires_at, nonce, signature, created_at,
          issued_at, total_cap, per_request_cap, period, period_cap, warn_at)
       SELECT $1, $2, $3, $4, $5::bigint, $6, $7, $8::bigint, $9::bigint, $10::numeric,
              $11::numeric, $12, $13::numeric, $14::numeric
       WHERE NOT EXISTS (SELECT 1 FROM e WHERE e.epoch >= $9::bigint)
       ON CONFLICT (payer, nonce) DO NOTHING
       RETURNING id
     )
     SELECT (SELECT epoch::text FROM e) AS epoch, EXISTS (SELECT 1 FROM ins) AS inserted`,
    [
      a.id,
      a.apiKeyId,
      a.payer,
      a.permitId,
      a.expiresAt,
      proof.nonce,
      proof.signature,
      a.createdAt,
      a.issuedAt,
      a.totalCap.toString(),
      a.perRequestCap.toString(),
      a.period,
      a.periodCap.toString(),
      a.warnAt.toString(),
    ],
  );
  const row = rows[0]!;
  if (row.inserted) return "inserted";
  return row.epoch !== null && Number(row.epoch) >= a.issuedAt ? "revoked" : "nonce_used";
}

export async function getPermitAuthorization(
  db: Queryable,
  id: string,
): Promise<PermitAuthorization | undefined> {
  const { rows } = await db.query<Row>(
    `SELECT ${columns}, ${useColumns("a")} FROM permit_authorizations a WHERE id = $1`,
    [id],
  );
  return rows[0] === undefined ? undefined : fromRow(rows[0]);
}

/**
 * Every authorization the key holds, revoked and expired ones included, newest first, with its
 * use.
 */
export async function listPermitAuthorizations(
  db: Queryable,
  apiKeyId: string,
): Promise<PermitAuthorization[]> {
  const { rows } = await db.query<Row>(
    `SELECT ${columns}, ${useColumns("a")} FROM permit_authorizations a WHERE api_key_id = $1
     ORDER BY seq DESC`,
    [apiKeyId],
  );
  return rows.map(fromRow);
}

/**
 * Revokes it at `now` unless it already is (the first revocation's time and author stay), and
 * answers it as it then is; undefined when there is none (held by `apiKeyId`, when given).
 */
export async function revokePermitAuthorization(
  db: Queryable,
  args: { id: string; apiKeyId?: string; now: number; by: "key" | "payer" },
): Promise<PermitAuthorization | undefined> {
  const { rows } = await db.query<Row>(
    `WITH target AS (
       SELECT id FROM permit_authorizations
       WHERE id = $1 AND ($2::text IS NULL OR api_key_id = $2)
     ), revoked AS (
       UPDATE permit_authorizations a SET revoked_at = $3, revoked_by = $4
       FROM target WHERE a.id = target.id AND a.revoked_at IS NULL
       RETURNING a.id
     )
     SELECT ${columns.replace(/(\w+)/g, "a.$1")}, ${useColumns("a")}, r.id IS NOT NULL AS changed
     FROM permit_authorizations a JOIN target t ON t.id = a.id LEFT JOIN revoked r ON r.id = a.id`,
    [args.id, args.apiKeyId ?? null, args.now, args.by],
  );
  const row = rows[0] as (Row & { changed: boolean }) | undefined;
  if (row === undefined) return undefined;
  // The SELECT sees the snapshot from before the UPDATE of the same statement.
  return row.changed ? { ...fromRow(row), revokedAt: args.now, revokedBy: args.by } : fromRow(row);
}

/**
 * Every authorization of the payer (every key's), newest first: at most `limit`, those made
 * before `startingAfter` (an authorization id of the payer; one of another payer's: none).
 */
export async function listPayerAuthorizations(
  db: Queryable,
  payer: Hex,
  page: { limit: number; startingAfter?: string },
): Promise<PermitAuthorization[]> {
  const { rows } =
    page.startingAfter === undefined
      ? await db.query<Row>(
          `SELECT ${columns} FROM permit_authorizations WHERE payer = $1
           ORDER BY seq DESC LIMIT $2`,
          [payer, page.limit],
        )
      : await db.query<Row>(
          `SELECT ${columns} FROM permit_authorizations
           WHERE payer = $1
             AND seq < (SELECT seq FROM permit_authorizations WHERE id = $3 AND payer = $1)
           ORDER BY seq DESC LIMIT $2`,
          [payer, page.limit, page.startingAfter],
        );
  return rows.map(fromRow);
}

/**
 * A payer's revocation without the key: marks revoked (by the payer, at `now`) every
 * authorization of the payer issued at or before `before`, of one key and of one permit when
 * named, not revoked yet, and answers them newest first. First, in the same transaction, the
 * epoch of its scope is raised to `before` (never lowered): the payer's (revoke all), else the
 * scope's (migration 033) after locking the payer's row. The row lock orders it with every
 * insert of the payer's ({@link insertPermitAuthorization}), and the marking runs in a later
 * statement, so it sees every insert that read the old epoch; what is submitted later is refused.
 */
export async function revokePayerAuthorizations(
  pool: pg.Pool,
  filter: PayerRevocationFilter,
): Promise<{ revoked: PermitAuthorization[]; epoch: number | null; revokedBefore: number }> {
  const apiKeyId = filter.apiKeyId ?? "";
  const permitId = filter.permitId ?? anyPermitText;
  const signedBefore = filter.signedBefore ?? filter.before;
  return inTransaction(pool, async (client) => {
    // The payer's row first: every insert and revocation of the payer is ordered by it.
    await client.query(
      `INSERT INTO payer_epochs (payer, epoch, updated_at) VALUES ($1, 0, 0)
       ON CONFLICT (payer) DO NOTHING`,
      [filter.payer],
    );
    await client.query("SELECT 1 FROM payer_epochs WHERE payer = $1 FOR UPDATE", [filter.payer]);
    // A replayed signature (same scope, same signed `before`) applies up to what it applied to
    // the first time, not to the gateway's clock now. Rows too old to be replayed are dropped.
    await client.query("DELETE FROM payer_revocations WHERE payer = $1 AND signed_before < $2", [
      filter.payer,
      filter.replayableAfter ?? 0,
    ]);
    const { rows: applied } = await client.query<{ revoked_before: string }>(
      `WITH ins AS (
         INSERT INTO payer_revocations (payer, api_key_id, permit_id, signed_before, revoked_before)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (payer, api_key_id, permit_id, signed_before) DO NOTHING
         RETURNING revoked_before
       )
       SELECT revoked_before::text FROM ins
       UNION ALL
       SELECT revoked_before::text FROM payer_revocations
        WHERE payer = $1 AND api_key_id = $2 AND permit_id = $3 AND signed_before = $4`,
      [filter.payer, apiKeyId, permitId, signedBefore, filter.before],
    );
    const before = Number(applied[0]?.revoked_before ?? filter.before);
    let epoch: number | null = null;
    if (apiKeyId === "" && permitId === anyPermitText) {
      const { rows } = await client.query<{ epoch: string }>(
        `UPDATE payer_epochs
            SET epoch = GREATEST(epoch, $2),
                updated_at = CASE WHEN epoch < $2 THEN $3 ELSE updated_at END
          WHERE payer = $1 RETURNING epoch::text`,
        [filter.payer, before, filter.now],
      );
      epoch = Number(rows[0]!.epoch);
    } else {
      await client.query(
        `INSERT INTO payer_scope_epochs (payer, api_key_id, permit_id, epoch, updated_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (payer, api_key_id, permit_id) DO UPDATE
           SET epoch = GREATEST(payer_scope_epochs.epoch, EXCLUDED.epoch),
               updated_at = CASE WHEN payer_scope_epochs.epoch < EXCLUDED.epoch
                                 THEN EXCLUDED.updated_at ELSE payer_scope_epochs.updated_at END`,
        [filter.payer, apiKeyId, permitId, before, filter.now],
      );
    }
    // A later statement: it sees every insert that read the epochs before they were raised.
    const { rows } = await client.query<Row & { seq: string }>(
      `UPDATE permit_authorizations SET revoked_at = $3, revoked_by = 'payer'
       WHERE payer = $1 AND revoked_at IS NULL AND issued_at <= $2
         AND ($4::text IS NULL OR api_key_id = $4)
         AND ($5::text IS NULL OR permit_id = $5)
       RETURNING ${columns}, seq`,
      [filter.payer, before, filter.now, filter.apiKeyId ?? null, filter.permitId ?? null],
    );
    const revoked = rows.sort((x, y) => Number(BigInt(y.seq) - BigInt(x.seq))).map(fromRow);
    return { revoked, epoch, revokedBefore: before };
  });
}

export function createPgPermitAuthorizationStore(pool: pg.Pool): PermitAuthorizationStore {
  return {
    insert: (a, proof) => insertPermitAuthorization(pool, a, proof),
    get: (id) => getPermitAuthorization(pool, id),
    listByKey: (apiKeyId) => listPermitAuthorizations(pool, apiKeyId),
    revoke: (args) => revokePermitAuthorization(pool, args),
    listByPayer: (payer, page) => listPayerAuthorizations(pool, payer, page),
    revokeByPayer: (filter) => revokePayerAuthorizations(pool, filter),
  };
}

/**
 * The active API key matching `key` (null when it is unknown or revoked) with its
 * authorizations that are still live at `now` (not revoked, not expired, issued after their
 * payer's epoch: migration 028), in one round trip. The lookup is by hash, so
 * response timing reveals nothing useful about the stored keys: an attacker cannot steer the
 * hash of a guess towards a stored one, which is what a constant-time compare would guard.
 * It is the lookup every authenticated request makes (cached for API_KEY_CACHE_MS), so a
 * chat's spending check needs no query of its own.
 */
export async function findApiKeyWithAuthorizations(
  db: Queryable,
  key: string,
  now: number,
): Promise<{ id: string; authorizations: PermitAuthorization[] } | null> {
  if (!key.startsWith(API_KEY_PREFIX)) return null;
  const { rows } = await db.query<{ id: string; authorizations: Row[] | null }>(
    `SELECT k.id,
       (SELECT json_agg(json_build_object(
                 'id', a.id, 'api_key_id', a.api_key_id, 'payer', a.payer,
                 'permit_id', a.permit_id, 'expires_at', a.expires_at::text,
                 'issued_at', a.issued_at::text, 'total_cap', a.total_cap::text,
                 'per_request_cap', a.per_request_cap::text, 'period', a.period,
                 'period_cap', a.period_cap::text, 'warn_at', a.warn_at::text,
                 'created_at', a.created_at::text, 'revoked_at', NULL, 'revoked_by', NULL))
          FROM permit_authorizations a
         WHERE a.api_key_id = k.id AND a.revoked_at IS NULL AND a.expires_at > $2
           AND NOT EXISTS (SELECT 1 FROM payer_epochs e
                           WHERE e.payer = a.payer AND e.epoch >= a.issued_at)
           AND NOT EXISTS (SELECT 1 FROM payer_scope_epochs s
                           WHERE ${scopeCovers("s", "a")})) AS authorizations
     FROM api_keys k WHERE k.key_hash = $1 AND k.revoked_at IS NULL`,
    [hashApiKey(key), now],
  );
  const row = rows[0];
  if (row === undefined) return null;
  return { id: row.id, authorizations: (row.authorizations ?? []).map(fromRow) };
}

/** This database's gateway deployment id (migration 027), the same for every process on it. */
export async function deploymentId(db: Queryable): Promise<string> {
  const { rows } = await db.query<{ id: string }>("SELECT id FROM gateway_deployment");
  const row = rows[0];
  if (row === undefined) throw new Error("gateway_deployment has no row (migration 027)");
  return row.id;
}
