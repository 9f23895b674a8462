import { describe, expect, it } from "vitest";
import { testDatabaseUrl, useTestDatabase } from "../../../test/helpers/db.js";
import { hex32, NOW, reservation } from "../../../test/helpers/ledger.js";
import * as ledger from "./ledger/index.js";
import { listChargedRequests } from "./requests.js";

/**
 * Issue 35: a leased request's close is a HOT update of its record (migration 031), so it
 * writes no index entry of inference_requests. Two things keep it so: no index of the table
 * names a column the close changes, and the page of the open record has room for the closed
 * version (fillfactor).
 */
describe("the close is a HOT update (migration 031)", () => {
  const test = useTestDatabase();

  /**
   * The columns a leased close writes with a new value (gw_close_leased_batch). settlement_status
   * is not among them: a charged close keeps the default 'unsettled' (a close that charges
   * nothing sets 'none' and is not HOT: a failure, rare).
   */
  const CLOSE_WRITES = [
    "status",
    "offer_id",
    "maximum_credits",
    "tariff_version",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "reasoning_tokens",
    "claimed_input_tokens",
    "claimed_output_tokens",
    "claimed_cached_input_tokens",
    "claimed_reasoning_tokens",
    "counted_input_tokens",
    "counted_output_tokens",
    "counted_cached_input_tokens",
    "counted_reasoning_tokens",
    "credits_charged",
    "billing",
    "usage_source",
    "error",
    "completed_at",
  ];

  it("no index of inference_requests names a column the close writes", async () => {
    const { rows } = await test.db.pool.query<{ name: string; def: string }>(
      `SELECT c.relname AS name, pg_get_indexdef(i.indexrelid) AS def
       FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
       WHERE i.indrelid = 'inference_requests'::regclass ORDER BY 1`,
    );
    expect(rows.length).toBeGreaterThan(0);
    for (const { name, def } of rows) {
      // The definition after the table's name: its columns, expressions and WHERE clause.
      const body = def.slice(def.indexOf("USING"));
      const named = CLOSE_WRITES.filter((c) => new RegExp(`\\b${c}\\b`).test(body));
      expect({ name, named }).toEqual({ name, named: [] });
    }
  });

  /** Inserts `n` open leased records as the lease store writes them (leases.ts), in batches. */
  async function openRecords(n: number) {
    const holder = `gw_hot/${hex32().slice(2, 10)}`;
    const permitId = hex32();
    const offerId = hex32();
    const pool = test.db.pool;
    await pool.query("INSERT INTO permit_ledgers (permit_id, reserved) VALUES ($1, 1000000)", [
      permitId,
    ]);
    await pool.query("INSERT INTO permit_leases VALUES ($1, $2, 1000000)", [holder, permitId]);
    const records = Array.from({ length: n }, (_, i) => ({
      id: hex32(),
      api_key_id: "key_a",
      holder,
      model: "org/model",
      model_id: hex32(),
      offer_id: offerId,
      permit_id: permitId,
      quote_id: hex32(),
      stream: i % 2 === 0,
      maximum: "1000",
      tariff_version: "1",
      authorization_id: i % 3 === 0 ? null : "pa_hot",
    }));
    for (let i = 0; i < records.length; i += 20) {
      await pool.query(
        `INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
           permit_id, quote_id, stream, status, input_tokens, maximum_credits, tariff_version,
           created_at, leased, authorization_id)
         SELECT x.id, x.api_key_id, x.holder, x.model, x.model_id, x.offer_id, x.permit_id,
           x.quote_id, x.stream, 'pending', 12, x.maximum, x.tariff_version,
           extract(epoch from clock_timestamp())::bigint, true, x.authorization_id
         FROM jsonb_to_recordset($1::jsonb) AS x(id text, api_key_id text, holder text,
           model text, model_id text, offer_id text, permit_id text, quote_id text,
           stream boolean, maximum numeric, tariff_version numeric, authorization_id text)`,
        [JSON.stringify(records.slice(i, i + 20))],
      );
    }
    return { permitId, records };
  }

  /**
   * Closes the records in one batch and returns this backend's update and HOT update counts
   * for it (not yet flushed to the statistics: read before and after in one transaction).
   */
  async function closeBatch(records: Awaited<ReturnType<typeof openRecords>>["records"]) {
    const figures = {
      input_tokens: "12",
      output_tokens: "345",
      cached_input_tokens: "0",
      reasoning_tokens: "0",
    };
    const items = records.map((r) => ({
      ...r,
      status: "completed",
      input_tokens: "12",
      output_tokens: "345",
      credits_charged: "400",
      billing: "billed",
      usage_source: "provider",
      error: null,
      now: 1_700_000_100,
      cached_input_tokens: "0",
      reasoning_tokens: "0",
      claimed: figures,
      counted: figures,
    }));
    const client = await test.db.pool.connect();
    const counts = async () => {
      const { rows } = await client.query<{ upd: number; hot: number }>(
        `SELECT n_tup_upd::int AS upd, n_tup_hot_upd::int AS hot FROM pg_stat_xact_user_tables
         WHERE relname = 'inference_requests'`,
      );
      return rows[0] ?? { upd: 0, hot: 0 };
    };
    try {
      await client.query("BEGIN");
      const before = await counts();
      const closed = await client.query<{ finalized: boolean; credits_charged: string }>(
        "SELECT finalized, credits_charged::text FROM gw_close_leased_batch($1::jsonb)",
        [JSON.stringify(items)],
      );
      expect(closed.rows).toEqual(items.map(() => ({ finalized: true, credits_charged: "400" })));
      const after = await counts();
      await client.query("COMMIT");
      return { upd: after.upd - before.upd, hot: after.hot - before.hot };
    } finally {
      client.release();
    }
  }

  /**
   * Holds back page pruning while `body` runs: an open transaction with an xid, older than
   * everything `body` writes, keeps every dead version in the cluster (another database's
   * transaction does the same: found on CI, where other test files' transactions run). The
   * tests below hold it themselves, so what they assert does not depend on what else runs.
   */
  async function withPruningHeldBack<T>(body: () => Promise<T>): Promise<T> {
    const holder = await test.db.pool.connect();
    try {
      await holder.query("BEGIN");
      await holder.query("SELECT txid_current()");
      return await body();
    } finally {
      await holder.query("ROLLBACK");
      holder.release();
    }
  }

  // Holding pruning back takes a second connection: PostgreSQL only (one connection on PGlite).
  const itTwoConnections = it.skipIf(testDatabaseUrl() === undefined);

  itTwoConnections(
    "closes a batch of leased records with HOT updates only, with no page pruning to lean on",
    async () => {
      // The room for the closed versions is the fillfactor's alone: no dead version is
      // reclaimed while the batch runs.
      const { permitId, records } = await openRecords(40);
      const counted = await withPruningHeldBack(() => closeBatch(records));
      expect(counted).toEqual({ upd: records.length, hot: records.length });
      // The charges are listed from inference_charges, in the order they closed.
      const charges = await test.db.pool.query<{ n: string }>(
        "SELECT count(*)::text AS n FROM inference_charges WHERE permit_id = $1",
        [permitId],
      );
      expect(charges.rows).toEqual([{ n: String(records.length) }]);
    },
  );

  itTwoConnections(
    "closes streamed records whose mark is not yet pruned: some not HOT, every one charged once",
    async () => {
      // The known limit (docs/decisions/settlement.md): a streamed record's mark ('streaming') is
      // a version of its own; while a transaction anywhere in the cluster holds pruning back, the
      // mark's old version stays on the page and the close may not fit beside it. Correctness
      // does not depend on it: every record closes and is charged once.
      const { permitId, records } = await openRecords(40);
      const counted = await withPruningHeldBack(async () => {
        await test.db.pool.query(
          "UPDATE inference_requests SET status = 'streaming' WHERE id = ANY ($1::text[])",
          [records.filter((r) => r.stream).map((r) => r.id)],
        );
        return closeBatch(records);
      });
      expect(counted.upd).toBe(records.length);
      expect(counted.hot).toBeLessThan(records.length);
      const charges = await test.db.pool.query<{ n: string; total: string }>(
        `SELECT count(*)::text AS n, sum(r.credits_charged)::text AS total
       FROM inference_charges c JOIN inference_requests r ON r.id = c.request_id
       WHERE c.permit_id = $1`,
        [permitId],
      );
      expect(charges.rows).toEqual([{ n: "40", total: "16000" }]);
    },
  );

  it("a per-request reservation is held in its own index until its close, whose charge is listed", async () => {
    const pool = test.db.pool;
    const permitId = hex32();
    const [a, b] = [reservation({ permitId }), reservation({ permitId })];
    for (const r of [a, b]) await ledger.reserve(pool, r);
    const held = async () =>
      (
        await pool.query<{ id: string }>(
          "SELECT id FROM inference_requests WHERE holds_reservation AND permit_id = $1 ORDER BY id",
          [permitId],
        )
      ).rows.map((r) => r.id);
    expect(await held()).toEqual([a.requestId, b.requestId].sort());
    const closing = {
      status: "completed" as const,
      inputTokens: 100n,
      outputTokens: 50n,
      billing: "billed" as const,
      usageSource: "provider" as const,
    };
    await ledger.finalize(pool, {
      ...closing,
      requestId: b.requestId,
      creditsCharged: 300n,
      now: NOW + 5,
    });
    await ledger.finalize(pool, {
      ...closing,
      requestId: a.requestId,
      creditsCharged: 200n,
      now: NOW + 9,
    });
    expect(await held()).toEqual([]);
    // Receipts come from inference_charges, in the order the requests closed.
    const listed = await listChargedRequests(pool, permitId, 10, undefined);
    expect(listed.map((r) => [r.id, r.creditsCharged])).toEqual([
      [b.requestId, 300n],
      [a.requestId, 200n],
    ]);
    expect(await listChargedRequests(pool, permitId, 10, b.requestId)).toMatchObject([
      { id: a.requestId },
    ]);
  });
});
