/**
 * A payer's soft threshold (issue 38, migration 041), read on the ledger a capped authorization
 * keeps (authorization_ledgers): the use just after an admission, and whether that admission is
 * the one that crossed the threshold in its period.
 */
import type { AuthorizationThresholds } from "../../domain/chat/ports.js";
import type { Queryable } from "./registrations.js";

/**
 * The use the threshold is measured on, as the ledger row `l` holds it: the current period's
 * (charged and held) with a periodic cap, else the total's; and the period it is in (its start,
 * 0 for the total).
 */
const used = `CASE WHEN l.period_cap > 0 THEN l.period_used + l.period_reserved
  ELSE l.used + l.reserved END`;
const start = "CASE WHEN l.period_cap > 0 THEN l.period_start ELSE 0 END";

/**
 * One statement, run after the request's admission committed: the row's use, and a conditional
 * UPDATE that marks the period crossed (`warned_start`) only where the use is at or over
 * `warnAt` and the period is not marked yet. Two admissions crossing together in two processes
 * meet on the row's lock; the second re-reads the row (READ COMMITTED), finds it marked and
 * updates nothing: exactly one request per period is the crossing. A request below the
 * threshold writes nothing.
 */
export function createAuthorizationThresholds(db: Queryable): AuthorizationThresholds {
  return {
    async measure(authorizationId, warnAt) {
      const { rows } = await db.query<{ used: string; crossed: boolean }>(
        `WITH crossed AS (
           UPDATE authorization_ledgers l SET warned_start = ${start}
           WHERE l.authorization_id = $1 AND ${used} >= $2::numeric
             AND l.warned_start IS DISTINCT FROM ${start}
           RETURNING (${used})::text AS used)
         SELECT COALESCE((SELECT used FROM crossed), (${used})::text) AS used,
                EXISTS (SELECT 1 FROM crossed) AS crossed
         FROM authorization_ledgers l WHERE l.authorization_id = $1`,
        [authorizationId, warnAt.toString()],
      );
      const row = rows[0];
      return row === undefined ? undefined : { used: BigInt(row.used), crossed: row.crossed };
    },
  };
}
