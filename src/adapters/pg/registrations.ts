import type pg from "pg";
import type { Hex } from "viem";
import type {
  EndpointRegistration,
  NonceUse,
  RegistrationOutcome,
} from "../../domain/registration/index.js";

/** Anything that can run a query: the pool, or a client inside a transaction. */
export type Queryable = Pick<pg.Pool, "query">;

export interface ProviderEndpointRow {
  readonly offerId: Hex;
  readonly operator: Hex;
  readonly endpointSealed: Buffer;
  readonly registeredAt: number;
  readonly verifiedAt: number | null;
  readonly verificationExpiresAt: number | null;
  readonly verificationError: string | null;
  readonly running: boolean | null;
  readonly checkedAt: number | null;
}

/**
 * Marks `nonce` as used. Returns false when it already was. `ON CONFLICT DO NOTHING` makes the
 * check and the claim one step: a concurrent transaction holding the same nonce makes this
 * wait for its outcome (then false if it committed, true if it rolled back).
 */
export async function consumeNonce(db: Queryable, use: NonceUse): Promise<boolean> {
  const { rowCount } = await db.query(
    `INSERT INTO registration_nonces (nonce, offer_id, operator, expires_at)
     VALUES ($1, $2, $3, $4)
     ON CONFLICT (nonce) DO NOTHING`,
    [use.nonce, use.offerId, use.operator, use.expiresAt],
  );
  return rowCount === 1;
}

/**
 * Stores the offer's endpoint. A new endpoint has not been verified or probed yet, so the
 * verification and liveness columns of a previous registration are cleared.
 */
export async function upsertProviderEndpoint(
  db: Queryable,
  reg: EndpointRegistration,
): Promise<void> {
  await db.query(
    `INSERT INTO provider_endpoints (offer_id, operator, endpoint_sealed, registered_at)
     VALUES ($1, $2, $3, $4)
     ON CONFLICT (offer_id) DO UPDATE SET
       operator = EXCLUDED.operator,
       endpoint_sealed = EXCLUDED.endpoint_sealed,
       registered_at = EXCLUDED.registered_at,
       verified_at = NULL,
       verification_expires_at = NULL,
       verification_error = NULL,
       running = NULL,
       checked_at = NULL,
       verify_claimed_at = NULL,
       last_verification_at = NULL,
       last_verification_outcome = NULL,
       last_verification_check = NULL,
       last_verification_message = NULL,
       verified_features = '{}'`,
    [reg.offerId, reg.operator, reg.endpointSealed, reg.registeredAt],
  );
}

/**
 * Consumes the nonce and stores the endpoint in one transaction, so a registration either
 * happens with its nonce spent or not at all: two registrations racing on one nonce end with
 * exactly one `registered`. `offer_not_indexed`: the offer exists on chain but not yet in the
 * `offers` table (the indexer lags by its confirmation depth); nothing was written.
 */
export async function recordRegistration(
  pool: pg.Pool,
  nonce: NonceUse,
  reg: EndpointRegistration,
): Promise<RegistrationOutcome> {
  const client = await pool.connect();
  // Set when the connection's transaction state is unknown: such a client must not go back
  // to the pool, where the next user would find itself inside our transaction.
  let discard: Error | boolean = false;
  try {
    await client.query("BEGIN");
    if (!(await consumeNonce(client, nonce))) {
      await client.query("ROLLBACK");
      return "nonce_used";
    }
    await upsertProviderEndpoint(client, reg);
    await client.query("COMMIT");
    return "registered";
  } catch (err) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      discard = rollbackError instanceof Error ? rollbackError : true;
    }
    if (isForeignKeyViolation(err)) return "offer_not_indexed";
    throw err;
  } finally {
    client.release(discard);
  }
}

/**
 * Deletes nonces whose challenges expired before `before` (Unix seconds) and returns how many.
 * Safe at any time: registration refuses an expired challenge before it looks at its nonce, so
 * a forgotten nonce can never be replayed.
 */
export async function pruneExpiredNonces(db: Queryable, before: number): Promise<number> {
  const { rowCount } = await db.query("DELETE FROM registration_nonces WHERE expires_at < $1", [
    before,
  ]);
  return rowCount ?? 0;
}

/** The offer's registered endpoint row, or undefined. */
export async function getProviderEndpoint(
  db: Queryable,
  offerId: Hex,
): Promise<ProviderEndpointRow | undefined> {
  const { rows } = await db.query<{
    offer_id: string;
    operator: string;
    endpoint_sealed: Buffer;
    registered_at: string;
    verified_at: string | null;
    verification_expires_at: string | null;
    verification_error: string | null;
    running: boolean | null;
    checked_at: string | null;
  }>(
    `SELECT offer_id, operator, endpoint_sealed, registered_at, verified_at,
            verification_expires_at, verification_error, running, checked_at
     FROM provider_endpoints WHERE offer_id = $1`,
    [offerId.toLowerCase()],
  );
  const row = rows[0];
  if (!row) return undefined;
  return {
    offerId: row.offer_id as Hex,
    operator: row.operator as Hex,
    endpointSealed: row.endpoint_sealed,
    registeredAt: Number(row.registered_at),
    verifiedAt: nullableNumber(row.verified_at),
    verificationExpiresAt: nullableNumber(row.verification_expires_at),
    verificationError: row.verification_error,
    running: row.running,
    checkedAt: nullableNumber(row.checked_at),
  };
}

function nullableNumber(value: string | null): number | null {
  return value === null ? null : Number(value);
}

function isForeignKeyViolation(err: unknown): boolean {
  return typeof err === "object" && err !== null && (err as { code?: unknown }).code === "23503";
}
