import { openDatabase } from "../src/adapters/pg/database.js";
import { migrate } from "../src/adapters/pg/migrate.js";
import { intSetting, readCommonSettings } from "./lib/settings.js";
import { createBenchDatabase } from "./lib/setup.js";

/**
 * `npm run bench:rate-lease`: the server time of one fleet rate-limit lease call
 * (`gw_rate_lease`, functions/rate-limits.sql) on PostgreSQL, as `EXPLAIN (ANALYZE, TIMING OFF)`
 * reports it, over BENCH_RATE_LEASE_CALLS calls on a fresh database. One call per chunk leased
 * (at least one token), so at most this per admitted request. See bench/README.md.
 */
async function main(): Promise<void> {
  const calls = intSetting("BENCH_RATE_LEASE_CALLS", 1000, 20, 100_000);
  const { serverUrl } = readCommonSettings();
  const bench = await createBenchDatabase(serverUrl);
  try {
    const db = await openDatabase({ url: bench.url });
    try {
      await migrate(db.pool);
      const micros: number[] = [];
      for (let i = 0; i < calls; i++) {
        const { rows } = await db.pool.query<{ "QUERY PLAN": string }>(
          "EXPLAIN (ANALYZE, TIMING OFF) SELECT * FROM gw_rate_lease('bench', 5, 0, 100000, 100000)",
        );
        const line = rows.map((r) => r["QUERY PLAN"]).find((l) => l.startsWith("Execution Time"));
        const ms = line === undefined ? undefined : /([\d.]+) ms/.exec(line)?.[1];
        if (ms === undefined)
          throw new Error(`no execution time in the plan: ${JSON.stringify(rows)}`);
        micros.push(Number(ms) * 1000);
      }
      micros.sort((x, y) => x - y);
      const at = (q: number) => micros[Math.min(micros.length - 1, Math.floor(q * micros.length))]!;
      console.log(
        `gw_rate_lease server time per call over ${calls} calls (${new URL(serverUrl).host}): ` +
          `p25 ${at(0.25).toFixed(1)} us, median ${at(0.5).toFixed(1)} us, p90 ${at(0.9).toFixed(1)} us`,
      );
    } finally {
      await db.close();
    }
  } finally {
    await bench.drop();
  }
}

await main();
