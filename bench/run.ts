import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { startAnvil } from "../src/adapters/chain/anvil.js";
import { execFileSync } from "node:child_process";
import { buildIfStale } from "../scripts/build.mjs";
import { killAllChildrenSync, startChild, type ChildHandle } from "./lib/processes.js";
import {
  dialectRequest,
  dialectRoutes,
  load,
  percentiles,
  preflight,
  requestBody,
  scenarios,
  slowStreamBody,
  unaryRequest,
  UnloadedSampler,
  type LoadResult,
  type Scenario,
  type Target,
} from "./lib/measure.js";
import { monotonicMicros, type PhaseWindow, type PhasesFile } from "./lib/layers.js";
import { createPgCpuProbe, type PgCpuProbe } from "./lib/pg-cpu.js";
import {
  allPassed,
  compare,
  formatReport,
  type BenchReport,
  type CpuFigures,
  type LoadPhase,
  type TargetName,
  type UnloadedFigures,
} from "./lib/report.js";
import {
  authorizeBenchKey,
  createBenchApiKey,
  createBenchDatabase,
  maximumCreditsPerRequest,
  onboardOffers,
  seedBenchMarket,
} from "./lib/setup.js";
import { baseEnv, intSetting, readCommonSettings, type CommonSettings } from "./lib/settings.js";
import { memoryOf, slowStreamBurst } from "./lib/streams.js";
import { sustainedLoad, type SustainedFigures } from "./lib/sustained.js";
import { x402Phase, type X402Figures } from "./lib/x402-phase.js";

/**
 * `npm run bench`: the gateway on a fresh database of a real PostgreSQL, anvil with the demo
 * market, a fast fake upstream and a minimal Node reverse proxy, all started here on 127.0.0.1;
 * then the same chat requests through the proxy and through the gateway, unloaded and at load.
 * Everything it starts is stopped (by PID) and the database dropped, also on failure, Ctrl-C,
 * or when the run overstays its time budget. See bench/README.md.
 */

/** Length of each window of the sustained phase, s. */
const sustainedWindowSeconds = 20;

interface Settings extends CommonSettings {
  readonly output: string;
  readonly profileDir: string | undefined;
  /** A heap snapshot of the gateway, taken once the slow streams have all started, goes here. */
  readonly heapSnapshotDir: string | undefined;
  /** Connections of the second SSE load phase; 0 skips it. */
  readonly wideConnections: number;
  /** Seconds of the sustained JSON phase; 0 skips it. */
  readonly sustainedSeconds: number;
  /** Slow streams started at once; 0 skips the phase. */
  readonly slowStreams: number;
  /** The slow streams are started evenly within this many ms. */
  readonly slowStartMs: number;
  /** How long the fake upstream takes for each slow stream. */
  readonly slowStreamSeconds: number;
  /** Measure POST /v1/responses and POST /v1/messages too (BENCH_DIALECTS=0 skips them). */
  readonly dialects: boolean;
  /** Seconds of the unary phase (`POST /v1/quotes` on the gateway); 0 skips it. */
  readonly unarySeconds: number;
  /** Requests per path of the x402 phase (paid beside permit); 0 skips it. */
  readonly x402Requests: number;
}

function readSettings(): Settings {
  const sustainedSeconds = intSetting("BENCH_SUSTAINED_SECONDS", 180, 0, 3600);
  if (sustainedSeconds > 0 && sustainedSeconds < 2 * sustainedWindowSeconds) {
    throw new Error(
      `BENCH_SUSTAINED_SECONDS must be 0 (skip) or at least ${2 * sustainedWindowSeconds} (two ${sustainedWindowSeconds} s windows), got ${sustainedSeconds}`,
    );
  }
  const common = readCommonSettings();
  return {
    ...common,
    output:
      process.env.BENCH_OUTPUT || fileURLToPath(new URL("./results/latest.json", import.meta.url)),
    profileDir: process.env.BENCH_PROFILE_DIR || undefined,
    heapSnapshotDir: process.env.BENCH_HEAP_SNAPSHOT_DIR || undefined,
    wideConnections: intSetting("BENCH_WIDE_CONNECTIONS", 128, 0, 1024),
    sustainedSeconds,
    slowStreams: intSetting("BENCH_SLOW_STREAMS", 1000, 0, 5000),
    slowStartMs: intSetting("BENCH_SLOW_START_MS", 1000, 1, 60_000),
    slowStreamSeconds: intSetting("BENCH_SLOW_STREAM_SECONDS", 10, 1, 120),
    dialects: intSetting("BENCH_DIALECTS", 1, 0, 1) === 1,
    unarySeconds: intSetting("BENCH_UNARY_SECONDS", common.seconds, 0, 300),
    x402Requests: intSetting("BENCH_X402_REQUESTS", 200, 0, 10_000),
  };
}

const setupBudgetMs = 180_000;
const unloadedBudgetMs = 120_000;

/** The soft limit of open files this process (and so its children) may have, if known. */
function openFilesLimit(): number | undefined {
  try {
    const out = execFileSync("sh", ["-c", "ulimit -n"], { encoding: "utf8", timeout: 5_000 });
    const value = Number(out.trim());
    return Number.isInteger(value) ? value : undefined; // "unlimited" is NaN
  } catch {
    return undefined;
  }
}

function log(message: string): void {
  process.stderr.write(`[bench] ${message}\n`);
}

/** `BENCH_GATEWAY_<NAME>=value` is passed to the gateway as `<NAME>=value` (after the defaults). */
function gatewayOverrides(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (key.startsWith("BENCH_GATEWAY_") && value !== undefined) {
      env[key.slice("BENCH_GATEWAY_".length)] = value;
    }
  }
  return env;
}

async function cpuWindow<T>(
  children: Record<"gateway" | "proxy" | "upstream", ChildHandle>,
  probe: PgCpuProbe,
  run: () => Promise<T & { responses: number; ok: number }>,
): Promise<{
  result: T & { responses: number; ok: number };
  cpu: CpuFigures;
  /** The measured window on the CPU profile's clock (µs), and the gateway's CPU in it. */
  window: { startUs: number; endUs: number; gatewayCpuMs: number };
}> {
  const names = ["gateway", "proxy", "upstream"] as const;
  const [before, pgBefore] = await Promise.all([
    Promise.all(names.map((n) => children[n].stats())),
    probe.snapshot(),
  ]);
  const startedAt = process.hrtime.bigint();
  const result = await run();
  const endedAt = process.hrtime.bigint();
  const wallMs = Number(endedAt - startedAt) / 1e6;
  const [after, pgAfter] = await Promise.all([
    Promise.all(names.map((n) => children[n].stats())),
    probe.snapshot(),
  ]);
  const postgres = pgBefore && pgAfter ? probe.between(pgBefore, pgAfter) : undefined;
  const used = (i: number): number =>
    (after[i]!.cpu.user + after[i]!.cpu.system - before[i]!.cpu.user - before[i]!.cpu.system) /
    1000;
  const perRequest = (i: number): number | undefined =>
    result.responses > 0 ? used(i) / result.responses : undefined;
  const cores: CpuFigures["cores"] = {};
  names.forEach((n, i) => (cores[n] = used(i) / wallMs));
  if (postgres) cores.postgres = postgres.cores;
  const cpu: CpuFigures = {
    ...(perRequest(0) === undefined ? {} : { gatewayMsPerRequest: perRequest(0) }),
    ...(perRequest(1) === undefined ? {} : { proxyMsPerRequest: perRequest(1) }),
    ...(perRequest(2) === undefined ? {} : { upstreamMsPerRequest: perRequest(2) }),
    ...(postgres && result.ok > 0 ? { postgresMsPerRequest: postgres.cpuMs / result.ok } : {}),
    ...(postgres ? { postgres } : {}),
    cores,
  };
  return {
    result,
    cpu,
    window: {
      startUs: Number(startedAt / 1000n),
      endUs: Number(endedAt / 1000n),
      gatewayCpuMs: used(0),
    },
  };
}

async function main(): Promise<number> {
  const settings = readSettings();
  const startedAt = new Date();
  const problems: string[] = [];
  const logPhase = (label: string, phase: LoadResult): void => {
    log(
      `  ${phase.requestsPerSecond.toFixed(0)} req/s, p50 ${phase.latencyMs.p50} ms, ` +
        `${phase.non2xx} non-2xx, ${phase.errors} errors`,
    );
    if (phase.non2xx > 0 || phase.errors > 0) {
      problems.push(
        `${label}: ${phase.non2xx} non-2xx answers and ${phase.errors} errors at load` +
          (phase.errorSamples.length > 0 ? ` (${phase.errorSamples.join(" | ")})` : ""),
      );
    }
  };
  const cleanups: { what: string; run: () => Promise<void> }[] = [];
  let cleaning: Promise<void> | undefined;
  const cleanup = (): Promise<void> => {
    cleaning ??= (async () => {
      for (const step of cleanups.reverse()) {
        try {
          await step.run();
        } catch (error) {
          log(`cleanup: ${step.what} failed: ${(error as Error).message}`);
        }
      }
    })();
    return cleaning;
  };

  // Whatever happens, the run ends: a watchdog for the whole budget, and signals.
  const slowStreamTimeoutMs = settings.slowStartMs + settings.slowStreamSeconds * 1000 + 50_000;
  const loadPhaseMs = (settings.warmupSeconds + settings.seconds + 15) * 1000;
  const budgetMs =
    setupBudgetMs +
    unloadedBudgetMs +
    scenarios.length * 2 * loadPhaseMs +
    (settings.wideConnections > 0 ? 2 * loadPhaseMs : 0) +
    (settings.dialects ? 4 * (loadPhaseMs + 5_000) : 0) +
    (settings.unarySeconds > 0 ? (settings.warmupSeconds + settings.unarySeconds + 20) * 1000 : 0) +
    (settings.slowStreams > 0 ? 2 * (slowStreamTimeoutMs + 15_000) : 0) +
    (settings.sustainedSeconds > 0 ? (settings.sustainedSeconds + 60) * 1000 : 0) +
    60_000;
  let aborted: string | undefined;
  const checkAborted = (): void => {
    if (aborted !== undefined) throw new Error(`aborted (${aborted})`);
  };
  const abort = (reason: string, code: number): void => {
    aborted = reason;
    log(`${reason}: stopping everything`);
    const force = setTimeout(() => {
      killAllChildrenSync();
      process.exit(code);
    }, 20_000);
    force.unref();
    void cleanup().finally(() => {
      killAllChildrenSync();
      process.exit(code);
    });
  };
  const watchdog = setTimeout(
    () => abort(`the run exceeded its ${Math.round(budgetMs / 1000)} s budget`, 3),
    budgetMs,
  );
  process.once("SIGINT", () => abort("SIGINT", 130));
  process.once("SIGTERM", () => abort("SIGTERM", 143));
  process.on("exit", killAllChildrenSync);

  try {
    // ---------------------------------------------------------------- setup
    const setupStarted = Date.now();
    // The gateway child runs dist/bench/gateway.js: the bench measures the production build.
    if (buildIfStale()) log("built dist/ (the gateway's production build)");
    log(`creating a database on ${new URL(settings.serverUrl).host}`);
    const db = await createBenchDatabase(settings.serverUrl);
    cleanups.push({ what: `dropping database ${db.name}`, run: () => db.drop() });

    log("starting anvil and seeding the demo market");
    const anvil = await startAnvil({ chainId: 31337 });
    cleanups.push({ what: "stopping anvil", run: () => anvil.stop() });
    // Room for every connection of every phase, and for all slow streams at once (with the
    // slots of closes still in flight); a deposit that covers all of them at their maximum.
    const maxConcurrency = Math.max(
      64,
      4 * Math.max(settings.connections, settings.wideConnections),
      2 * settings.slowStreams,
    );
    const perRequestMaximum = maximumCreditsPerRequest([
      requestBody("json"),
      requestBody("sse"),
      slowStreamBody(),
    ]);
    const oneMillionCredits = 1_000_000n * 10n ** 18n;
    const coverAll = 10n * BigInt(maxConcurrency) * perRequestMaximum;
    const deposit = coverAll > oneMillionCredits ? coverAll : oneMillionCredits;
    const market = await seedBenchMarket(anvil, { maxConcurrency, deposit });
    log(
      `offers: max_concurrency ${maxConcurrency}; permit deposit ${deposit} covers ` +
        `${deposit / perRequestMaximum} concurrent maxima of ${perRequestMaximum}`,
    );
    if (settings.slowStreams > 0) {
      const limit = openFilesLimit();
      // The gateway holds a client and an upstream socket per stream, the runner one.
      if (limit !== undefined && limit < 2 * settings.slowStreams + 1024) {
        problems.push(
          `ulimit -n is ${limit}: too low for ${settings.slowStreams} slow streams (the gateway needs about ${2 * settings.slowStreams + 1024} descriptors); raise it before the run`,
        );
      }
    }

    const dir = await mkdtemp(join(tmpdir(), "gw-bench-"));
    cleanups.push({
      what: `removing ${dir}`,
      run: () => rm(dir, { recursive: true, force: true }),
    });
    const catalogFile = join(dir, "catalog.json");
    await writeFile(catalogFile, `${JSON.stringify({ models: market.demo.catalog }, null, 2)}\n`);

    log("starting the fake upstream, the reverse proxy and the gateway");
    const children: Partial<Record<"gateway" | "proxy" | "upstream", ChildHandle>> = {};
    const stopChild = (name: keyof typeof children) => async () => {
      const child = children[name];
      if (!child) return;
      const t0 = Date.now();
      await child.stop();
      const status = child.exitStatus();
      if (status !== "code 0") {
        log(`${name} ended with ${status} after ${Date.now() - t0} ms; its last output:`);
        process.stderr.write(`${child.output().trim().split("\n").slice(-20).join("\n")}\n`);
      }
    };
    cleanups.push({ what: "stopping the upstream", run: stopChild("upstream") });
    cleanups.push({ what: "stopping the proxy", run: stopChild("proxy") });
    cleanups.push({ what: "stopping the gateway", run: stopChild("gateway") });
    const gatewayEnv: NodeJS.ProcessEnv = {
      ...baseEnv(),
      RPC_URL: anvil.rpcUrl,
      CHAIN_ID: String(anvil.chainId),
      MARKET_ADDRESS: market.demo.market,
      START_BLOCK: market.demo.deployBlock.toString(),
      CONFIRMATIONS: "0",
      CATALOG_FILE: catalogFile,
      SETTLEMENT_OPERATOR_TOKEN: `op_${randomBytes(24).toString("hex")}`,
      DATABASE_URL: db.url,
      ENDPOINT_ENCRYPTION_KEY: randomBytes(32).toString("hex"),
      ALLOW_PRIVATE_ENDPOINTS: "true",
      HOST: "127.0.0.1",
      PORT: "0",
      LOG_LEVEL: "warn",
      GATEWAY_STATE_DIR: join(dir, "state"),
      ...gatewayOverrides(),
    };
    // BENCH_PROFILE_DIR: a V8 CPU profile of the gateway, written there when it stops.
    // BENCH_HEAP_SNAPSHOT_DIR: SIGUSR2 makes the gateway write a heap snapshot there.
    const profileArgs = [
      ...(settings.profileDir ? ["--cpu-prof", `--cpu-prof-dir=${settings.profileDir}`] : []),
      ...(settings.heapSnapshotDir
        ? ["--heapsnapshot-signal=SIGUSR2", `--diagnostic-dir=${settings.heapSnapshotDir}`]
        : []),
    ];
    const started = await Promise.allSettled([
      startChild(
        "upstream",
        "upstream.ts",
        {
          ...baseEnv(),
          HOST: "127.0.0.1",
          PORT: "0",
          SLOW_STREAM_MS: String(settings.slowStreamSeconds * 1000),
        },
        30_000,
      )
        .then((c) => (children.upstream = c))
        .then(async (up) => {
          children.proxy = await startChild(
            "proxy",
            "proxy.ts",
            { ...baseEnv(), HOST: "127.0.0.1", PORT: "0", UPSTREAM_URL: up.url },
            30_000,
          );
        }),
      // The production build, as `npm run serve` runs it: no loader.
      startChild("gateway", "../dist/bench/gateway.js", gatewayEnv, 90_000, profileArgs).then(
        (c) => (children.gateway = c),
      ),
    ]);
    for (const outcome of started) {
      if (outcome.status === "rejected") throw outcome.reason;
    }
    const { gateway, proxy, upstream } = children as Record<
      "gateway" | "proxy" | "upstream",
      ChildHandle
    >;
    log(`upstream ${upstream.url} (pid ${upstream.pid}), proxy ${proxy.url} (pid ${proxy.pid})`);
    log(`gateway ${gateway.url} (pid ${gateway.pid}), database ${db.name}`);

    // With a CPU profile, each measured phase's window on the profile's clock, so that
    // `npm run bench:layers` can cut the gateway's one profile into phases. Written after each
    // phase: a run that fails later still leaves the windows of what it measured.
    const phaseWindows: PhaseWindow[] = [];
    const recordPhase = async (
      name: string,
      window: { startUs: number; endUs: number; gatewayCpuMs?: number },
      requests?: number,
    ): Promise<void> => {
      if (!settings.profileDir) return;
      phaseWindows.push({ name, ...window, ...(requests === undefined ? {} : { requests }) });
      const file: PhasesFile = { gatewayPid: gateway.pid, phases: phaseWindows };
      await mkdir(settings.profileDir, { recursive: true });
      await writeFile(
        join(settings.profileDir, `bench-phases-${gateway.pid}.json`),
        `${JSON.stringify(file, null, 2)}\n`,
      );
    };

    const probe = await createPgCpuProbe(settings.serverUrl, db.name);
    cleanups.push({ what: "closing the PostgreSQL CPU probe", run: () => probe.close() });
    if (probe.unavailable !== undefined) {
      log(`PostgreSQL CPU will not be measured: ${probe.unavailable}`);
    }

    const apiKey = await createBenchApiKey(db.url);
    const onboarded = await onboardOffers(market, { baseUrl: gateway.url, apiKey }, upstream.url);
    log(`${onboarded} demo offers registered and verified against the fake upstream`);
    await authorizeBenchKey(market, { baseUrl: gateway.url, apiKey });
    const setupSeconds = (Date.now() - setupStarted) / 1000;
    const memoryAfterSetup: BenchReport["memoryAfterSetup"] = {
      gateway: memoryOf(await gateway.stats()),
      proxy: memoryOf(await proxy.stats()),
    };

    const headers = {
      authorization: `Bearer ${apiKey}`,
      "x-gateway-permit": market.permitId,
      "content-type": "application/json",
    };
    const targetsByName: Record<TargetName, Target> = {
      proxy: { name: "proxy", url: proxy.url, headers },
      gateway: { name: "gateway", url: gateway.url, headers },
    };
    const order: TargetName[] = ["proxy", "gateway"];

    // ---------------------------------------------------------------- preflight
    const pre: BenchReport["preflight"] = { proxy: {}, gateway: {} };
    for (const name of order) {
      for (const scenario of scenarios) {
        checkAborted();
        const result = await preflight(targetsByName[name], scenario);
        pre[name][scenario] = result;
        log(`preflight ${name} ${scenario}: ${result.ok ? "ok" : "FAILED"}: ${result.detail}`);
        if (!result.ok) {
          problems.push(
            `${name} ${scenario === "json" ? "JSON" : "SSE"} is not measured: its preflight answered ${result.detail}`,
          );
        }
      }
    }
    const measurable = (name: TargetName, scenario: Scenario): boolean =>
      pre[name][scenario]?.ok === true;

    // ---------------------------------------------------------------- unloaded
    log(`unloaded: ${settings.unloadedRequests} sequential requests per target and scenario`);
    const samplers: UnloadedSampler[] = [];
    for (const scenario of scenarios) {
      for (const name of order) {
        if (measurable(name, scenario)) {
          samplers.push(new UnloadedSampler(targetsByName[name], scenario));
        }
      }
    }
    const unloadedDeadline = Date.now() + unloadedBudgetMs;
    const unloadedStartUs = monotonicMicros();
    for (const sampler of samplers) {
      checkAborted();
      await sampler.run(30, true, unloadedDeadline);
    }
    // Interleaved rounds, so a slow moment of the machine does not land on one target only.
    const rounds = 6;
    const perRound = Math.ceil(settings.unloadedRequests / rounds);
    for (let round = 0; round < rounds; round++) {
      for (const sampler of samplers) {
        checkAborted();
        const left = settings.unloadedRequests - round * perRound;
        await sampler.run(Math.min(perRound, left), false, unloadedDeadline);
      }
    }
    // Both targets, interleaved, warm-up included: the gateway idles while the proxy is asked.
    await recordPhase("unloaded", { startUs: unloadedStartUs, endUs: monotonicMicros() });
    const unloaded: BenchReport["unloaded"] = { proxy: {}, gateway: {} };
    for (const sampler of samplers) {
      sampler.close();
      const statusCodes = Object.fromEntries(
        [...sampler.statuses].map(([code, n]) => [String(code), n]),
      );
      const figures: UnloadedFigures = {
        requests: [...sampler.statuses.values()].reduce((a, b) => a + b, 0),
        statusCodes,
        failures: sampler.failures.slice(0, 5),
        ...(percentiles(sampler.total) ? { totalMs: percentiles(sampler.total) } : {}),
        ...(percentiles(sampler.firstByte) ? { firstByteMs: percentiles(sampler.firstByte) } : {}),
        ...(percentiles(sampler.headers) ? { headersMs: percentiles(sampler.headers) } : {}),
      };
      unloaded[sampler.target.name][sampler.scenario] = figures;
    }
    if (Date.now() >= unloadedDeadline) {
      problems.push(`the unloaded measurement stopped at its ${unloadedBudgetMs / 1000} s budget`);
    }

    // ---------------------------------------------------------------- load
    const loadResults: BenchReport["load"] = { proxy: {}, gateway: {} };
    const all = { gateway, proxy, upstream };
    for (const scenario of scenarios) {
      for (const name of order) {
        if (!measurable(name, scenario)) continue;
        checkAborted();
        const target = targetsByName[name];
        const options = { connections: settings.connections };
        if (settings.warmupSeconds > 0) {
          log(`warm-up: ${name} ${scenario}, ${settings.warmupSeconds} s`);
          await load(target, scenario, { ...options, seconds: settings.warmupSeconds });
          await sleep(500);
        }
        log(
          `load: ${name} ${scenario}, ${settings.connections} connections, ${settings.seconds} s`,
        );
        checkAborted();
        const { result, cpu, window } = await cpuWindow(all, probe, () =>
          load(target, scenario, { ...options, seconds: settings.seconds }),
        );
        if (name === "gateway") await recordPhase(scenario, window, result.ok);
        const phase: LoadPhase = { ...result, cpu };
        loadResults[name][scenario] = phase;
        logPhase(`${name} ${scenario}`, phase);
        await sleep(1_000);
      }
    }

    // ---------------------------------------------------------------- SSE, more connections
    const loadWide: BenchReport["loadWide"] = {};
    if (settings.wideConnections > 0) {
      for (const name of order) {
        if (!measurable(name, "sse")) continue;
        checkAborted();
        const target = targetsByName[name];
        const options = { connections: settings.wideConnections };
        if (settings.warmupSeconds > 0) {
          log(`warm-up: ${name} sse, ${settings.wideConnections} connections`);
          await load(target, "sse", { ...options, seconds: settings.warmupSeconds });
          await sleep(500);
        }
        log(`load: ${name} sse, ${settings.wideConnections} connections, ${settings.seconds} s`);
        checkAborted();
        const { result, cpu, window } = await cpuWindow(all, probe, () =>
          load(target, "sse", { ...options, seconds: settings.seconds }),
        );
        if (name === "gateway") {
          await recordPhase(`sse@${settings.wideConnections}`, window, result.ok);
        }
        const phase: LoadPhase = { ...result, cpu };
        loadWide[name] = phase;
        logPhase(`${name} sse ${settings.wideConnections}`, phase);
        await sleep(1_000);
      }
    }

    // ---------------------------------------------------------------- dialect routes
    // The same request through POST /v1/responses and POST /v1/messages (issue 20): the
    // translator stage's cost on top of the chat path, on the gateway alone.
    const dialects: NonNullable<BenchReport["dialects"]> = {};
    if (settings.dialects) {
      for (const dialect of dialectRoutes) {
        for (const scenario of scenarios) {
          if (!measurable("gateway", scenario)) continue;
          checkAborted();
          const request = dialectRequest(dialect, scenario);
          const check = await load(targetsByName.gateway, scenario, {
            connections: 1,
            seconds: 1,
            request,
          });
          if (check.ok === 0 || check.non2xx > 0) {
            problems.push(
              `${dialect} ${scenario} is not measured: ${check.errorSamples.join(" | ") || "no 2xx answer"}`,
            );
            continue;
          }
          const options = { connections: settings.connections, request };
          if (settings.warmupSeconds > 0) {
            await load(targetsByName.gateway, scenario, {
              ...options,
              seconds: settings.warmupSeconds,
            });
            await sleep(500);
          }
          log(
            `load: gateway ${dialect} ${scenario}, ${settings.connections} connections, ${settings.seconds} s`,
          );
          const { result, cpu, window } = await cpuWindow(all, probe, () =>
            load(targetsByName.gateway, scenario, { ...options, seconds: settings.seconds }),
          );
          await recordPhase(`${dialect} ${scenario}`, window, result.ok);
          const phase: LoadPhase = { ...result, cpu };
          (dialects[dialect] ??= {})[scenario] = phase;
          logPhase(`gateway ${dialect} ${scenario}`, phase);
          await sleep(1_000);
        }
      }
    }

    // ---------------------------------------------------------------- unary
    // A keyed unary REST route (issue 36): the guard and the REST-to-service seam per call,
    // reported beside the chat phases' CPU per request.
    let unary: LoadPhase | undefined;
    if (settings.unarySeconds > 0) {
      checkAborted();
      const request = unaryRequest();
      const target = targetsByName.gateway;
      const check = await load(target, "json", { connections: 1, seconds: 1, request });
      if (check.ok === 0 || check.non2xx > 0) {
        problems.push(
          `unary ${request.path} is not measured: ${check.errorSamples.join(" | ") || "no 2xx answer"}`,
        );
      } else {
        const options = { connections: settings.connections, request };
        if (settings.warmupSeconds > 0) {
          await load(target, "json", { ...options, seconds: settings.warmupSeconds });
          await sleep(500);
        }
        log(
          `load: gateway unary POST ${request.path}, ${settings.connections} connections, ${settings.unarySeconds} s`,
        );
        const { result, cpu, window } = await cpuWindow(all, probe, () =>
          load(target, "json", { ...options, seconds: settings.unarySeconds }),
        );
        await recordPhase("unary", window, result.ok);
        unary = { ...result, cpu };
        logPhase("gateway unary", unary);
        await sleep(1_000);
      }
    }

    // ---------------------------------------------------------------- slow streams
    const slowStreams: BenchReport["slowStreams"] = {};
    if (settings.slowStreams > 0) {
      for (const name of order) {
        if (!measurable(name, "sse")) continue;
        checkAborted();
        log(
          `slow streams: ${name}, ${settings.slowStreams} started within ${settings.slowStartMs} ms, ` +
            `${settings.slowStreamSeconds} s each`,
        );
        const burstStartUs = monotonicMicros();
        const burst = await slowStreamBurst(targetsByName[name], all[name], {
          streams: settings.slowStreams,
          spreadMs: settings.slowStartMs,
          timeoutMs: slowStreamTimeoutMs,
          ...(name === "gateway" && settings.heapSnapshotDir
            ? { snapshotAfterMs: settings.slowStartMs + 2_000 }
            : {}),
        });
        slowStreams[name] = burst;
        if (name === "gateway") {
          await recordPhase(
            "slow streams",
            { startUs: burstStartUs, endUs: monotonicMicros() },
            burst.complete,
          );
        }
        log(
          `  ${burst.complete}/${burst.streams} complete, started within ${burst.startSpreadMs.toFixed(0)} ms, ` +
            `first byte p50 ${burst.firstByteMs?.p50.toFixed(1) ?? "-"} ms, ` +
            `peak RSS ${(burst.memory.peak.rssBytes / 1e6).toFixed(1)} MB ` +
            `(${(burst.memory.before.rssBytes / 1e6).toFixed(1)} MB before)`,
        );
        if (burst.complete < burst.streams) {
          problems.push(
            `${name} slow streams: ${burst.complete} of ${burst.streams} complete, ` +
              `${burst.errors} errors, ${burst.incomplete} cut or malformed, statuses ` +
              `${JSON.stringify(burst.statusCodes)} (${burst.errorSamples.join(" | ")})`,
          );
        }
        // Let the streams' closes (and the gateway's records of them) settle.
        await sleep(2_000);
      }
    }

    // ---------------------------------------------------------------- sustained
    let sustained: SustainedFigures | undefined;
    if (settings.sustainedSeconds > 0 && measurable("gateway", "json")) {
      checkAborted();
      log(
        `sustained: gateway json, ${settings.connections} connections, ${settings.sustainedSeconds} s ` +
          `in ${sustainedWindowSeconds} s windows, same database`,
      );
      const sustainedStartUs = monotonicMicros();
      sustained = await sustainedLoad(targetsByName.gateway, gateway, probe, {
        connections: settings.connections,
        seconds: settings.sustainedSeconds,
        windowSeconds: sustainedWindowSeconds,
        log,
      });
      await recordPhase(
        "sustained",
        { startUs: sustainedStartUs, endUs: monotonicMicros() },
        sustained.load.ok,
      );
      if (sustained.load.non2xx > 0 || sustained.load.errors > 0) {
        problems.push(
          `sustained: ${sustained.load.non2xx} non-2xx answers and ${sustained.load.errors} errors` +
            (sustained.load.errorSamples.length > 0
              ? ` (${sustained.load.errorSamples.join(" | ")})`
              : ""),
        );
      }
    }

    // ---------------------------------------------------------------- x402
    let x402: X402Figures | undefined;
    if (settings.x402Requests > 0 && measurable("gateway", "json")) {
      checkAborted();
      log(`x402: ${settings.x402Requests} paid and ${settings.x402Requests} permit requests`);
      try {
        x402 = await x402Phase({
          market,
          anvil,
          gatewayEnv,
          apiKey,
          probe,
          requests: settings.x402Requests,
          log,
          clockTicksPerSecond: probe.clockTicksPerSecond,
        });
        log(
          `  x402 ${x402.x402.gatewayCpuMsPerRequest.toFixed(2)} vs permit ${x402.permit.gatewayCpuMsPerRequest.toFixed(2)} gateway CPU ms/request`,
        );
      } catch (error) {
        problems.push(`x402 is not measured: ${(error as Error).message}`);
      }
    }

    // ---------------------------------------------------------------- report
    const reportSettings: BenchReport["settings"] = {
      seconds: settings.seconds,
      warmupSeconds: settings.warmupSeconds,
      connections: settings.connections,
      unloadedRequests: settings.unloadedRequests,
      wideConnections: settings.wideConnections,
      sustainedSeconds: settings.sustainedSeconds,
      sustainedWindowSeconds,
      slowStreams: settings.slowStreams,
      slowStartMs: settings.slowStartMs,
      slowStreamSeconds: settings.slowStreamSeconds,
      unarySeconds: settings.unarySeconds,
      x402Requests: settings.x402Requests,
      offerMaxConcurrency: market.maxConcurrency,
      permitDeposit: market.permitDeposit.toString(),
      request: requestBody("json"),
    };
    const postgresCpu: BenchReport["postgresCpu"] = {
      clockTicksPerSecond: probe.clockTicksPerSecond,
      ...(probe.unavailable === undefined ? {} : { unavailable: probe.unavailable }),
      ...(probe.note === undefined ? {} : { note: probe.note }),
    };
    const { comparison, targets } = compare({
      load: loadResults,
      loadWide,
      unloaded,
      preflight: pre,
      slowStreams,
      ...(sustained ? { sustained } : {}),
      settings: reportSettings,
      postgresCpu,
    });
    const report: BenchReport = {
      version: 2,
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      machine: { cpus: availableParallelism(), node: process.version, platform: process.platform },
      settings: reportSettings,
      setupSeconds,
      memoryAfterSetup,
      postgresCpu,
      preflight: pre,
      unloaded,
      load: loadResults,
      loadWide,
      ...(Object.keys(dialects).length > 0 ? { dialects } : {}),
      ...(unary ? { unary } : {}),
      ...(x402 ? { x402 } : {}),
      slowStreams,
      ...(sustained ? { sustained } : {}),
      comparison,
      targets,
      problems,
    };
    await mkdir(join(settings.output, ".."), { recursive: true });
    await writeFile(settings.output, `${JSON.stringify(report, null, 2)}\n`);
    process.stdout.write(`\n${formatReport(report)}\n`);
    log(`results written to ${settings.output}`);
    return allPassed(targets) ? 0 : 1;
  } catch (error) {
    log(`setup or measurement failed: ${(error as Error).stack ?? String(error)}`);
    return 2;
  } finally {
    clearTimeout(watchdog);
    log("stopping everything and dropping the database");
    await cleanup();
  }
}

process.exitCode = await main();
