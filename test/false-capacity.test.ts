import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import {
  createLedgerBatcher,
  type LedgerBatcher,
  type ReserveInput,
} from "../src/adapters/pg/ledger/index.js";
import { describeIfPostgres, useTestDatabase } from "./helpers/db.js";
import { completion, hex32, reservation } from "./helpers/ledger.js";

/**
 * A plain VACUUM (no ANALYZE) of a small ledger must not make the gateway refuse requests
 * `offer_at_capacity` later (bench, 32 connections, one offer of max_concurrency 2048: 26-42%
 * answered 429 until VACUUM ANALYZE).
 *
 * The mechanism, reproduced here on the real functions: the ledger functions are PL/pgSQL, so
 * every connection caches their statements' plans, and after five executions keeps a generic
 * plan until something invalidates it. Until a table has been vacuumed the planner assumes at
 * least 10 pages for it; a VACUUM while the tables are (nearly) empty records 0 or 1 page, so
 * the plans made next are sequential scans, also for `WHERE id = $1` on inference_requests.
 * Nothing replans them as the tables grow (an INSERT invalidates nothing, and with autovacuum
 * off there is no autoanalyze), so every close scans the whole request history, several times
 * per item of a close batch. Closes fall behind the reservations (which only insert), queue up,
 * and past the statement timeout or the queue's wait bound sit in the outbox: their offer
 * slots stay taken, in_flight reaches max_concurrency with every request answered, and
 * reservations are refused. ANALYZE invalidates the plans and it recovers. Here the slow
 * closes fail on the statement timeout. (Even without the VACUUM, gw_close_batch's
 * `id = ANY (open_ids)` lookups are planned as sequential scans while the table is small and
 * stay so: two passes over the history per batch, which `historyScans` catches too.)
 *
 * PostgreSQL only: it needs the server's VACUUM, plan cache, statistics and statement timeout.
 */
describeIfPostgres("offer capacity after a plain VACUUM of a small ledger", () => {
  const maxConcurrency = 64; // one full close batch (MAX_LEDGER_BATCH)
  const history = 300_000; // closed requests a sustained run leaves behind
  const statementMs = 1_000;
  const offerId = hex32();
  const permitId = hex32();
  const test = useTestDatabase();
  /** One connection, as one of the gateway's: the plan cache is per connection. */
  let pool: pg.Pool;
  let ledger: LedgerBatcher;

  const request = (): ReserveInput =>
    reservation({ offerId, permitId, deposit: 10n ** 30n, maxConcurrency });

  /** `n` requests admitted together (one gw_reserve, then a gw_batch_reserve), then closed. */
  async function serve(n: number) {
    const inputs = Array.from({ length: n }, request);
    const reserved = await Promise.all(inputs.map((r) => ledger.reserve(r)));
    const closes = await Promise.allSettled(
      inputs.map((r) => ledger.finalize(completion(r.requestId, 10n))),
    );
    return { reserved, closes };
  }

  async function inFlight(): Promise<number> {
    const { rows } = await test.db.pool.query<{ in_flight: number }>(
      "SELECT in_flight FROM offer_loads WHERE offer_id = $1",
      [offerId.toLowerCase()],
    );
    return rows[0]?.in_flight ?? 0;
  }

  /** Rows read by sequential scans of inference_requests so far (the ledger's connection flushed). */
  async function seqTuplesRead(): Promise<number> {
    // PostgreSQL 15+: the ledger connection's pending counters are flushed before it idles.
    await pool.query("SELECT pg_stat_force_next_flush()").catch(() => undefined);
    const { rows } = await test.db.pool.query<{ n: string }>(
      `SELECT COALESCE(seq_tup_read, 0) AS n FROM pg_stat_user_tables
       WHERE relname = 'inference_requests'`,
    );
    return Number(rows[0]?.n ?? 0);
  }

  beforeAll(async () => {
    // The measured server runs with autovacuum off; an autoanalyze would replan (and hide it).
    for (const table of ["inference_requests", "quotes", "offer_loads", "permit_ledgers"]) {
      await test.db.pool.query(`ALTER TABLE ${table} SET (autovacuum_enabled = false)`);
    }
    // The trigger: a plain VACUUM while the ledger is still small.
    await test.db.pool.query("VACUUM");
    pool = new pg.Pool({
      connectionString: test.url!,
      max: 1,
      statement_timeout: statementMs,
      query_timeout: 30_000,
    });
    ledger = createLedgerBatcher(pool);
    // The first requests after the VACUUM: each function's statements run often enough for
    // the connection to keep a generic plan.
    for (let i = 0; i < 8; i++) {
      const { reserved, closes } = await serve(4);
      expect(reserved).toEqual(Array.from({ length: 4 }, () => ({ ok: true })));
      expect(closes.every((c) => c.status === "fulfilled")).toBe(true);
    }
    // What a sustained run leaves behind: many closed requests (INSERT changes no plan).
    await test.db.pool.query(
      `INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
         permit_id, quote_id, stream, status, input_tokens, output_tokens, maximum_credits,
         credits_charged, billing, usage_source, tariff_version, created_at, completed_at,
         settlement_status)
       SELECT 'hist_' || g, 'key_a', 'instance_live', 'org/model', $1, $1, $2, 'qt_hist_' || g,
         false, 'completed', 100, 150, 1000, 10, 'billed', 'provider', 1, 1700000000,
         1700000005, 'none'
       FROM generate_series(1, $3::int) g`,
      [offerId.toLowerCase(), permitId.toLowerCase(), history],
    );
  }, 120_000);

  afterAll(async () => {
    await pool?.end();
  });

  it("closes keep up, so a finished request never holds its offer slot", async () => {
    const before = await seqTuplesRead();
    // A full load of the offer: every request admitted, answered and closed.
    const { reserved, closes } = await serve(maxConcurrency);
    expect(reserved.every((r) => r.ok)).toBe(true);
    const failed = closes.flatMap((c) =>
      c.status === "rejected" ? [(c.reason as Error).message] : [],
    );
    const scanned = (await seqTuplesRead()) - before;
    // Nothing is in flight any more: the offer admits a full load again.
    const again = await Promise.all(
      Array.from({ length: maxConcurrency }, () => ledger.reserve(request())),
    );
    expect(
      {
        refused: again.filter((r) => !r.ok).map((r) => (r.ok ? "ok" : r.reason))[0],
        refusedCount: again.filter((r) => !r.ok).length,
        inFlight: await inFlight(),
        failedCloses: failed.length,
        firstCloseError: failed[0],
        /** Full passes over the request history made by those closes. */
        historyScans: Math.round(scanned / history),
      },
      "after a plain VACUUM of the small ledger, closes scan the whole request history " +
        "(cached sequential-scan plans), time out and keep their offer slots",
    ).toEqual({
      refused: undefined,
      refusedCount: 0,
      inFlight: maxConcurrency,
      failedCloses: 0,
      firstCloseError: undefined,
      historyScans: 0,
    });
  });

  it("every ledger function plans its statements per call", async () => {
    // A CREATE OR REPLACE after migration 011 drops the setting; such a migration repeats it.
    const { rows } = await test.db.pool.query<{ fn: string }>(
      `SELECT p.oid::regprocedure::text AS fn
       FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
       WHERE p.pronamespace = current_schema()::regnamespace
         AND l.lanname = 'plpgsql' AND p.proname LIKE 'gw\\_%'
         AND NOT ('plan_cache_mode=force_custom_plan' = ANY (COALESCE(p.proconfig, '{}')))
       ORDER BY 1`,
    );
    expect(rows.map((r) => r.fn)).toEqual([]);
  });
});
