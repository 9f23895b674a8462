import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import { availableParallelism, cpus, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { buildIfStale } from "../scripts/build.mjs";
import { agentBody, agentConversation } from "./lib/agent-texts.js";
import { seedAgentModels, type AgentMarket } from "./lib/agent-market.js";
import { monotonicMicros, type PhaseWindow, type PhasesFile } from "./lib/layers.js";
import {
  chatPath,
  load,
  percentiles,
  type LoadResult,
  type Percentiles,
  type Target,
} from "./lib/measure.js";
import { createPgCpuProbe, type PgCpuProbe } from "./lib/pg-cpu.js";
import { killAllChildrenSync, startChild, type ChildHandle } from "./lib/processes.js";
import {
  authorizeBenchKey,
  createBenchApiKey,
  createBenchDatabase,
  onboardOffers,
  seedBenchMarket,
  startAnvil,
} from "./lib/setup.js";
import { baseEnv, intSetting, readCommonSettings } from "./lib/settings.js";
import { memoryOf, type MemorySample } from "./lib/streams.js";
import { sustainedLoad, type SustainedFigures } from "./lib/sustained.js";

/**
 * `npm run bench:agent` (issue 35, "The meter at line rate"): what the meter costs where it is
 * hardest, side by side with the bare proxy on the same fake upstream, all started here as
 * `npm run bench` starts them (real PostgreSQL, anvil, the gateway's production build):
 *
 * 1. memory at rest: once set up (every offer onboarded), and after the first request of a model
 *    of every embedded tokenizer (llama3, llama3.1, qwen3, gemma3, deepseek-v3, gpt-oss), each
 *    after a full GC; each model's first request is timed (a load on the request path shows);
 * 2. the agent's prompt (about 8,000 tokens, history repeated, last turn new), JSON and SSE:
 *    unloaded latency and load, req/s of the proxy's on the same bodies, gateway CPU and
 *    PostgreSQL CPU per request;
 * 3. the meter's hard answers, Chinese without a space (SSE) and compact JSON (JSON), with the
 *    "hi" request's small answers in the same run: the gateway's CPU per request above the small
 *    answer's, per 1,000 answer tokens, bounds the counting's CPU per 1,000 new tokens;
 * 4. sustained: the agent's JSON at load for BENCH_AGENT_SUSTAINED_SECONDS in 20 s windows;
 * 5. `npm start`'s gateway (`node dist/src/cli/main.js dev`, PGlite in its process): RSS at rest
 *    after its first request.
 *
 * Talks to the gateway over HTTP only. See bench/README.md, "The agent and the meter".
 */

const windowSeconds = 20;
const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));

/**
 * Tokens of the fake upstream's answers for Qwen 3 (demo-chat's tokenizer), counted once with
 * `@huggingface/tokenizers` on Qwen 3's pinned tokenizer.json (the texts are seeded, so fixed):
 * the agent's prompt is about 7,760 tokens (59 of them the new last turn).
 */
const answerTokens = {
  cjk: 976,
  prose: 993,
  json: 2566,
  hiJson: 6,
  hiSse: 50,
  agentPrompt: 7760,
  hiPrompt: 9,
} as const;

function log(message: string): void {
  process.stderr.write(`[bench:agent] ${message}\n`);
}

interface Settings {
  readonly serverUrl: string;
  readonly seconds: number;
  readonly warmupSeconds: number;
  readonly connections: number;
  readonly unloadedRequests: number;
  readonly sustainedSeconds: number;
  readonly npmStart: boolean;
  readonly output: string;
  readonly profileDir: string | undefined;
}

function readSettings(): Settings {
  const common = readCommonSettings();
  const sustainedSeconds = intSetting("BENCH_AGENT_SUSTAINED_SECONDS", 60, 0, 3600);
  if (sustainedSeconds > 0 && sustainedSeconds < 2 * windowSeconds) {
    throw new Error(`BENCH_AGENT_SUSTAINED_SECONDS must be 0 or at least ${2 * windowSeconds}`);
  }
  return {
    serverUrl: common.serverUrl,
    seconds: common.seconds,
    warmupSeconds: common.warmupSeconds,
    connections: common.connections,
    unloadedRequests: intSetting("BENCH_AGENT_UNLOADED_REQUESTS", 60, 4, 2000),
    sustainedSeconds,
    npmStart: intSetting("BENCH_AGENT_NPM_START", 1, 0, 1) === 1,
    output: process.env.BENCH_OUTPUT || here("./results/agent-latest.json"),
    profileDir: process.env.BENCH_PROFILE_DIR || undefined,
  };
}

type Children = Record<"gateway" | "proxy" | "upstream", ChildHandle>;

interface Cpu {
  gatewayMsPerRequest?: number;
  proxyMsPerRequest?: number;
  upstreamMsPerRequest?: number;
  postgresMsPerRequest?: number;
  gatewayCores?: number;
}

async function cpuWindow(
  children: Children,
  probe: PgCpuProbe,
  run: () => Promise<LoadResult>,
): Promise<{ result: LoadResult; cpu: Cpu; window: PhaseWindow }> {
  const names = ["gateway", "proxy", "upstream"] as const;
  const [before, pgBefore] = await Promise.all([
    Promise.all(names.map((n) => children[n].stats())),
    probe.snapshot().catch(() => undefined),
  ]);
  const t0 = process.hrtime.bigint();
  const startUs = monotonicMicros();
  const result = await run();
  const endUs = monotonicMicros();
  const wallMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const [after, pgAfter] = await Promise.all([
    Promise.all(names.map((n) => children[n].stats())),
    probe.snapshot().catch(() => undefined),
  ]);
  const used = (i: number): number =>
    (after[i]!.cpu.user + after[i]!.cpu.system - before[i]!.cpu.user - before[i]!.cpu.system) /
    1000;
  const n = result.responses;
  const pg = pgBefore && pgAfter ? probe.between(pgBefore, pgAfter) : undefined;
  return {
    result,
    cpu: {
      ...(n > 0
        ? {
            gatewayMsPerRequest: used(0) / n,
            proxyMsPerRequest: used(1) / n,
            upstreamMsPerRequest: used(2) / n,
          }
        : {}),
      ...(pg && result.ok > 0 ? { postgresMsPerRequest: pg.cpuMs / result.ok } : {}),
      gatewayCores: used(0) / wallMs,
    },
    window: { name: "", startUs, endUs, gatewayCpuMs: used(0), requests: result.ok },
  };
}

/** One request, timed; the body kept (up to 256 KiB). */
function timed(
  target: Target,
  body: string,
  headers: Record<string, string>,
  agent?: http.Agent,
): Promise<{ status: number; ms: number; firstByteMs: number; body: string }> {
  return new Promise((resolve, reject) => {
    const start = process.hrtime.bigint();
    const ms = (): number => Number(process.hrtime.bigint() - start) / 1e6;
    const req = http.request(new URL(chatPath, target.url), {
      method: "POST",
      ...(agent ? { agent } : { agent: false }),
      headers: { ...headers, "content-length": Buffer.byteLength(body) },
      timeout: 60_000,
    });
    req.on("timeout", () => req.destroy(new Error("no answer within 60 s")));
    req.on("error", reject);
    req.on("response", (res) => {
      let firstByteMs: number | undefined;
      const kept: Buffer[] = [];
      let size = 0;
      res.on("data", (chunk: Buffer) => {
        firstByteMs ??= ms();
        if (size < 256 * 1024) kept.push(chunk);
        size += chunk.length;
      });
      res.on("error", reject);
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          ms: ms(),
          firstByteMs: firstByteMs ?? ms(),
          body: Buffer.concat(kept).toString("utf8"),
        }),
      );
    });
    req.end(body);
  });
}

/** What is wrong with an answer (status, JSON, or a stream ending in [DONE]), or undefined. */
function problemOf(answer: { status: number; body: string }, stream: boolean): string | undefined {
  if (answer.status !== 200) return `HTTP ${answer.status}: ${answer.body.slice(0, 300)}`;
  if (stream) return answer.body.trimEnd().endsWith("data: [DONE]") ? undefined : "no [DONE]";
  try {
    const parsed = JSON.parse(answer.body) as { choices?: unknown };
    return Array.isArray(parsed.choices) ? undefined : "no choices";
  } catch {
    return "not JSON";
  }
}

/**
 * The `usage` (and `x_gateway`) the gateway's answer shows: what it charged and counted (a JSON
 * answer's, or the last SSE event that has one).
 */
function usageOf(body: string, stream: boolean): unknown {
  const pick = (text: string): unknown => {
    try {
      const parsed = JSON.parse(text) as { usage?: unknown; x_gateway?: unknown };
      return parsed.usage === undefined && parsed.x_gateway === undefined
        ? undefined
        : { usage: parsed.usage, x_gateway: parsed.x_gateway };
    } catch {
      return undefined;
    }
  };
  if (!stream) return pick(body);
  const events = body.split(/\r?\n\r?\n/).map((e) => e.replace(/^data: ?/, "").trim());
  for (const event of events.reverse()) {
    const found = event.includes('"usage"') ? pick(event) : undefined;
    if (found !== undefined) return found;
  }
  return undefined;
}

/** `npm start`'s gateway at rest after its first request: RSS from /proc (no IPC there). */
async function npmStartAtRest(root: string): Promise<Record<string, unknown>> {
  const stateDir = await mkdtemp(join(tmpdir(), "gw-bench-dev-"));
  const child = spawn(process.execPath, [join(root, "dist/src/cli/main.js"), "dev"], {
    cwd: root,
    env: { ...baseEnv(), PORT: "0", GATEWAY_STATE_DIR: stateDir, LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const pid = child.pid!;
  let out = "";
  let err = "";
  child.stdout.on("data", (c: Buffer) => (out += c.toString("utf8")));
  child.stderr.on("data", (c: Buffer) => (err = (err + c.toString("utf8")).slice(-4000)));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const rss = (): { rssMB: number; hwmMB: number } => {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = (key: string): number => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)?.[1]);
    return { rssMB: (kb("VmRSS") * 1024) / 1e6, hwmMB: (kb("VmHWM") * 1024) / 1e6 };
  };
  try {
    const t0 = Date.now();
    let manifestPath: string | undefined;
    while (Date.now() - t0 < 180_000 && manifestPath === undefined) {
      manifestPath = /Manifest: (\S+)/.exec(out)?.[1];
      if (child.exitCode !== null) throw new Error(`npm start's gateway exited: ${err}`);
      await sleep(200);
    }
    if (manifestPath === undefined) throw new Error(`npm start's gateway not ready: ${err}`);
    const readyMs = Date.now() - t0;
    await sleep(2_000);
    const atReady = rss();
    const manifest = JSON.parse(await readFile(manifestPath, "utf8")) as {
      baseUrl: string;
      apiKey: string;
      permitId: string;
      models: { id: string }[];
    };
    const first = await timed(
      { name: "gateway", url: manifest.baseUrl, headers: {} },
      JSON.stringify({
        model: manifest.models[0]!.id,
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 64,
      }),
      {
        authorization: `Bearer ${manifest.apiKey}`,
        "x-gateway-permit": manifest.permitId,
        "content-type": "application/json",
      },
    );
    const samples: number[] = [];
    for (let i = 0; i < 10; i++) {
      await sleep(1_000);
      samples.push(rss().rssMB);
    }
    return {
      readyMs,
      rssAtReadyMB: atReady.rssMB,
      firstRequest: { status: first.status, ms: first.ms },
      rssAtRestMB: samples[samples.length - 1],
      rssAtRestMinMaxMB: [Math.min(...samples), Math.max(...samples)],
      peakRssMB: rss().hwmMB,
    };
  } finally {
    if (child.exitCode === null) {
      process.kill(pid, "SIGTERM");
      const timer = setTimeout(
        () => child.exitCode === null && process.kill(pid, "SIGKILL"),
        15_000,
      );
      await exited;
      clearTimeout(timer);
    }
    await rm(stateDir, { recursive: true, force: true });
  }
}

const mb = (bytes: number): string => (bytes / 1e6).toFixed(1);
const f = (v: number | undefined, digits = 3): string =>
  v === undefined ? "n/a" : v.toFixed(digits);

async function main(): Promise<number> {
  const settings = readSettings();
  const startedAt = new Date();
  const cleanups: { what: string; run: () => Promise<void> }[] = [];
  const cleanup = async (): Promise<void> => {
    for (const step of cleanups.reverse()) {
      try {
        await step.run();
      } catch (error) {
        log(`cleanup: ${step.what} failed: ${(error as Error).message}`);
      }
    }
    cleanups.length = 0;
  };
  let stopping = false;
  const onSignal = (code: number) => (): void => {
    if (stopping) return;
    stopping = true;
    log("signal: stopping everything");
    void cleanup().finally(() => {
      killAllChildrenSync();
      process.exit(code);
    });
  };
  process.once("SIGINT", onSignal(130));
  process.once("SIGTERM", onSignal(143));
  process.on("exit", killAllChildrenSync);

  const problems: string[] = [];
  const report: Record<string, unknown> = {
    startedAt: startedAt.toISOString(),
    machine: {
      cpus: availableParallelism(),
      cpuModel: cpus()[0]?.model,
      memoryGB: totalmem() / 1e9,
      node: process.version,
    },
    settings: { ...settings, answerTokens },
    problems,
  };
  try {
    if (buildIfStale()) log("built dist/");
    const db = await createBenchDatabase(settings.serverUrl);
    cleanups.push({ what: `dropping ${db.name}`, run: () => db.drop() });
    log(`database ${db.name}; starting anvil and seeding the market`);
    const anvil = await startAnvil({ chainId: 31337 });
    cleanups.push({ what: "stopping anvil", run: () => anvil.stop() });
    const maxConcurrency = Math.max(256, 4 * settings.connections);
    const deposit = 1_000_000n * 10n ** 18n;
    const market = await seedBenchMarket(anvil, { maxConcurrency, deposit });
    const agentMarket: AgentMarket = await seedAgentModels(market, { maxConcurrency, deposit });
    const dir = await mkdtemp(join(tmpdir(), "gw-bench-agent-"));
    cleanups.push({
      what: `removing ${dir}`,
      run: () => rm(dir, { recursive: true, force: true }),
    });
    const catalogFile = join(dir, "catalog.json");
    await writeFile(catalogFile, `${JSON.stringify({ models: agentMarket.catalog }, null, 2)}\n`);

    const upstream = await startChild(
      "upstream",
      "upstream.ts",
      {
        ...baseEnv(),
        HOST: "127.0.0.1",
        PORT: "0",
        BENCH_MODELS: agentMarket.catalog.map((c) => c.id).join(","),
      },
      30_000,
    );
    cleanups.push({ what: "stopping the upstream", run: () => upstream.stop() });
    const proxy = await startChild(
      "proxy",
      "proxy.ts",
      { ...baseEnv(), HOST: "127.0.0.1", PORT: "0", UPSTREAM_URL: upstream.url },
      30_000,
    );
    cleanups.push({ what: "stopping the proxy", run: () => proxy.stop() });
    const gatewayArgs = [
      "--expose-gc",
      ...(settings.profileDir ? ["--cpu-prof", `--cpu-prof-dir=${settings.profileDir}`] : []),
    ];
    const gatewayStarted = Date.now();
    const gateway = await startChild(
      "gateway",
      "../dist/bench/gateway.js",
      {
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
      },
      120_000,
      gatewayArgs,
    );
    cleanups.push({ what: "stopping the gateway", run: () => gateway.stop() });
    const gatewayReadyMs = Date.now() - gatewayStarted;
    const children: Children = { gateway, proxy, upstream };
    log(`gateway ${gateway.url} ready in ${gatewayReadyMs} ms; onboarding the offers`);
    const probe = await createPgCpuProbe(settings.serverUrl, db.name);
    cleanups.push({ what: "closing the PostgreSQL probe", run: () => probe.close() });
    const apiKey = await createBenchApiKey(db.url);
    const onboardStarted = Date.now();
    // Retried: a gateway may still be loading a model's tokenizer when its offer is verified.
    let onboarded = 0;
    for (let attempt = 1; ; attempt++) {
      try {
        onboarded = await onboardOffers(
          { ...market, demo: { ...market.demo, offers: agentMarket.offers } },
          { baseUrl: gateway.url, apiKey },
          upstream.url,
        );
        break;
      } catch (error) {
        if (attempt >= 4) throw error;
        log(`onboarding failed (${(error as Error).message.slice(0, 200)}); again in 5 s`);
        await sleep(5_000);
      }
    }
    await authorizeBenchKey(market, { baseUrl: gateway.url, apiKey });
    // GET /ready 200 before the first requests (a gateway may say there what is still loading).
    let readyAnswer = "";
    for (const until = Date.now() + 60_000; Date.now() < until; await sleep(250)) {
      const answer = await fetch(new URL("/ready", gateway.url)).catch(() => undefined);
      readyAnswer = answer
        ? `${answer.status} ${(await answer.text()).slice(0, 300)}`
        : "no answer";
      if (answer?.status === 200) break;
    }
    if (!readyAnswer.startsWith("200")) problems.push(`GET /ready: ${readyAnswer} after 60 s`);
    const onboardMs = Date.now() - onboardStarted;
    log(`${onboarded} offers onboarded in ${onboardMs} ms`);

    // ------------------------------------------------------------ memory at rest
    const restMemory = async (): Promise<MemorySample> => {
      await sleep(2_000);
      await gateway.stats(true);
      return memoryOf(await gateway.stats(true));
    };
    const memory: Record<string, MemorySample> = {
      proxyAtRest: memoryOf(await proxy.stats()),
      gatewayAfterSetup: await restMemory(),
    };
    const headersFor = (permitId: string): Record<string, string> => ({
      authorization: `Bearer ${apiKey}`,
      "x-gateway-permit": permitId,
      "content-type": "application/json",
    });
    const firstRequests: Record<string, unknown>[] = [];
    for (const model of agentMarket.models) {
      const gw: Target = { name: "gateway", url: gateway.url, headers: {} };
      const body = JSON.stringify({
        model: model.id,
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 64,
      });
      const first = await timed(gw, body, headersFor(model.permitId));
      const second = await timed(gw, body, headersFor(model.permitId));
      const problem = problemOf(first, false);
      if (problem) problems.push(`first request of ${model.id}: ${problem}`);
      firstRequests.push({
        model: model.id,
        tokenizer: model.tokenizer,
        status: first.status,
        firstMs: first.ms,
        secondMs: second.ms,
      });
      log(
        `first request ${model.id} (${model.tokenizer}): ${first.status} in ${first.ms.toFixed(1)} ms, then ${second.ms.toFixed(1)} ms`,
      );
    }
    memory.gatewayEveryTokenizer = await restMemory();
    report.startup = { gatewayReadyMs, onboardMs, firstRequests };
    report.memory = memory;
    log(
      `at rest: after setup ${mb(memory.gatewayAfterSetup!.rssBytes)} MB RSS / ${mb(memory.gatewayAfterSetup!.heapUsedBytes)} MB heap; ` +
        `every tokenizer ${mb(memory.gatewayEveryTokenizer.rssBytes)} / ${mb(memory.gatewayEveryTokenizer.heapUsedBytes)} MB`,
    );

    // ------------------------------------------------------------ scenarios
    const conversation = agentConversation();
    const headers = headersFor(market.permitId);
    const targets: Record<"proxy" | "gateway", Target> = {
      proxy: { name: "proxy", url: proxy.url, headers },
      gateway: { name: "gateway", url: gateway.url, headers },
    };
    let turn = 0;
    const agentRequest = (stream: boolean) => () =>
      agentBody(conversation, ++turn, {
        model: "demo-chat",
        stream,
        maxTokens: 64,
        user: "bench-agent",
      });
    const fixed = (user: string | undefined, stream: boolean, maxTokens: number) => {
      const body = JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: maxTokens,
        ...(user ? { user } : {}),
        ...(stream ? { stream: true } : {}),
      });
      return () => body;
    };
    const scenarios: { name: string; stream: boolean; body: () => string; expect?: RegExp }[] = [
      { name: "agent json", stream: false, body: agentRequest(false) },
      { name: "agent sse", stream: true, body: agentRequest(true) },
      // The answers' order keeps each hard answer next to its small one (JSON, then SSE).
      { name: "hi json", stream: false, body: fixed(undefined, false, 64) },
      {
        name: "compact-json json",
        stream: false,
        body: fixed("bench-json", false, 8192),
        expect: /SKU-/,
      },
      { name: "hi sse", stream: true, body: fixed(undefined, true, 64) },
      {
        name: "prose sse",
        stream: true,
        body: fixed("bench-prose", true, 8192),
        expect: /"content":"[A-Z][a-z]+ [a-z]+ [a-z]+/,
      },
      {
        name: "cjk sse",
        stream: true,
        body: fixed("bench-cjk", true, 8192),
        expect: /[\u4e00-\u9fff]{10}/,
      },
    ];
    const results: Record<string, Record<string, unknown>> = {};
    const phases: PhaseWindow[] = [];
    for (const scenario of scenarios) {
      const row: Record<string, unknown> = {};
      results[scenario.name] = row;
      // Preflight: one request each, checked.
      let measurable = true;
      for (const name of ["proxy", "gateway"] as const) {
        // The preflight's stream asks for usage, so the gateway shows what it charged.
        const body = scenario.stream
          ? JSON.stringify({
              ...(JSON.parse(scenario.body()) as object),
              stream_options: { include_usage: true },
            })
          : scenario.body();
        const answer = await timed(targets[name], body, headers);
        if (name === "gateway") row.gatewayUsage = usageOf(answer.body, scenario.stream);
        // A hard answer is the fake upstream's only if the request's "user" reached it.
        const problem =
          problemOf(answer, scenario.stream) ??
          (scenario.expect && !scenario.expect.test(answer.body)
            ? `not the ${scenario.name} answer (was the request's "user" forwarded?): ${answer.body.slice(0, 200)}`
            : undefined);
        if (problem) {
          problems.push(`${scenario.name} ${name}: preflight ${problem}`);
          measurable = false;
        }
      }
      if (!measurable) {
        log(`${scenario.name}: not measured (preflight failed)`);
        continue;
      }
      // Unloaded: sequential, one keep-alive connection per target, proxy and gateway in turns.
      const agents = {
        proxy: new http.Agent({ keepAlive: true, maxSockets: 1 }),
        gateway: new http.Agent({ keepAlive: true, maxSockets: 1 }),
      };
      const seen: Record<string, { total: number[]; first: number[] }> = {
        proxy: { total: [], first: [] },
        gateway: { total: [], first: [] },
      };
      const rounds = 4;
      const perRound = Math.ceil(settings.unloadedRequests / rounds);
      for (let round = -1; round < rounds; round++) {
        for (const name of ["proxy", "gateway"] as const) {
          for (let i = 0; i < (round < 0 ? 5 : perRound); i++) {
            const answer = await timed(targets[name], scenario.body(), headers, agents[name]);
            if (round < 0 || answer.status !== 200) continue;
            seen[name]!.total.push(answer.ms);
            seen[name]!.first.push(answer.firstByteMs);
          }
        }
      }
      agents.proxy.destroy();
      agents.gateway.destroy();
      const unloaded: Record<string, { totalMs?: Percentiles; firstByteMs?: Percentiles }> = {};
      for (const name of ["proxy", "gateway"]) {
        unloaded[name] = {
          ...(percentiles(seen[name]!.total) ? { totalMs: percentiles(seen[name]!.total)! } : {}),
          ...(percentiles(seen[name]!.first)
            ? { firstByteMs: percentiles(seen[name]!.first)! }
            : {}),
        };
      }
      row.unloaded = unloaded;
      // Load: proxy, then gateway.
      for (const name of ["proxy", "gateway"] as const) {
        const options = {
          connections: settings.connections,
          request: { path: chatPath, body: scenario.body },
        };
        if (settings.warmupSeconds > 0) {
          await load(targets[name], scenario.stream ? "sse" : "json", {
            ...options,
            seconds: settings.warmupSeconds,
          });
          await sleep(500);
        }
        const { result, cpu, window } = await cpuWindow(children, probe, () =>
          load(targets[name], scenario.stream ? "sse" : "json", {
            ...options,
            seconds: settings.seconds,
          }),
        );
        if (result.non2xx > 0 || result.errors > 0) {
          problems.push(
            `${scenario.name} ${name}: ${result.non2xx} non-2xx, ${result.errors} errors (${result.errorSamples.join(" | ")})`,
          );
        }
        row[name] = { ...result, cpu };
        if (name === "gateway" && settings.profileDir) {
          // For `npm run bench:layers -- <dir> --phase "agent json"` (the gateway's profile).
          phases.push({ ...window, name: scenario.name });
          const file: PhasesFile = { gatewayPid: gateway.pid, phases };
          await mkdir(settings.profileDir, { recursive: true });
          await writeFile(
            join(settings.profileDir, `bench-phases-${gateway.pid}.json`),
            `${JSON.stringify(file, null, 2)}\n`,
          );
        }
        log(
          `${scenario.name} ${name}: ${result.requestsPerSecond.toFixed(1)} req/s, ` +
            `CPU ${f(name === "gateway" ? cpu.gatewayMsPerRequest : cpu.proxyMsPerRequest)} ms/req, ` +
            `PG ${f(cpu.postgresMsPerRequest)} ms/req, p50 ${result.latencyMs.p50} ms`,
        );
        await sleep(1_000);
      }
    }
    report.scenarios = results;

    // ------------------------------------------------------------ sustained
    let sustained: SustainedFigures | undefined;
    if (settings.sustainedSeconds > 0 && results["agent json"]?.gateway) {
      log(`sustained: agent json, ${settings.sustainedSeconds} s in ${windowSeconds} s windows`);
      sustained = await sustainedLoad(targets.gateway, gateway, probe, {
        connections: settings.connections,
        seconds: settings.sustainedSeconds,
        windowSeconds,
        log,
        request: { path: chatPath, body: agentRequest(false) },
      });
      report.sustained = sustained;
    }
    memory.gatewayAfterLoad = await restMemory();

    // ------------------------------------------------------------ npm start
    await cleanup();
    if (settings.npmStart) {
      log("npm start's gateway (node dist/src/cli/main.js dev): RSS at rest after one request");
      try {
        report.npmStart = await npmStartAtRest(here(".."));
      } catch (error) {
        problems.push(`npm start: ${(error as Error).message.slice(0, 500)}`);
      }
    }
    report.finishedAt = new Date().toISOString();
    await mkdir(join(settings.output, ".."), { recursive: true });
    await writeFile(settings.output, `${JSON.stringify(report, null, 2)}\n`);
    process.stdout.write(`\n${formatAgentReport(report)}\n`);
    log(`results written to ${settings.output}`);
    return problems.length === 0 ? 0 : 1;
  } catch (error) {
    log(`failed: ${(error as Error).stack ?? String(error)}`);
    return 2;
  } finally {
    await cleanup();
  }
}

interface Row {
  requestsPerSecond: number;
  latencyMs: { p50: number };
  cpu: Cpu;
}

/** The report as text: the tables of bench/figures/issue-35-meter.md. */
function formatAgentReport(report: Record<string, unknown>): string {
  const lines: string[] = [];
  const scenarios = (report.scenarios ?? {}) as Record<
    string,
    {
      proxy?: Row;
      gateway?: Row;
      unloaded?: Record<string, { totalMs?: Percentiles; firstByteMs?: Percentiles }>;
    }
  >;
  lines.push(
    "scenario             proxy req/s  gateway req/s  ratio   gw CPU ms/req  proxy CPU ms/req  CPU x  PG ms/req  PG/proxy CPU  unloaded p50 proxy/gw ms (first byte)",
  );
  for (const [name, row] of Object.entries(scenarios)) {
    if (!row.proxy || !row.gateway) {
      lines.push(`${name.padEnd(20)} not measured`);
      continue;
    }
    const p = row.proxy;
    const g = row.gateway;
    const pCpu = p.cpu.proxyMsPerRequest;
    const gCpu = g.cpu.gatewayMsPerRequest;
    const u = row.unloaded ?? {};
    const stream = name.includes("sse");
    const pick = (t: string): number | undefined =>
      (stream ? u[t]?.firstByteMs : u[t]?.totalMs)?.p50;
    lines.push(
      `${name.padEnd(20)} ${p.requestsPerSecond.toFixed(1).padStart(11)}  ${g.requestsPerSecond.toFixed(1).padStart(13)}  ` +
        `${(g.requestsPerSecond / p.requestsPerSecond).toFixed(3).padStart(5)}   ${f(gCpu).padStart(13)}  ${f(pCpu).padStart(16)}  ` +
        `${(gCpu !== undefined && pCpu ? (gCpu / pCpu).toFixed(1) : "n/a").padStart(5)}  ${f(g.cpu.postgresMsPerRequest).padStart(9)}  ` +
        `${(g.cpu.postgresMsPerRequest !== undefined && pCpu ? (g.cpu.postgresMsPerRequest / pCpu).toFixed(2) : "n/a").padStart(12)}  ` +
        `${f(pick("proxy"), 2)} / ${f(pick("gateway"), 2)}${stream ? " (first byte)" : ""}`,
    );
  }
  lines.push("", "what the gateway's preflight answer shows (usage; x_gateway):");
  for (const [name, row] of Object.entries(scenarios)) {
    const shown = (row as { gatewayUsage?: unknown }).gatewayUsage;
    lines.push(`  ${name.padEnd(18)} ${JSON.stringify(shown ?? null).slice(0, 400)}`);
  }
  const tokens = (report.settings as { answerTokens: typeof answerTokens }).answerTokens;
  const perK = (hard: string, base: string, n: number, baseN: number): string => {
    const h = scenarios[hard]?.gateway?.cpu.gatewayMsPerRequest;
    const b = scenarios[base]?.gateway?.cpu.gatewayMsPerRequest;
    return h === undefined || b === undefined
      ? "n/a"
      : `${(((h - b) * 1000) / ((n - baseN) / 1000)).toFixed(0)} µs`;
  };
  lines.push(
    "",
    "gateway CPU above the small answer's, per 1,000 answer tokens (an upper bound of counting's):",
    `  English prose stream (${tokens.prose} tokens vs ${tokens.hiSse}): ${perK("prose sse", "hi sse", tokens.prose, tokens.hiSse)}; ` +
      `CJK stream (${tokens.cjk} vs ${tokens.hiSse}): ${perK("cjk sse", "hi sse", tokens.cjk, tokens.hiSse)}; ` +
      `compact JSON (${tokens.json} vs ${tokens.hiJson}): ${perK("compact-json json", "hi json", tokens.json, tokens.hiJson)}`,
    "the same for the agent's prompt, per 1,000 prompt tokens (all but about 60 repeated):",
    `  JSON: ${perK("agent json", "hi json", tokens.agentPrompt, tokens.hiPrompt)}; SSE: ${perK("agent sse", "hi sse", tokens.agentPrompt, tokens.hiPrompt)}`,
  );
  const memory = (report.memory ?? {}) as Record<string, MemorySample | undefined>;
  lines.push("", "memory at rest (after a full GC)      RSS MB   heap used MB   external MB");
  for (const [name, m] of Object.entries(memory)) {
    if (m) {
      lines.push(
        `  ${name.padEnd(34)} ${mb(m.rssBytes).padStart(6)}  ${mb(m.heapUsedBytes).padStart(13)}  ${mb(m.externalBytes).padStart(12)}`,
      );
    }
  }
  const startup = report.startup as
    | { gatewayReadyMs: number; onboardMs: number; firstRequests: Record<string, unknown>[] }
    | undefined;
  if (startup) {
    lines.push(
      "",
      `gateway ready in ${startup.gatewayReadyMs} ms; offers onboarded (verified), key authorized and GET /ready 200 in ${startup.onboardMs} ms`,
      "first request of each model (then the second), ms:",
    );
    for (const r of startup.firstRequests) {
      lines.push(
        `  ${String(r.model).padEnd(20)} ${String(r.tokenizer).padEnd(12)} HTTP ${String(r.status)}  ${f(r.firstMs as number, 1).padStart(8)}  ${f(r.secondMs as number, 1).padStart(8)}`,
      );
    }
  }
  const sustained = report.sustained as SustainedFigures | undefined;
  if (sustained) {
    lines.push("", "sustained agent JSON: window  req/s  gw CPU ms/req  PG ms/req");
    for (const w of sustained.windows) {
      lines.push(
        `  ${String(w.index).padStart(5)}  ${w.requestsPerSecond.toFixed(1).padStart(6)}  ${f(w.gatewayCpuMsPerRequest).padStart(13)}  ${f(w.postgresMsPerRequest).padStart(9)}`,
      );
    }
  }
  if (report.npmStart) lines.push("", `npm start: ${JSON.stringify(report.npmStart)}`);
  const problems = report.problems as string[];
  if (problems.length > 0) lines.push("", "Problems:", ...problems.map((p) => `  - ${p}`));
  return lines.join("\n");
}

process.exitCode = await main();
