import type { Hex } from "viem";
import {
  verificationChecks,
  type EndpointHealth,
  type EndpointHealthStore,
  type LastVerificationRun,
  type RegisteredEndpoint,
  type VerificationCheck,
  type VerificationClaim,
  type VerificationRecord,
  type VerificationRunOutcome,
} from "../../domain/health-types.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

// Liveness, verification and wake fee columns of `provider_endpoints` (migrations 003, 013, 019
// and 025). The sealed endpoint is read here only to hand it to whoever holds the key; it is
// never opened here.

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
 * Records a verification run's outcome as the endpoint's last run (`last_verification_*`).
 * Success also sets `verified_at` and `verification_expires_at`, and `verified_features` to
 * the features it proved plus those of the standing list whose check got no answer (migration
 * 019); a wrong answer clears all three
 * (the offer becomes ineligible, also when it was verified before); a transport failure leaves
 * both as they are (DESIGN.md section 8: a verification that stands is not knocked out by a
 * timeout, a refused connection, a 429 or a 5xx). Either failure keeps the failed check in
 * `verification_error`. Success clears the offer's standing usage exclusion, if any (migration
 * 024, docs/decisions/metering-and-tokens.md "Usage divergence"), and its audit exclusion with
 * its evidence (migration 042, docs/decisions/audits.md): only a verification that passed brings
 * it back.
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
  const outcome: VerificationRunOutcome = result.ok
    ? "verified"
    : result.transport
      ? "unreachable"
      : "rejected";
  // $2/$3: the verification's new times; kept as they are when `unreachable`.
  const params = result.ok
    ? [result.verifiedAt, result.expiresAt, null, result.verifiedAt, null]
    : [null, null, result.check, result.ranAt, result.message];
  // The run is also kept in `offer_verification_runs` (the catalog's pass rate), in the same
  // statement and only when the endpoint row was updated: a run that raced a re-registration
  // is no run of the new endpoint. A run that passed clears a standing usage exclusion
  // (migration 024) and an audit exclusion (migration 042: its evidence too, and no sample
  // before the end of the run's second counts again): the operator verified again. Only an
  // exclusion is cleared: a verification is the operator's to ask for, so it must not wash
  // a flag (or a passing offer's evidence) away.
  const { rowCount } = await db.query(
    `WITH updated AS (UPDATE provider_endpoints
     SET verified_at = CASE WHEN $6 = 'unreachable' THEN verified_at ELSE $2::bigint END,
       verification_expires_at =
         CASE WHEN $6 = 'unreachable' THEN verification_expires_at ELSE $3::bigint END,
       verification_error = $4,
       last_verification_at = $5,
       last_verification_outcome = $6,
       last_verification_check = $4,
       last_verification_message = $7,
       verified_features = CASE $6
         WHEN 'unreachable' THEN verified_features
         WHEN 'rejected' THEN '{}'::text[]
         ELSE ARRAY(SELECT DISTINCT f FROM (
             SELECT unnest($9::text[]) AS f
             UNION SELECT f FROM unnest(verified_features) AS f WHERE f = ANY($10::text[])) AS u
           ORDER BY f) END
     WHERE offer_id = $1 AND ($8::bytea IS NULL OR endpoint_sealed = $8::bytea)
     RETURNING offer_id),
     cleared AS (UPDATE offer_usage_exclusions SET cleared_at = $5
       WHERE $6 = 'verified' AND cleared_at IS NULL
         AND offer_id IN (SELECT offer_id FROM updated)),
     audit_cleared AS (UPDATE offer_audit_standings
       SET state = 'unaudited', e_value = 1, tests = '[]'::jsonb,
         cleared_at_ms = ($5::bigint + 1) * 1000, updated_at_ms = ($5::bigint + 1) * 1000
       WHERE $6 = 'verified' AND state = 'excluded'
         AND offer_id IN (SELECT offer_id FROM updated))
     INSERT INTO offer_verification_runs (offer_id, ran_at, outcome)
     SELECT offer_id, $5, $6 FROM updated`,
    [
      normalizeHex(offerId),
      params[0],
      params[1],
      params[2],
      params[3],
      outcome,
      params[4],
      opts.sealed ?? null,
      result.ok ? [...(result.features ?? [])] : [],
      result.ok ? [...(result.unanswered ?? [])] : [],
    ],
  );
  return (rowCount ?? 0) > 0;
}

interface ClaimRow {
  claimed: boolean;
  claimed_at: string | null;
  verified_at: string | null;
  verification_expires_at: string | null;
  last_verification_at: string | null;
  last_verification_outcome: string | null;
  last_verification_check: string | null;
  last_verification_message: string | null;
}

const runOutcomes: readonly string[] = ["verified", "rejected", "unreachable"];

/**
 * Claims a verification run of the endpoint sealed as `sealed` at `now` (Unix seconds) unless
 * one was claimed less than `minIntervalSeconds` ago: one conditional UPDATE of the endpoint's
 * row, so of every gateway sharing the database exactly one claims a run per interval (a racing
 * UPDATE waits for the other's row lock and then sees its claim). Answers, either way, the
 * verification that stands and the last run's outcome as they were before this statement.
 * Undefined when the offer has no endpoint or another one than `sealed`.
 */
export async function claimVerification(
  db: Queryable,
  offerId: Hex,
  sealed: Buffer,
  now: number,
  minIntervalSeconds: number,
): Promise<VerificationClaim | undefined> {
  const { rows } = await db.query<ClaimRow>(
    `WITH claim AS (
       UPDATE provider_endpoints SET verify_claimed_at = $3
       WHERE offer_id = $1 AND endpoint_sealed = $2::bytea
         AND (verify_claimed_at IS NULL OR verify_claimed_at <= $3::bigint - $4::bigint)
       RETURNING offer_id)
     SELECT EXISTS (SELECT 1 FROM claim) AS claimed, e.verify_claimed_at AS claimed_at,
       e.verified_at, e.verification_expires_at, e.last_verification_at,
       e.last_verification_outcome, e.last_verification_check, e.last_verification_message
     FROM provider_endpoints e WHERE e.offer_id = $1 AND e.endpoint_sealed = $2::bytea`,
    [normalizeHex(offerId), sealed, now, minIntervalSeconds],
  );
  const row = rows[0];
  if (row === undefined) return undefined;
  const outcome = row.last_verification_outcome;
  const last: LastVerificationRun | undefined =
    row.last_verification_at === null || outcome === null || !runOutcomes.includes(outcome)
      ? undefined
      : {
          ranAt: Number(row.last_verification_at),
          outcome: outcome as VerificationRunOutcome,
          check: asCheck(row.last_verification_check),
          message: row.last_verification_message ?? undefined,
        };
  return {
    claimed: row.claimed,
    // The statement's snapshot predates its own UPDATE: a fresh claim is `now`.
    claimedAt: row.claimed ? now : Number(row.claimed_at ?? now),
    last,
    verifiedAt: optionalNumber(row.verified_at),
    verificationExpiresAt: optionalNumber(row.verification_expires_at),
  };
}

/** What a wake fee claim found (Unix seconds). */
export interface WakeFeeClaim {
  /** This request is charged the wake fee. */
  readonly claimed: boolean;
  /** When the fee was last charged: now when claimed, else the earlier claim (none: never). */
  readonly chargedAt: number | undefined;
}

/**
 * Claims the wake fee of an offer's endpoint for one request at `now` (Unix seconds): one
 * conditional UPDATE of the endpoint's row (migration 025), which holds only when the gateway's
 * last probe saw the endpoint down (`running` false) and either no fee was ever charged, or the
 * last one is at least `windowSeconds` old and a probe after it saw the endpoint down again. Of
 * every gateway sharing the database, one request per window claims it: a racing UPDATE waits
 * for the other's row lock and then sees its claim. Answers, either way, when the fee was last
 * charged (the statement's snapshot predates its own UPDATE).
 */
export async function claimWakeFee(
  db: Queryable,
  offerId: Hex,
  now: number,
  windowSeconds: number,
): Promise<WakeFeeClaim> {
  const { rows } = await db.query<{ claimed: boolean; charged_at: string | null }>(
    `WITH claim AS (
       UPDATE provider_endpoints SET wake_charged_at = $2
       WHERE offer_id = $1 AND running = false
         AND (wake_charged_at IS NULL
           OR (wake_charged_at <= $2::bigint - $3::bigint AND checked_at > wake_charged_at))
       RETURNING offer_id)
     SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
       (SELECT wake_charged_at FROM provider_endpoints WHERE offer_id = $1) AS charged_at`,
    [normalizeHex(offerId), now, windowSeconds],
  );
  const row = rows[0];
  if (row?.claimed === true) return { claimed: true, chargedAt: now };
  return { claimed: false, chargedAt: optionalNumber(row?.charged_at ?? null) };
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
    claimVerification: (offerId, sealed, now, minIntervalSeconds) =>
      claimVerification(db, offerId, sealed, now, minIntervalSeconds),
  };
}
