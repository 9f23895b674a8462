import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { startAnvil } from "../src/adapters/chain/anvil.js";
import type { ChatInput } from "../src/domain/chat/ports.js";
import type { Closing } from "../src/domain/chat/metering.js";
import { createTracing } from "../src/runtime/tracing.js";
import { load, preflight, requestBody, type Target } from "./lib/measure.js";
import { killAllChildrenSync, startChild, type ChildHandle } from "./lib/processes.js";
import { baseEnv, intSetting, readCommonSettings } from "./lib/settings.js";
import {
  authorizeBenchKey,
  createBenchApiKey,
  createBenchDatabase,
  maximumCreditsPerRequest,
  onboardOffers,
  seedBenchMarket,
} from "./lib/setup.js";

/**
 * `npm run bench:tracing`: what OpenTelemetry tracing costs (issue 21, item 4). Two gateways
 * on one database and chain, the same but for tracing: one with OTEL_EXPORTER_OTLP_ENDPOINT
 * pointing at a collector in this process (a `node:http` server that decodes every export and
 * counts its spans), one without. JSON chats at BENCH_CONNECTIONS (32) connections, in
 * BENCH_TRACING_ROUNDS (3) rounds of BENCH_SECONDS each, off and on alternating (the order
 * swapped every round). See bench/README.md ("Tracing").
 */

function log(message: string): void {
  process.stderr.write(`[bench:tracing] ${message}\n`);
}

/**
 * A collector that takes OTLP/HTTP JSON exports and counts their spans; `decode: false` only
 * drains them (when it shares its process's CPU with what is measured).
 */
async function startCollector(
  decode = true,
): Promise<{ url: string; spans: () => number; close(): void }> {
  let spans = 0;
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (part: Buffer) => decode && parts.push(part));
    req.on("end", () => {
      if (!decode) {
        res.writeHead(200, { "content-type": "application/json" }).end("{}");
        return;
      }
      const body = JSON.parse(Buffer.concat(parts).toString("utf8")) as {
        resourceSpans?: { scopeSpans?: { spans?: unknown[] }[] }[];
      };
      for (const rs of body.resourceSpans ?? [])
        for (const ss of rs.scopeSpans ?? []) spans += ss.spans?.length ?? 0;
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, spans: () => spans, close: () => server.close() };
}

/**
 * CPU of one chat span in this process, recorded as the pipeline records it (start, model,
 * three step events, admission, close, end) and exported to `collector` by the batch processor,
 * without a gateway around it: the cost the load figures' noise can hide.
 */
async function spanCost(collectorUrl: string, spans: number): Promise<number> {
  const tracing = createTracing(
    {
      otlpTracesEndpoint: `${collectorUrl}/v1/traces`,
      otelServiceName: "bench-span-cost",
    },
    pino({ enabled: false }),
  )!;
  const id = `0x${"ab".repeat(32)}` as const;
  const input: ChatInput = {
    apiKeyId: "bench",
    authority: { permits: new Map(), expiresAt: 0 } as unknown as ChatInput["authority"],
    body: new Uint8Array(),
    permitId: undefined,
    quoteId: undefined,
    idempotencyKey: undefined,
    signal: new AbortController().signal,
    headers: new Headers(),
  };
  const closing: Closing = {
    status: "completed",
    billing: "billed",
    usageSource: "provider",
    usage: { inputTokens: 20n, outputTokens: 8n, cachedInputTokens: 0n, reasoningTokens: 0n },
    error: undefined,
    charge: 123_456_789n,
    aboveQuote: false,
    offerId: id,
  };
  const run = async (n: number): Promise<number> => {
    const before = process.cpuUsage();
    for (let i = 0; i < n; i++) {
      const trace = tracing.chat.start(input);
      trace.request("demo-chat", false);
      trace.step("permit");
      trace.step("route");
      trace.admitted({
        requestId: id,
        quoteId: id,
        offerId: id,
        permitId: id,
        maximumCredits: 99_999_999n,
      });
      trace.step("upstream");
      trace.closed(closing);
      trace.end();
      // Let the exporter's timers and sockets run, as between requests.
      if (i % 256 === 255) await new Promise((resolve) => setImmediate(resolve));
    }
    await tracing.flush();
    const used = process.cpuUsage(before);
    return (used.user + used.system) / n;
  };
  await run(Math.min(spans, 5_000)); // warm-up
  const micros = await run(spans);
  await tracing.shutdown();
  return micros;
}

interface Round {
  readonly tracing: "off" | "on";
  readonly requestsPerSecond: number;
  readonly ok: number;
  readonly non2xx: number;
  readonly errors: number;
  readonly latencyMs: { p50: number; p99: number };
  readonly gatewayCpuMsPerRequest: number;
}

async function main(): Promise<number> {
  const common = readCommonSettings();
  const rounds = intSetting("BENCH_TRACING_ROUNDS", 3, 0, 20);
  const spans = intSetting("BENCH_TRACING_SPANS", 20_000, 1_000, 1_000_000);
  const output =
    process.env.BENCH_OUTPUT ||
    fileURLToPath(new URL("./results/tracing-latest.json", import.meta.url));
  const cleanups: (() => Promise<void> | void)[] = [];
  process.on("exit", killAllChildrenSync);
  try {
    const costCollector = await startCollector(false);
    const spanMicros = await spanCost(costCollector.url, spans);
    costCollector.close();
    process.stdout.write(
      `\nOne chat span, recorded and exported in-process: ${spanMicros.toFixed(1)} µs CPU (${spans} spans)\n`,
    );
    if (rounds === 0) return 0;
    const db = await createBenchDatabase(common.serverUrl);
    cleanups.push(() => db.drop());
    const anvil = await startAnvil({ chainId: 31337 });
    cleanups.push(() => anvil.stop());
    const maxConcurrency = Math.max(64, 4 * common.connections);
    const perRequest = maximumCreditsPerRequest([requestBody("json")]);
    const million = 1_000_000n * 10n ** 18n;
    const cover = 10n * BigInt(maxConcurrency) * perRequest;
    const market = await seedBenchMarket(anvil, {
      maxConcurrency,
      deposit: cover > million ? cover : million,
    });
    const dir = await mkdtemp(join(tmpdir(), "gw-bench-tracing-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const catalogFile = join(dir, "catalog.json");
    await writeFile(catalogFile, JSON.stringify({ models: market.demo.catalog }));
    const collector = await startCollector();
    cleanups.push(() => collector.close());

    const upstream = await startChild(
      "upstream",
      "upstream.ts",
      { ...baseEnv(), HOST: "127.0.0.1", PORT: "0", SLOW_STREAM_MS: "10000" },
      30_000,
    );
    cleanups.push(() => upstream.stop());
    // Both gateways open the endpoints the other registered: one key.
    const encryptionKey = randomBytes(32).toString("hex");
    const gatewayEnv = (name: string): NodeJS.ProcessEnv => ({
      ...baseEnv(),
      RPC_URL: anvil.rpcUrl,
      CHAIN_ID: String(anvil.chainId),
      MARKET_ADDRESS: market.demo.market,
      START_BLOCK: market.demo.deployBlock.toString(),
      CONFIRMATIONS: "0",
      CATALOG_FILE: catalogFile,
      SETTLEMENT_OPERATOR_TOKEN: `op_${randomBytes(24).toString("hex")}`,
      DATABASE_URL: db.url,
      ENDPOINT_ENCRYPTION_KEY: encryptionKey,
      ALLOW_PRIVATE_ENDPOINTS: "true",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "warn",
      GATEWAY_STATE_DIR: join(dir, name),
    });
    // One after the other: the first migrates the database.
    const off: ChildHandle = await startChild("gateway", "gateway.ts", gatewayEnv("off"), 90_000);
    cleanups.push(() => off.stop());
    const on: ChildHandle = await startChild(
      "gateway",
      "gateway.ts",
      {
        ...gatewayEnv("on"),
        OTEL_EXPORTER_OTLP_ENDPOINT: collector.url,
        OTEL_SERVICE_NAME: "bench-gateway",
      },
      90_000,
    );
    cleanups.push(() => on.stop());
    const apiKey = await createBenchApiKey(db.url);
    await onboardOffers(market, { baseUrl: off.url, apiKey }, upstream.url);
    await authorizeBenchKey(market, { baseUrl: off.url, apiKey });
    log(`gateways: off ${off.url} (pid ${off.pid}), on ${on.url} (pid ${on.pid})`);

    const headers = {
      authorization: `Bearer ${apiKey}`,
      "x-gateway-permit": market.permitId,
      "content-type": "application/json",
    };
    const targets: Record<"off" | "on", { target: Target; child: ChildHandle }> = {
      off: { target: { name: "gateway", url: off.url, headers }, child: off },
      on: { target: { name: "gateway", url: on.url, headers }, child: on },
    };
    let tracedRequests = 0;
    for (const tracing of ["off", "on"] as const) {
      const check = await preflight(targets[tracing].target, "json");
      if (!check.ok) throw new Error(`preflight (tracing ${tracing}) failed: ${check.detail}`);
      if (tracing === "on") tracedRequests++;
      if (common.warmupSeconds > 0) {
        const warm = await load(targets[tracing].target, "json", {
          connections: common.connections,
          seconds: common.warmupSeconds,
        });
        if (tracing === "on") tracedRequests += warm.responses;
      }
    }

    const results: Round[] = [];
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 === 0 ? (["off", "on"] as const) : (["on", "off"] as const);
      for (const tracing of order) {
        const { target, child } = targets[tracing];
        await sleep(1_000);
        const before = await child.stats();
        const result = await load(target, "json", {
          connections: common.connections,
          seconds: common.seconds,
        });
        const after = await child.stats();
        if (tracing === "on") tracedRequests += result.responses;
        const cpuMs =
          (after.cpu.user + after.cpu.system - before.cpu.user - before.cpu.system) / 1000;
        const figures: Round = {
          tracing,
          requestsPerSecond: result.requestsPerSecond,
          ok: result.ok,
          non2xx: result.non2xx,
          errors: result.errors,
          latencyMs: { p50: result.latencyMs.p50, p99: result.latencyMs.p99 },
          gatewayCpuMsPerRequest: result.responses > 0 ? cpuMs / result.responses : 0,
        };
        results.push(figures);
        log(
          `round ${round + 1} tracing ${tracing}: ${figures.requestsPerSecond.toFixed(0)} req/s, ` +
            `p50 ${figures.latencyMs.p50} ms, p99 ${figures.latencyMs.p99} ms, ` +
            `${figures.gatewayCpuMsPerRequest.toFixed(3)} gateway CPU ms/request, ` +
            `${figures.non2xx} non-2xx, ${figures.errors} errors`,
        );
      }
    }
    // The batch processor exports every 5 s: wait for the last batch.
    await sleep(6_000);

    const mean = (tracing: "off" | "on", pick: (r: Round) => number): number => {
      const mine = results.filter((r) => r.tracing === tracing);
      return mine.reduce((sum, r) => sum + pick(r), 0) / mine.length;
    };
    const summary = {
      connections: common.connections,
      seconds: common.seconds,
      rounds,
      off: {
        requestsPerSecond: mean("off", (r) => r.requestsPerSecond),
        p50Ms: mean("off", (r) => r.latencyMs.p50),
        p99Ms: mean("off", (r) => r.latencyMs.p99),
        gatewayCpuMsPerRequest: mean("off", (r) => r.gatewayCpuMsPerRequest),
      },
      on: {
        requestsPerSecond: mean("on", (r) => r.requestsPerSecond),
        p50Ms: mean("on", (r) => r.latencyMs.p50),
        p99Ms: mean("on", (r) => r.latencyMs.p99),
        gatewayCpuMsPerRequest: mean("on", (r) => r.gatewayCpuMsPerRequest),
      },
      /** Requests the traced gateway answered (preflight and warm-up included) and spans received. */
      tracedRequests,
      spansReceived: collector.spans(),
      spanCpuMicros: spanMicros,
      results,
    };
    const ratio = summary.on.requestsPerSecond / summary.off.requestsPerSecond;
    const cpu = summary.on.gatewayCpuMsPerRequest / summary.off.gatewayCpuMsPerRequest;
    await writeFile(output, `${JSON.stringify(summary, null, 2)}\n`);
    process.stdout.write(
      `\nTracing cost, JSON at ${common.connections} connections, ${rounds} x ${common.seconds} s each:\n` +
        `  off: ${summary.off.requestsPerSecond.toFixed(0)} req/s, p50 ${summary.off.p50Ms.toFixed(1)} ms, p99 ${summary.off.p99Ms.toFixed(1)} ms, ${summary.off.gatewayCpuMsPerRequest.toFixed(3)} CPU ms/request\n` +
        `  on:  ${summary.on.requestsPerSecond.toFixed(0)} req/s, p50 ${summary.on.p50Ms.toFixed(1)} ms, p99 ${summary.on.p99Ms.toFixed(1)} ms, ${summary.on.gatewayCpuMsPerRequest.toFixed(3)} CPU ms/request\n` +
        `  on/off: throughput ${(ratio * 100).toFixed(1)} %, CPU per request ${(cpu * 100).toFixed(1)} %\n` +
        `  spans received ${summary.spansReceived} of ${tracedRequests} traced requests\n`,
    );
    log(`results written to ${output}`);
    return results.some((r) => r.non2xx > 0 || r.errors > 0) ? 1 : 0;
  } catch (error) {
    log(`failed: ${(error as Error).stack ?? String(error)}`);
    return 2;
  } finally {
    for (const step of cleanups.reverse()) {
      try {
        await step();
      } catch (error) {
        log(`cleanup failed: ${(error as Error).message}`);
      }
    }
  }
}

process.exitCode = await main();
