import { describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { exposureSql } from "./x402.js";

/**
 * The x402 exposure sum (issue 37) is taken at every paid admission: its cost must be the open
 * payments', never the request table's. With sequential scans priced out, the plan finds each
 * payment's request through the partial index of unsettled requests by permit; a predicate no
 * index matches (as `settlement_status IN ('unsettled', 'settling')` was) still reads every row
 * of inference_requests, which this catches.
 */
describe("x402 exposure: answered by index", () => {
  const test = useTestDatabase();

  it("reads inference_requests only through inference_requests_unsettled_permit", async () => {
    const sql = exposureSql
      .replace("$1", "'0xtoken'")
      .replace("$2", "'0xpayer'")
      .replace("$3", "1700000000");
    const client = await test.db.pool.connect();
    let plan: string;
    try {
      await client.query("BEGIN");
      await client.query("SET LOCAL enable_seqscan = off");
      const { rows } = await client.query<{ "QUERY PLAN": string }>(`EXPLAIN (COSTS OFF) ${sql}`);
      plan = rows.map((r) => r["QUERY PLAN"]).join("\n");
      await client.query("ROLLBACK");
    } finally {
      client.release();
    }
    expect(plan).not.toMatch(/Seq Scan on inference_requests/);
    expect(plan).toMatch(/inference_requests_unsettled_permit on inference_requests/);
  });
});
