import { setTimeout as sleep } from "node:timers/promises";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway } from "../src/app.js";
import { publicStateMaxAgeMs } from "../src/runtime/metrics.js";
import { startRpcProxy, type RpcProxy } from "./helpers/rpc-proxy.js";
import { eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";

/**
 * Counts every statement sent to the database through `pool`: each client's `query`, which
 * `pool.query` and checked-out clients (transactions) both go through.
 */
function countQueries(pool: pg.Pool): { readonly count: number; readonly texts: string[] } {
  const counted = new WeakSet<pg.PoolClient>();
  const texts: string[] = [];
  const wrap = (client: pg.PoolClient) => {
    if (counted.has(client)) return;
    counted.add(client);
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    client.query = ((...args: unknown[]) => {
      const first = args[0];
      const text =
        typeof first === "string"
          ? first
          : typeof (first as { text?: unknown } | null)?.text === "string"
            ? (first as { text: string }).text
            : "";
      texts.push(text.replace(/\s+/g, " ").trim());
      return query(...args);
    }) as typeof client.query;
  };
  pool.on("connect", wrap);
  pool.on("acquire", wrap);
  return {
    get count() {
      return texts.length;
    },
    texts,
  };
}

/**
 * The statements of the offers' measurement sync (src/domain/reputation/measurement-sync.ts):
 * every 5 s whatever else happens, so a run slowed by a loaded machine meets one; not a route's.
 */
function isMeasurementSync(text: string): boolean {
  // The other shared reads on the same 5 s round: cooldowns, and the audits' standings.
  return /\boffer_(measurements|usage_exclusions|verification_runs|cooldowns|audit_standings)\b/.test(
    text,
  );
}

/** The statements the public routes' shared reads make: readiness's and the metrics gauges'. */
function isPublicRead(text: string): boolean {
  return text === "SELECT 1" || text.startsWith("SELECT (SELECT count(*) FROM inference_requests");
}

// DESIGN.md section 8, "Unauthenticated routes cost nothing": /health, /ready and /metrics answer
// from state at most a second old; no request to them reaches the database or the chain;
// /v1/gateway answers from memory alone.
describe("unauthenticated routes", () => {
  let stack: TestStack;
  let proxy: RpcProxy;
  let queries: { readonly count: number; readonly texts: string[] };

  beforeAll(async () => {
    // Background work that reads the database or the chain (indexer polls, housekeeping,
    // liveness probes, leases) is moved out of the way, so what is counted is the routes'.
    stack = await startTestStack({
      POLL_INTERVAL_MS: "3600000",
      HOUSEKEEPING_INTERVAL_MS: "600000",
      PROBE_INTERVAL_MS: "86400000",
      SETTLEMENT_CLOSE_CHECK_MS: "3600000",
      RESERVATION_LEASES: "false",
    });
    proxy = await startRpcProxy(stack.anvil.rpcUrl);
    await stack.gateway.close();
    queries = countQueries(stack.database.db.pool);
    stack.gateway = await startGateway(
      { ...stack.config, rpcUrl: proxy.url },
      { logger: stack.logger, database: stack.database.db },
    );
  });
  afterAll(async () => {
    proxy?.pass();
    await stack?.close();
    await proxy?.close();
  });

  /** Waits until the startup's own reads (the indexer's first passes) are over. */
  async function quiet(): Promise<void> {
    for (;;) {
      const before = [queries.count, proxy.calls()];
      await sleep(300);
      if (queries.count === before[0] && proxy.calls() === before[1]) return;
    }
  }

  it("500 requests to /v1/gateway (no key) reach neither the database nor the chain", async () => {
    const { rows } = await stack.database.db.pool.query<{ id: string }>(
      "SELECT id FROM gateway_deployment",
    );
    await quiet();
    const routeQueries = (): string[] => queries.texts.filter((t) => !isMeasurementSync(t));
    const before = { queries: routeQueries(), rpc: proxy.calls() };
    const answers = await Promise.all(
      Array.from({ length: 500 }, async () => {
        const res = await fetch(`${stack.gateway.url}/v1/gateway`);
        return `${res.status} ${await res.text()}`;
      }),
    );
    expect(new Set(answers)).toEqual(
      new Set([
        `200 ${JSON.stringify({
          object: "gateway",
          chain_id: stack.anvil.chainId,
          market: stack.demo.market,
          settlement_account: null,
          receipt_signer: null,
          deployment: rows[0]!.id,
          audit_corpus: null,
        })}`,
      ]),
    );
    expect({ queries: routeQueries(), rpc: proxy.calls() }).toEqual(before);
  });

  it("1,000 requests to /health, /ready and /metrics read each source at most once a second", async () => {
    await quiet();
    const before = {
      queries: queries.count,
      rpc: proxy.calls(),
      blockNumber: proxy.calls("eth_blockNumber"),
    };
    const paths = ["/health", "/ready", "/metrics"];
    const statuses = new Map<string, number>();
    const began = performance.now();
    for (let batch = 0; batch < 10; batch++) {
      await Promise.all(
        Array.from({ length: 100 }, async (_, i) => {
          const path = paths[(batch * 100 + i) % paths.length]!;
          const res = await fetch(`${stack.gateway.url}${path}`);
          await res.arrayBuffer();
          const key = `${path} ${res.status}`;
          statuses.set(key, (statuses.get(key) ?? 0) + 1);
        }),
      );
    }
    const elapsedMs = performance.now() - began;
    // The routes' reads only: what else this process sent meanwhile (a loaded machine stretches
    // the burst over background work) is not theirs, and is listed should the bound fail.
    const during = queries.texts.slice(before.queries);
    const dbQueries = during.filter(isPublicRead).length;
    const rpcCalls = proxy.calls() - before.rpc;

    expect(Object.fromEntries(statuses)).toEqual({
      "/health 200": 334,
      "/ready 200": 333,
      "/metrics 200": 333,
    });
    // Two shared reads (readiness: SELECT 1 and the head; metrics: the gauge query and the
    // head), each started at most once per publicStateMaxAgeMs: within the burst, at most
    // floor(elapsed / 1 s) + 1 starts each. One statement and one RPC call per read.
    const readsEach = Math.floor(elapsedMs / publicStateMaxAgeMs) + 1;
    console.log(
      `public-route burst: 1000 requests in ${Math.round(elapsedMs)} ms, ${dbQueries} database queries, ${rpcCalls} RPC calls (bound ${2 * readsEach} each)`,
    );
    expect(dbQueries).toBeGreaterThanOrEqual(2);
    expect(dbQueries, during.join("\n")).toBeLessThanOrEqual(2 * readsEach);
    // At least one head read went out (the counter works); readiness and the metrics may share
    // one, as viem joins a block-number read to one already in flight.
    expect(rpcCalls).toBeGreaterThanOrEqual(1);
    expect(rpcCalls).toBeLessThanOrEqual(2 * readsEach);
    // The only chain read is the head.
    expect(proxy.calls("eth_blockNumber") - before.blockNumber).toBe(rpcCalls);
    // A handful, whatever the machine: the burst takes a few seconds at most.
    expect(elapsedMs).toBeLessThan(10_000);
  });

  it("/ready says the chain is down within about a second, and back up as soon", async () => {
    await sleep(publicStateMaxAgeMs);
    proxy.down();
    const down = performance.now();
    let body: { status?: string; checks?: Record<string, { ok: boolean }> } = {};
    await eventually(
      async () => {
        const res = await fetch(`${stack.gateway.url}/ready`);
        body = await json(res);
        return res.status === 503;
      },
      5_000,
      50,
    );
    expect(body).toMatchObject({
      status: "unavailable",
      checks: { database: { ok: true }, chain: { ok: false } },
    });
    expect(performance.now() - down).toBeLessThan(publicStateMaxAgeMs + 2_000);

    proxy.pass();
    const up = performance.now();
    await eventually(
      async () => (await fetch(`${stack.gateway.url}/ready`)).status === 200,
      5_000,
      50,
    );
    expect(performance.now() - up).toBeLessThan(publicStateMaxAgeMs + 2_000);
  });
});
