import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { privateKeyToAccount } from "viem/accounts";
import { chainClients } from "../src/adapters/chain/clients.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { startGateway } from "../src/app.js";
import { authorizeApiKey } from "../src/clients/permit.js";
import { parseConfig } from "../src/config.js";
import { demoAccounts, id32, seedDemoMarket } from "../src/dev/demo-market.js";
import { createLogger } from "../src/runtime/logger.js";
import { seedRequests, type SeedSpec } from "../test/helpers/activity-seed.js";
import { percentiles } from "./lib/measure.js";
import { intSetting, readCommonSettings } from "./lib/settings.js";
import { createBenchDatabase, startAnvil } from "./lib/setup.js";

/**
 * `npm run bench:activity` (issue 38, item 1): the latency of the activity routes
 * (GET /v1/requests, GET /v1/usage, GET /v1/permits) over HTTP on the gateway started here, in
 * this process, on a fresh PostgreSQL database (`BENCH_DATABASE_URL`) and anvil with the demo
 * market. One key holds BENCH_ACTIVITY_RECORDS (10,000) request records across three models and
 * two permits over about ten days (inserted in bulk as the gateway writes them,
 * test/helpers/activity-seed.ts); another key holds three times as many on the same permits.
 * Each route is called BENCH_ACTIVITY_CALLS (50) times one after another, after 5 unmeasured
 * calls; p50 and p90 per route. See bench/README.md, "Activity routes".
 */

function log(message: string): void {
  process.stderr.write(`[bench:activity] ${message}\n`);
}

async function main(): Promise<void> {
  const records = intSetting("BENCH_ACTIVITY_RECORDS", 10_000, 100, 1_000_000);
  const calls = intSetting("BENCH_ACTIVITY_CALLS", 50, 5, 10_000);
  const { serverUrl } = readCommonSettings();
  const bench = await createBenchDatabase(serverUrl);
  const anvil = await startAnvil();
  const dir = await mkdtemp(join(tmpdir(), "gw-bench-activity-"));
  try {
    const clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
    const roles = demoAccounts(anvil.accounts);
    const demo = await seedDemoMarket(clients, roles);
    const catalogFile = join(dir, "catalog.json");
    await writeFile(catalogFile, JSON.stringify({ models: demo.catalog }));
    const config = parseConfig({
      RPC_URL: anvil.rpcUrl,
      CHAIN_ID: String(anvil.chainId),
      MARKET_ADDRESS: demo.market,
      START_BLOCK: demo.deployBlock.toString(),
      CONFIRMATIONS: "0",
      CATALOG_FILE: catalogFile,
      SETTLEMENT_OPERATOR_TOKEN: `op_${"0".repeat(32)}`,
      DATABASE_URL: bench.url,
      ENDPOINT_ENCRYPTION_KEY: randomBytes(32).toString("hex"),
      HOST: "127.0.0.1",
      PORT: "0",
      GATEWAY_STATE_DIR: dir,
      LOG_LEVEL: "error",
    });
    const gateway = await startGateway(config, { logger: createLogger("error") });
    const pool = new pg.Pool({ connectionString: bench.url, max: 2 });
    try {
      const key = await createApiKey(pool, "bench");
      const other = await createApiKey(pool, "other");
      await authorizeApiKey(
        { baseUrl: gateway.url, apiKey: key.key },
        {
          signer: privateKeyToAccount(roles.payer.privateKey),
          chain: { chainId: anvil.chainId, market: demo.market },
        },
      );
      const permits: [string, string] = [demo.permitId, id32("bench:activity:second")];
      const offer = (n: number) => `0x${n.toString(16).padStart(64, "0")}`;
      const spec: SeedSpec = {
        apiKeyId: key.id,
        count: records,
        start: 1_704_862_800,
        // About ten days, whatever the count (a pair of records per step).
        step: Math.max(1, Math.floor((2 * 864_000) / records)),
        models: ["demo-chat", "model-b", "model-c"],
        offers: [
          [offer(1), offer(2)],
          [offer(3), offer(4)],
          [offer(5), offer(6)],
        ],
        permits,
        tag: "bench",
      };
      const seeded = Date.now();
      await seedRequests(pool, spec);
      await seedRequests(pool, { ...spec, apiKeyId: other.id, count: records * 3, tag: "other" });
      log(`seeded ${records} + ${records * 3} records in ${Date.now() - seeded} ms`);
      const end = spec.start + Math.floor(records / 2) * spec.step;
      const middle = await fetchJson(gateway.url, key.key, `/v1/requests?limit=100`);
      const cursor = (middle.data as { id: string }[]).at(-1)!.id;
      const routes: [string, string][] = [
        ["requests, first page (50)", "/v1/requests"],
        ["requests, page after a cursor (100)", `/v1/requests?limit=100&starting_after=${cursor}`],
        ["requests, model + status=failed", "/v1/requests?model=model-b&status=failed"],
        [
          "requests, permit + time window",
          `/v1/requests?permit=${permits[1]}&created_after=${spec.start + 86_400}&created_before=${spec.start + 2 * 86_400}`,
        ],
        [`usage by day, all ${records} records`, `/v1/usage?from=${spec.start}&to=${end}`],
        [
          "usage by hour, 2 days",
          `/v1/usage?bucket=hour&from=${spec.start}&to=${spec.start + 2 * 86_400}`,
        ],
        [
          "usage of a permit by day (both keys)",
          `/v1/usage?permit=${permits[0]}&from=${spec.start}&to=${end}`,
        ],
        ["permits", "/v1/permits"],
      ];
      console.log(
        `activity routes over HTTP, ${records} records of the key (+${records * 3} of another), ` +
          `${calls} calls each (${new URL(serverUrl).host}):`,
      );
      for (const [name, path] of routes) {
        for (let i = 0; i < 5; i++) await fetchJson(gateway.url, key.key, path);
        const ms: number[] = [];
        for (let i = 0; i < calls; i++) {
          const t = process.hrtime.bigint();
          await fetchJson(gateway.url, key.key, path);
          ms.push(Number(process.hrtime.bigint() - t) / 1e6);
        }
        const p = percentiles(ms)!;
        console.log(`  ${name.padEnd(40)} p50 ${p.p50.toFixed(2)} ms, p90 ${p.p90.toFixed(2)} ms`);
      }
    } finally {
      await pool.end();
      await gateway.close();
    }
  } finally {
    await anvil.stop();
    await bench.drop();
    await rm(dir, { recursive: true, force: true });
  }
}

async function fetchJson(
  base: string,
  apiKey: string,
  path: string,
): Promise<Record<string, unknown>> {
  const res = await fetch(`${base}${path}`, { headers: { authorization: `Bearer ${apiKey}` } });
  const body = (await res.json()) as Record<string, unknown>;
  if (res.status !== 200) throw new Error(`${path}: ${res.status} ${JSON.stringify(body)}`);
  return body;
}

await main();
