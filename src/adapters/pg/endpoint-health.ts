import type { Hex } from "viem";
import {
  verificationChecks,
  type EndpointHealth,
  type EndpointHealthStore,
  type RegisteredEndpoint,
  type VerificationCheck,
  type VerificationRecord,
} from "../../domain/health.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

// Liveness and verification columns of `provider_endpoints` (migration 003). The sealed
// endpoint is read here only to hand it to whoever holds the key; it is never opened here.

interface RegisteredRow {
  offer_id: string;
  endpoint_sealed: Buffer;
  checked_at: string | null;
}

interface HealthRow {
  offer_id: string;
  registered_at: string;
  running: boolean | null;
  checked_at: string | null;
  verified_at: string | null;
  verification_expires_at: string | null;
  verification_error: string | null;
}

const optionalNumber = (value: string | null): number | undefined =>
  value === null ? undefined : Number(value);

function toRegistered(row: RegisteredRow): RegisteredEndpoint {
  return {
    offerId: row.offer_id as Hex,
    sealed: row.endpoint_sealed,
    checkedAt: optionalNumber(row.checked_at),
  };
}

/** Every registered endpoint, sealed, with when it was last probed. */
export async function listRegisteredEndpoints(db: Queryable): Promise<RegisteredEndpoint[]> {
  const { rows } = await db.query<RegisteredRow>(
    "SELECT offer_id, endpoint_sealed, checked_at FROM provider_endpoints ORDER BY offer_id",
  );
  return rows.map(toRegistered);
}

export async function getRegisteredEndpoint(
  db: Queryable,
  offerId: Hex,
): Promise<RegisteredEndpoint | undefined> {
  const { rows } = await db.query<RegisteredRow>(
    "SELECT offer_id, endpoint_sealed, checked_at FROM provider_endpoints WHERE offer_id = $1",
    [normalizeHex(offerId)],
  );
  return rows[0] === undefined ? undefined : toRegistered(rows[0]);
}

/**
 * Records a probe verdict taken at `at` (Unix seconds). A verdict older than the one stored
 * is dropped, so a slow probe, or a slower gateway process, never overwrites a newer one.
 */
export async function recordProbe(
  db: Queryable,
  offerId: Hex,
  running: boolean,
  at: number,
): Promise<void> {
  await db.query(
    `UPDATE provider_endpoints SET running = $2, checked_at = $3
     WHERE offer_id = $1 AND (checked_at IS NULL OR checked_at <= $3)`,
    [normalizeHex(offerId), running, at],
  );
}

/**
 * Records a verification outcome. Success sets `verified_at` and `verification_expires_at`
 * and clears `verification_error`; failure clears both times (the offer becomes ineligible,
 * also when it was verified before) and keeps the failed check.
 *
 * With `sealed`, the row is updated only while it still holds that sealed endpoint: a
 * verification that raced a re-registration must not vouch for the new endpoint. Returns
 * whether a row was updated.
 */
export async function recordVerification(
  db: Queryable,
  offerId: Hex,
  result: VerificationRecord,
  opts: { sealed?: Buffer } = {},
): Promise<boolean> {
  const params = result.ok
    ? [result.verifiedAt, result.expiresAt, null]
    : [null, null, result.check];
  const { rowCount } = await db.query(
    `UPDATE provider_endpoints
     SET verified_at = $2, verification_expires_at = $3, verification_error = $4
     WHERE offer_id = $1 AND ($5::bytea IS NULL OR endpoint_sealed = $5::bytea)`,
    [normalizeHex(offerId), ...params, opts.sealed ?? null],
  );
  return (rowCount ?? 0) > 0;
}

/** The health columns of one registered endpoint; undefined when none is registered. */
export async function getEndpointHealth(
  db: Queryable,
  offerId: Hex,
): Promise<EndpointHealth | undefined> {
  const { rows } = await db.query<HealthRow>(
    `SELECT offer_id, registered_at, running, checked_at, verified_at, verification_expires_at,
       verification_error
     FROM provider_endpoints WHERE offer_id = $1`,
    [normalizeHex(offerId)],
  );
  const row = rows[0];
  if (row === undefined) return undefined;
  return {
    offerId: row.offer_id as Hex,
    registeredAt: Number(row.registered_at),
    running: row.running ?? undefined,
    checkedAt: optionalNumber(row.checked_at),
    verifiedAt: optionalNumber(row.verified_at),
    verificationExpiresAt: optionalNumber(row.verification_expires_at),
    verificationError: asCheck(row.verification_error),
  };
}

function asCheck(value: string | null): VerificationCheck | undefined {
  return (verificationChecks as readonly string[]).includes(value ?? "")
    ? (value as VerificationCheck)
    : undefined;
}

/** The functions above bound to one database, as the health monitor's store. */
export function createPgEndpointHealthStore(db: Queryable): EndpointHealthStore {
  return {
    listRegisteredEndpoints: () => listRegisteredEndpoints(db),
    getRegisteredEndpoint: (offerId) => getRegisteredEndpoint(db, offerId),
    getEndpointHealth: (offerId) => getEndpointHealth(db, offerId),
    recordProbe: (offerId, running, at) => recordProbe(db, offerId, running, at),
    recordVerification: (offerId, result, sealed) =>
      recordVerification(db, offerId, result, { sealed }),
  };
}
