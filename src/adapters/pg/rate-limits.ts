/**
 * The fleet's per-API-key limits in PostgreSQL (migration 020, functions/rate-limits.sql): the
 * store behind `createFleetRateLimiter` (src/domain/rate-limit.ts). One function call per lease, never
 * one per request.
 */
import type pg from "pg";
import type { RateLimitStore } from "../../domain/rate-limit.js";

export function createPgRateLimitStore(pool: pg.Pool, instanceId: string): RateLimitStore {
  return {
    async leaseTokens(key, want, giveBack, rps, burst) {
      const { rows } = await pool.query<{ granted: number; tokens_left: number }>(
        "SELECT granted, tokens_left FROM gw_rate_lease($1, $2, $3, $4, $5)",
        [key, want, giveBack, rps, burst],
      );
      const row = rows[0];
      if (row === undefined) throw new Error("gw_rate_lease returned no row");
      return { granted: row.granted, tokensLeft: row.tokens_left };
    },
    async setStreams(key, slots, max, ttlSeconds) {
      const { rows } = await pool.query<{ held: number }>(
        "SELECT gw_rate_streams($1, $2, $3, $4, $5) AS held",
        [key, instanceId, slots, max, ttlSeconds],
      );
      const row = rows[0];
      if (row === undefined) throw new Error("gw_rate_streams returned no row");
      return row.held;
    },
  };
}
