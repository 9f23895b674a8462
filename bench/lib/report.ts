import type { LoadResult, Percentiles, Preflight, Scenario } from "./measure.js";
import type { X402Figures } from "./x402-phase.js";
import type { PgCpuFigures } from "./pg-cpu.js";
import type { BurstResult, MemorySample } from "./streams.js";
import type { SustainedFigures, SustainedWindow } from "./sustained.js";

/** The targets (issue 11, tightened by issue 21: sustained drift, the burst's first byte). */
export const targets = {
  /** JSON throughput of the gateway at load, fresh database, as a fraction of the proxy's. */
  minJsonThroughputRatio: 0.35,
  /** Sustained JSON load: the last window's req/s within this fraction of the first window's. */
  maxSustainedDrift: 0.1,
  /** SSE (20 chunks) throughput of the gateway at load, as a fraction of the proxy's. */
  minSseThroughputRatio: 0.3,
  /** Unloaded (one connection) p50 added latency, ms, for JSON and for time to first SSE byte. */
  maxAddedLatencyMs: 0.5,
  /** PostgreSQL CPU (the bench database's backends) per 2xx answer, ms. */
  maxPostgresCpuMsPerRequest: 0.15,
  /** Peak RSS of the gateway while it serves the slow streams, bytes (200 MB, 10^6 bytes each). */
  maxSlowStreamsPeakRssBytes: 200_000_000,
  /** First byte p50 of the slow-stream burst through the gateway, as a multiple of the proxy's. */
  maxSlowFirstByteRatio: 10,
} as const;

export type TargetName = "gateway" | "proxy";

/** Per process, per measured window: CPU time (user + system) per request, ms. */
export interface CpuFigures {
  readonly gatewayMsPerRequest?: number;
  readonly proxyMsPerRequest?: number;
  readonly upstreamMsPerRequest?: number;
  /** The bench database's PostgreSQL backends, per 2xx answer (see pg-cpu.ts). */
  readonly postgresMsPerRequest?: number;
  readonly postgres?: PgCpuFigures;
  /** CPU share of the window each process used, in cores (1.0 = one core busy). */
  readonly cores: Partial<Record<"gateway" | "proxy" | "upstream" | "postgres", number>>;
}

export interface LoadPhase extends LoadResult {
  readonly cpu: CpuFigures;
}

export interface UnloadedFigures {
  readonly requests: number;
  readonly statusCodes: Record<string, number>;
  readonly failures: string[];
  /** Request written to the last body byte. */
  readonly totalMs?: Percentiles;
  /** Request written to the first body byte (for SSE: the first SSE byte). */
  readonly firstByteMs?: Percentiles;
  /** Request written to the response headers. */
  readonly headersMs?: Percentiles;
}

/** REPORTED: a figure without a target; SKIPPED: its phase was turned off (exit status 0). */
export type Verdict = "PASS" | "FAIL" | "NOT MEASURED" | "REPORTED" | "SKIPPED";

export interface TargetCheck {
  readonly name: string;
  readonly target: string;
  readonly value: string;
  readonly verdict: Verdict;
  readonly why?: string;
}

export interface BenchReport {
  readonly version: 2;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly machine: { cpus: number; node: string; platform: string };
  readonly settings: {
    seconds: number;
    warmupSeconds: number;
    connections: number;
    unloadedRequests: number;
    /** Connections of the second SSE phase (0: skipped). */
    wideConnections: number;
    /** Seconds of the sustained phase (0: skipped), and of each of its windows. */
    sustainedSeconds: number;
    sustainedWindowSeconds: number;
    /** Slow streams opened at once (0: skipped), within `slowStartMs`, each `slowStreamSeconds` long. */
    slowStreams: number;
    slowStartMs: number;
    slowStreamSeconds: number;
    /** Seconds of the unary phase (0: skipped; absent in reports made before it existed). */
    unarySeconds?: number;
    /** Requests per path of the x402 phase (0: skipped; absent in reports made before it). */
    x402Requests?: number;
    offerMaxConcurrency: number;
    permitDeposit: string;
    request: string;
  };
  readonly setupSeconds: number;
  /** Memory of the gateway and the proxy once set up, before any measured request. */
  readonly memoryAfterSetup: Partial<Record<TargetName, MemorySample>>;
  /** How PostgreSQL's CPU was read; `unavailable` says why it was not. */
  readonly postgresCpu: { clockTicksPerSecond: number; unavailable?: string; note?: string };
  readonly preflight: Record<TargetName, Partial<Record<Scenario, Preflight>>>;
  readonly unloaded: Record<TargetName, Partial<Record<Scenario, UnloadedFigures>>>;
  /** The dialect routes' load phases (gateway only, at `connections`), when measured. */
  readonly dialects?: Partial<
    Record<"responses" | "messages", Partial<Record<Scenario, LoadPhase>>>
  >;
  /** The unary phase, `POST /v1/quotes` on the gateway at `connections`, when measured. */
  readonly unary?: LoadPhase;
  /** An x402-paid JSON request beside a permit's (issue 37), sequential; absent when skipped. */
  readonly x402?: X402Figures;
  /** The fresh load phases, at `connections`. */
  readonly load: Record<TargetName, Partial<Record<Scenario, LoadPhase>>>;
  /** SSE at `wideConnections`. */
  readonly loadWide: Partial<Record<TargetName, LoadPhase>>;
  readonly slowStreams: Partial<Record<TargetName, BurstResult>>;
  /** Absent when skipped (`BENCH_SUSTAINED_SECONDS=0`) or not reached. */
  readonly sustained?: SustainedFigures;
  readonly comparison: {
    throughputRatio: Partial<Record<Scenario, number>>;
    /** SSE at `wideConnections`, gateway / proxy. */
    wideSseThroughputRatio?: number;
    /** Gateway p50 − proxy p50, unloaded, ms. */
    addedLatencyMs: { json?: number; sseFirstByte?: number };
    /** Gateway p50 − proxy p50 at load, ms. */
    addedLoadedLatencyMs: Partial<Record<Scenario, number>>;
    /** The sustained phase's req/s over all windows / the proxy's fresh JSON req/s. */
    sustainedThroughputRatio?: number;
    /** (last full window − first window) / first window, req/s. */
    sustainedChange?: number;
    /** Slow streams, first byte p50, gateway / proxy. */
    slowFirstByteRatio?: number;
  };
  readonly targets: TargetCheck[];
  readonly problems: string[];
}

// ------------------------------------------------------------------ verdicts

function phaseClean(phase: LoadResult | undefined): string | undefined {
  if (!phase) return "not measured";
  if (phase.non2xx > 0 || phase.errors > 0) {
    return `${phase.non2xx} non-2xx and ${phase.errors} errors during the load`;
  }
  return undefined;
}

function unloadedClean(figures: UnloadedFigures | undefined): string | undefined {
  if (!figures) return "not measured";
  const bad = Object.entries(figures.statusCodes)
    .filter(([code]) => !code.startsWith("2"))
    .reduce((sum, [, n]) => sum + n, 0);
  if (bad > 0 || figures.failures.length > 0) {
    return `${bad} non-2xx and ${figures.failures.length} failed requests`;
  }
  return undefined;
}

function burstClean(name: TargetName, burst: BurstResult | undefined): string | undefined {
  if (!burst) return `${name}: not measured`;
  if (burst.complete < burst.streams) {
    return `${name}: ${burst.complete} of ${burst.streams} streams complete (${burst.errorSamples[0] ?? "?"})`;
  }
  return undefined;
}

/** The windows the sustained target compares: the first, and the last full one. */
export function sustainedEnds(
  sustained: SustainedFigures | undefined,
): { first: SustainedWindow; last: SustainedWindow } | undefined {
  const full = sustained?.windows.filter((w) => !w.partial) ?? [];
  if (full.length < 2) return undefined;
  return { first: full[0]!, last: full[full.length - 1]! };
}

const pct = (v: number | undefined, digits = 1): string =>
  v === undefined ? "-" : `${(v * 100).toFixed(digits)}%`;
const mb = (bytes: number | undefined): string =>
  bytes === undefined ? "-" : `${(bytes / 1e6).toFixed(1)} MB`;

export function compare(
  report: Pick<
    BenchReport,
    | "load"
    | "loadWide"
    | "unloaded"
    | "preflight"
    | "slowStreams"
    | "sustained"
    | "settings"
    | "postgresCpu"
  >,
): Pick<BenchReport, "comparison" | "targets"> {
  const { load, unloaded, preflight, settings } = report;
  const refused = (scenario: Scenario): string | undefined => {
    for (const target of ["gateway", "proxy"] as const) {
      const p = preflight[target][scenario];
      if (p && !p.ok) return `${target} preflight: ${p.detail}`;
    }
    return undefined;
  };
  const throughputRatio: Partial<Record<Scenario, number>> = {};
  const addedLoadedLatencyMs: Partial<Record<Scenario, number>> = {};
  for (const scenario of ["json", "sse"] as const) {
    const g = load.gateway[scenario];
    const p = load.proxy[scenario];
    if (g && p && p.requestsPerSecond > 0) {
      throughputRatio[scenario] = g.requestsPerSecond / p.requestsPerSecond;
      if (g.ok > 0 && p.ok > 0) addedLoadedLatencyMs[scenario] = g.latencyMs.p50 - p.latencyMs.p50;
    }
  }
  const gWide = report.loadWide.gateway;
  const pWide = report.loadWide.proxy;
  const wideSseThroughputRatio =
    gWide && pWide && pWide.requestsPerSecond > 0
      ? gWide.requestsPerSecond / pWide.requestsPerSecond
      : undefined;
  const gJson = unloaded.gateway.json?.totalMs;
  const pJson = unloaded.proxy.json?.totalMs;
  const gSse = unloaded.gateway.sse?.firstByteMs;
  const pSse = unloaded.proxy.sse?.firstByteMs;
  const addedLatencyMs = {
    ...(gJson && pJson ? { json: gJson.p50 - pJson.p50 } : {}),
    ...(gSse && pSse ? { sseFirstByte: gSse.p50 - pSse.p50 } : {}),
  };
  const addedP99LatencyMs = {
    ...(gJson && pJson ? { json: gJson.p99 - pJson.p99 } : {}),
    ...(gSse && pSse ? { sseFirstByte: gSse.p99 - pSse.p99 } : {}),
  };
  const sustained = report.sustained;
  const ends = sustainedEnds(sustained);
  const sustainedChange =
    ends && ends.first.requestsPerSecond > 0
      ? ends.last.requestsPerSecond / ends.first.requestsPerSecond - 1
      : undefined;
  const proxyJson = load.proxy.json?.requestsPerSecond;
  const sustainedThroughputRatio =
    sustained && proxyJson ? sustained.requestsPerSecond / proxyJson : undefined;
  const gSlow = report.slowStreams.gateway;
  const pSlow = report.slowStreams.proxy;
  const slowFirstByteRatio =
    gSlow?.firstByteMs && pSlow?.firstByteMs && pSlow.firstByteMs.p50 > 0
      ? gSlow.firstByteMs.p50 / pSlow.firstByteMs.p50
      : undefined;

  const checks: TargetCheck[] = [];
  const c = settings.connections;
  {
    const why = refused("json") ?? phaseClean(load.gateway.json) ?? phaseClean(load.proxy.json);
    const ratio = throughputRatio.json;
    checks.push({
      name: `JSON throughput, ${c} connections (fresh), of the proxy's`,
      target: `>= ${(targets.minJsonThroughputRatio * 100).toFixed(0)}%`,
      value: pct(ratio),
      ...verdict(ratio, (r) => r >= targets.minJsonThroughputRatio, why),
    });
  }
  {
    const name = `sustained JSON, ${c} connections, one database: last ${settings.sustainedWindowSeconds} s window vs first`;
    const target = `within ${(targets.maxSustainedDrift * 100).toFixed(0)}%`;
    if (settings.sustainedSeconds === 0) {
      checks.push({ name, target, value: "skipped", verdict: "SKIPPED" });
    } else {
      const why =
        sustained === undefined
          ? "not measured"
          : ends === undefined
            ? `needs two full ${settings.sustainedWindowSeconds} s windows`
            : sustained.load.non2xx > 0 || sustained.load.errors > 0
              ? `${sustained.load.non2xx} non-2xx and ${sustained.load.errors} errors during the load`
              : undefined;
      const value =
        ends && sustainedChange !== undefined
          ? `${ends.first.requestsPerSecond.toFixed(0)} -> ${ends.last.requestsPerSecond.toFixed(0)} req/s (${sustainedChange >= 0 ? "+" : ""}${pct(sustainedChange)}; ${pct(sustainedThroughputRatio)} of proxy)`
          : "-";
      checks.push({
        name,
        target,
        value,
        ...verdict(sustainedChange, (v) => Math.abs(v) <= targets.maxSustainedDrift, why),
      });
    }
  }
  {
    const why = refused("sse") ?? phaseClean(load.gateway.sse) ?? phaseClean(load.proxy.sse);
    const ratio = throughputRatio.sse;
    checks.push({
      name: `SSE (20 chunks) throughput, ${c} connections, of the proxy's`,
      target: `>= ${(targets.minSseThroughputRatio * 100).toFixed(0)}%`,
      value: pct(ratio),
      ...verdict(ratio, (r) => r >= targets.minSseThroughputRatio, why),
    });
  }
  {
    const name = `SSE (20 chunks) throughput, ${settings.wideConnections || "more"} connections, of the proxy's`;
    if (settings.wideConnections === 0) {
      checks.push({ name, target: "reported", value: "skipped", verdict: "SKIPPED" });
    } else {
      const why = refused("sse") ?? phaseClean(gWide) ?? phaseClean(pWide);
      checks.push({
        name,
        target: "reported",
        value:
          wideSseThroughputRatio === undefined
            ? "-"
            : `${pct(wideSseThroughputRatio)} (${gWide!.requestsPerSecond.toFixed(0)} / ${pWide!.requestsPerSecond.toFixed(0)} req/s)`,
        ...(wideSseThroughputRatio === undefined
          ? { verdict: "NOT MEASURED" as const, why: why ?? "not measured" }
          : why === undefined
            ? { verdict: "REPORTED" as const }
            : { verdict: "FAIL" as const, why }),
      });
    }
  }
  {
    const why =
      refused("json") ?? unloadedClean(unloaded.gateway.json) ?? unloadedClean(unloaded.proxy.json);
    checks.push({
      name: "added unloaded p50, JSON (1 connection)",
      target: `<= ${targets.maxAddedLatencyMs} ms`,
      value: addedLatencyMs.json === undefined ? "-" : `${addedLatencyMs.json.toFixed(3)} ms`,
      ...verdict(addedLatencyMs.json, (v) => v <= targets.maxAddedLatencyMs, why),
    });
  }
  {
    const why =
      refused("sse") ?? unloadedClean(unloaded.gateway.sse) ?? unloadedClean(unloaded.proxy.sse);
    checks.push({
      name: "added unloaded p50, first SSE byte (1 connection)",
      target: `<= ${targets.maxAddedLatencyMs} ms`,
      value:
        addedLatencyMs.sseFirstByte === undefined
          ? "-"
          : `${addedLatencyMs.sseFirstByte.toFixed(3)} ms`,
      ...verdict(addedLatencyMs.sseFirstByte, (v) => v <= targets.maxAddedLatencyMs, why),
    });
  }
  {
    const ms = (v: number | undefined): string => (v === undefined ? "-" : `${v.toFixed(3)} ms`);
    checks.push({
      name: "added unloaded p99, JSON / first SSE byte (1 connection)",
      target: "reported",
      value: `${ms(addedP99LatencyMs.json)} / ${ms(addedP99LatencyMs.sseFirstByte)}`,
      verdict: "REPORTED",
    });
  }
  const pgTarget = `<= ${targets.maxPostgresCpuMsPerRequest} ms`;
  const pgValue = (v: number | undefined): string =>
    v === undefined ? "n/a" : `${v.toFixed(4)} ms`;
  {
    const phase = load.gateway.json;
    const v = phase?.cpu.postgresMsPerRequest;
    const why =
      report.postgresCpu.unavailable ??
      refused("json") ??
      phaseClean(phase) ??
      (v === undefined ? "no reading" : undefined);
    checks.push({
      name: `PostgreSQL CPU per request, fresh JSON load (${c} connections)`,
      target: pgTarget,
      value: pgValue(v),
      ...verdict(v, (x) => x <= targets.maxPostgresCpuMsPerRequest, why),
    });
  }
  {
    const name = "PostgreSQL CPU per request, last window of the sustained phase";
    if (settings.sustainedSeconds === 0) {
      checks.push({ name, target: pgTarget, value: "skipped", verdict: "SKIPPED" });
    } else {
      const last = ends?.last ?? sustained?.windows.at(-1);
      const v = last?.postgresMsPerRequest;
      const why =
        report.postgresCpu.unavailable ??
        sustained?.postgresUnavailable ??
        (sustained === undefined ? "not measured" : undefined) ??
        (last && last.non2xx > 0 ? `${last.non2xx} non-2xx in the window` : undefined) ??
        (v === undefined ? "no reading" : undefined);
      checks.push({
        name,
        target: pgTarget,
        value: pgValue(v),
        ...verdict(v, (x) => x <= targets.maxPostgresCpuMsPerRequest, why),
      });
    }
  }
  {
    const streams =
      settings.slowStreams === 0 ? "many" : settings.slowStreams.toLocaleString("en-US");
    const name = `${streams} concurrent slow streams: peak RSS of the gateway`;
    const target = `<= ${mb(targets.maxSlowStreamsPeakRssBytes)}`;
    if (settings.slowStreams === 0) {
      checks.push({ name, target, value: "skipped", verdict: "SKIPPED" });
    } else {
      const v = gSlow?.memory.peak.rssBytes;
      const why = burstClean("gateway", gSlow);
      checks.push({
        name,
        target,
        value: `${mb(v)} (proxy ${mb(pSlow?.memory.peak.rssBytes)})`,
        ...verdict(v, (x) => x <= targets.maxSlowStreamsPeakRssBytes, why),
      });
    }
  }
  {
    const streams =
      settings.slowStreams === 0 ? "many" : settings.slowStreams.toLocaleString("en-US");
    const name = `${streams} streams started within ${settings.slowStartMs / 1000} s: first byte p50, of the proxy's`;
    const target = `<= ${targets.maxSlowFirstByteRatio} x`;
    if (settings.slowStreams === 0) {
      checks.push({ name, target, value: "skipped", verdict: "SKIPPED" });
    } else {
      const why = refused("sse") ?? burstClean("gateway", gSlow) ?? burstClean("proxy", pSlow);
      checks.push({
        name,
        target,
        value:
          slowFirstByteRatio === undefined
            ? "-"
            : `${slowFirstByteRatio.toFixed(2)} x (${gSlow!.firstByteMs!.p50.toFixed(1)} / ${pSlow!.firstByteMs!.p50.toFixed(1)} ms)`,
        ...verdict(slowFirstByteRatio, (x) => x <= targets.maxSlowFirstByteRatio, why),
      });
    }
  }
  return {
    comparison: {
      throughputRatio,
      ...(wideSseThroughputRatio === undefined ? {} : { wideSseThroughputRatio }),
      addedLatencyMs,
      addedLoadedLatencyMs,
      ...(sustainedThroughputRatio === undefined ? {} : { sustainedThroughputRatio }),
      ...(sustainedChange === undefined ? {} : { sustainedChange }),
      ...(slowFirstByteRatio === undefined ? {} : { slowFirstByteRatio }),
    },
    targets: checks,
  };
}

function verdict(
  value: number | undefined,
  passes: (v: number) => boolean,
  problem: string | undefined,
): { verdict: Verdict; why?: string } {
  if (value === undefined) return { verdict: "NOT MEASURED", why: problem ?? "not measured" };
  // A figure taken while requests failed measures the failures, not the gateway.
  if (problem !== undefined) return { verdict: "FAIL", why: problem };
  return passes(value) ? { verdict: "PASS" } : { verdict: "FAIL" };
}

/** Exit status 0 only if no check failed or went unmeasured. */
export function allPassed(checks: readonly TargetCheck[]): boolean {
  return checks.every((t) => t.verdict !== "FAIL" && t.verdict !== "NOT MEASURED");
}

// ------------------------------------------------------------------ text

const num = (v: number | undefined, digits = 2): string =>
  v === undefined ? "-" : v.toFixed(digits);

function table(rows: string[][], leftColumns = 1): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length)));
  return rows
    .map((r) =>
      r
        .map((cell, i) => (i < leftColumns ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!)))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

function loadRow(label: string, target: TargetName, phase: LoadPhase | undefined): string[] {
  if (!phase) return [label, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"];
  const cpu = target === "gateway" ? phase.cpu.gatewayMsPerRequest : phase.cpu.proxyMsPerRequest;
  return [
    label,
    num(phase.requestsPerSecond, 0),
    num(phase.ok > 0 ? phase.latencyMs.p50 : undefined, 0),
    num(phase.ok > 0 ? phase.latencyMs.p99 : undefined, 0),
    num(cpu, 3),
    num(phase.cpu.cores[target], 2),
    num(phase.cpu.postgresMsPerRequest, 3),
    num(phase.cpu.cores.postgres, 2),
    String(phase.ok),
    String(phase.non2xx),
    String(phase.errors),
  ];
}

export function formatReport(report: BenchReport): string {
  const out: string[] = [];
  const s = report.settings;
  out.push(
    `Gateway benchmark — ${report.finishedAt}`,
    `node ${report.machine.node}, ${report.machine.cpus} CPUs (load generator, gateway, proxy, upstream, PostgreSQL and anvil share them)`,
    `request: POST /v1/chat/completions ${s.request} (+ "stream": true)`,
    `load: ${s.connections} connections (SSE also ${s.wideConnections}), ${s.seconds} s measured after ${s.warmupSeconds} s warm-up; unloaded: ${s.unloadedRequests} sequential requests on 1 connection`,
    `sustained: ${s.sustainedSeconds === 0 ? "skipped" : `${s.sustainedSeconds} s of JSON at ${s.connections} connections in ${s.sustainedWindowSeconds} s windows`}; slow streams: ${s.slowStreams === 0 ? "skipped" : `${s.slowStreams} started within ${s.slowStartMs} ms, ${s.slowStreamSeconds} s each`}`,
    `PostgreSQL CPU: ${report.postgresCpu.unavailable === undefined ? `/proc/<pid>/stat of the bench database's backends, ${report.postgresCpu.clockTicksPerSecond} ticks/s${report.postgresCpu.note ? ` (${report.postgresCpu.note})` : ""}` : `n/a: ${report.postgresCpu.unavailable}`}`,
    "",
  );

  out.push("Preflight (one request each, answer checked in full)");
  for (const target of ["proxy", "gateway"] as const) {
    for (const scenario of ["json", "sse"] as const) {
      const p = report.preflight[target][scenario];
      if (!p) continue;
      out.push(`  ${p.ok ? "ok  " : "FAIL"} ${target.padEnd(7)} ${scenario.padEnd(4)} ${p.detail}`);
    }
  }
  out.push("");

  const loadRows: string[][] = [
    [
      "load",
      "req/s",
      "p50 ms",
      "p99 ms",
      "CPU ms/req",
      "CPU cores",
      "PG ms/req",
      "PG cores",
      "2xx",
      "non-2xx",
      "errors",
    ],
  ];
  for (const scenario of ["json", "sse"] as const) {
    for (const target of ["proxy", "gateway"] as const) {
      const label = `${scenario === "json" ? "JSON" : "SSE (20 chunks)"} ${target}, ${s.connections} conn`;
      loadRows.push(loadRow(label, target, report.load[target][scenario]));
    }
  }
  if (s.wideConnections > 0) {
    for (const target of ["proxy", "gateway"] as const) {
      const label = `SSE (20 chunks) ${target}, ${s.wideConnections} conn`;
      loadRows.push(loadRow(label, target, report.loadWide[target]));
    }
  }
  for (const dialect of ["responses", "messages"] as const) {
    for (const scenario of ["json", "sse"] as const) {
      const phase = report.dialects?.[dialect]?.[scenario];
      if (phase === undefined) continue;
      const label = `/v1/${dialect} ${scenario === "json" ? "JSON" : "SSE"} gateway, ${s.connections} conn`;
      loadRows.push(loadRow(label, "gateway", phase));
    }
  }
  if (report.unary !== undefined) {
    loadRows.push(
      loadRow(`unary POST /v1/quotes gateway, ${s.connections} conn`, "gateway", report.unary),
    );
  }
  out.push(table(loadRows));
  out.push(
    "  (req/s counts 2xx answers only; latency is autocannon's, whole response, 1 ms resolution;",
    "   CPU ms/req is the target process's user+system CPU over the measured window / responses;",
    "   PG ms/req is the bench database's PostgreSQL backends' CPU over the window / 2xx answers;",
    '   "-": not measured, because its preflight failed)',
  );
  const phases: [string, LoadPhase | undefined][] = [];
  for (const target of ["proxy", "gateway"] as const) {
    for (const scenario of ["json", "sse"] as const) {
      phases.push([`${target} ${scenario}`, report.load[target][scenario]]);
    }
    phases.push([`${target} sse ${s.wideConnections}`, report.loadWide[target]]);
  }
  phases.push(["gateway unary", report.unary]);
  for (const [label, phase] of phases) {
    if (phase && phase.errorSamples.length > 0) {
      out.push(`  ${label} errors: ${phase.errorSamples.join(" | ")}`);
    }
  }
  out.push("");

  if (report.x402 !== undefined) {
    const rows: string[][] = [
      [
        "x402 beside a permit (sequential JSON)",
        "wall p50 ms",
        "p90 ms",
        "gateway CPU ms/req",
        "PG ms/req",
        "anvil CPU ms/req",
        "n",
      ],
    ];
    for (const [label, f] of [
      ["permit (API key)", report.x402.permit],
      ["x402 upto (signature)", report.x402.x402],
    ] as const) {
      rows.push([
        label,
        num(f.wallMedianMs, 2),
        num(f.wallP90Ms, 2),
        num(f.gatewayCpuMsPerRequest, 3),
        num(f.postgresCpuMsPerRequest, 3),
        num(f.anvilCpuMsPerRequest, 2),
        String(f.requests),
      ]);
    }
    out.push(table(rows));
    out.push(
      "  (a gateway process of its own with x402 on; alternating rounds; the payments signed before the",
      "   window; gateway CPU includes the payment's checks and signature recovery, anvil's the simulation)",
      "",
    );
  }

  const unloadedRows: string[][] = [["unloaded (1 connection)", "p50 ms", "p90 ms", "p99 ms", "n"]];
  for (const [scenario, metric, label] of [
    ["json", "totalMs", "JSON total"],
    ["sse", "firstByteMs", "SSE first byte"],
    ["sse", "totalMs", "SSE total"],
  ] as const) {
    for (const target of ["proxy", "gateway"] as const) {
      const f = report.unloaded[target][scenario];
      const p = f?.[metric];
      unloadedRows.push([
        `${label} ${target}`,
        num(p?.p50, 3),
        num(p?.p90, 3),
        num(p?.p99, 3),
        String(p?.count ?? 0),
      ]);
    }
  }
  out.push(table(unloadedRows));
  for (const target of ["proxy", "gateway"] as const) {
    for (const scenario of ["json", "sse"] as const) {
      const f = report.unloaded[target][scenario];
      if (!f) continue;
      const bad = Object.entries(f.statusCodes).filter(([code]) => !code.startsWith("2"));
      if (bad.length > 0 || f.failures.length > 0) {
        out.push(
          `  ${target} ${scenario}: ${bad.map(([c, n]) => `${n}× HTTP ${c}`).join(", ")}${
            f.failures.length > 0 ? ` ${f.failures.length} failed: ${f.failures[0]}` : ""
          }`,
        );
      }
    }
  }
  out.push("");

  if (s.slowStreams > 0) {
    const rows: string[][] = [
      [
        `slow streams (${s.slowStreams})`,
        "started in",
        "complete",
        "1st byte p50",
        "p90",
        "p99",
        "RSS before",
        "heap before",
        "RSS peak",
        "heap at peak",
        "external",
        "CPU ms",
      ],
    ];
    for (const target of ["proxy", "gateway"] as const) {
      const b = report.slowStreams[target];
      if (!b) {
        rows.push([target, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"]);
        continue;
      }
      rows.push([
        target,
        `${b.startSpreadMs.toFixed(0)} ms`,
        `${b.complete}/${b.streams}`,
        `${num(b.firstByteMs?.p50, 1)} ms`,
        num(b.firstByteMs?.p90, 1),
        num(b.firstByteMs?.p99, 1),
        mb(b.memory.before.rssBytes),
        mb(b.memory.before.heapUsedBytes),
        mb(b.memory.peak.rssBytes),
        mb(b.memory.peak.heapUsedBytes),
        mb(b.memory.peak.externalBytes),
        num(b.cpuMs, 0),
      ]);
    }
    out.push(table(rows));
    const idle = (t: TargetName): string => {
      const m = report.memoryAfterSetup[t];
      return m ? `${mb(m.rssBytes)} RSS, ${mb(m.heapUsedBytes)} heap` : "-";
    };
    out.push(
      "  (RSS sampled over IPC every 100 ms during the burst; heap = V8 heap used, external = memory",
      "   outside the V8 heap held by JS objects (buffers), both at the RSS peak; before = just before",
      `   the burst, after the load phases; once set up, before any load: gateway ${idle("gateway")},`,
      `   proxy ${idle("proxy")})`,
    );
    for (const target of ["proxy", "gateway"] as const) {
      const b = report.slowStreams[target];
      if (b && b.errorSamples.length > 0) {
        out.push(`  ${target} problems: ${b.errorSamples.join(" | ")}`);
      }
    }
    out.push("");
  }

  const sus = report.sustained;
  if (s.sustainedSeconds === 0) {
    out.push("Sustained phase: skipped (BENCH_SUSTAINED_SECONDS=0)", "");
  } else if (sus) {
    const rows: string[][] = [
      [
        "sustained JSON, gateway",
        "req/s",
        "of proxy",
        "CPU ms/req",
        "PG ms/req",
        "PG cores",
        "2xx",
        "non-2xx",
      ],
    ];
    const proxyJson = report.load.proxy.json?.requestsPerSecond;
    for (const w of sus.windows) {
      rows.push([
        `${w.fromSeconds.toFixed(0).padStart(4)}-${w.toSeconds.toFixed(0)} s${w.partial ? " (partial)" : ""}`,
        num(w.requestsPerSecond, 0),
        proxyJson ? pct(w.requestsPerSecond / proxyJson) : "-",
        num(w.gatewayCpuMsPerRequest, 3),
        num(w.postgresMsPerRequest, 3),
        num(w.postgres?.cores, 2),
        String(w.ok),
        String(w.non2xx),
      ]);
    }
    rows.push([
      "all windows",
      num(sus.requestsPerSecond, 0),
      pct(report.comparison.sustainedThroughputRatio),
      "",
      "",
      "",
      String(sus.windows.reduce((a, w) => a + w.ok, 0)),
      String(sus.windows.reduce((a, w) => a + w.non2xx, 0)),
    ]);
    out.push(table(rows));
    out.push(
      `  (database ${mb(sus.databaseBytes.before)} before, ${mb(sus.databaseBytes.after)} after; autocannon p50 ${num(sus.load.latencyMs.p50, 0)} ms, p99 ${num(sus.load.latencyMs.p99, 0)} ms, ${sus.load.errors} errors)`,
    );
    if (sus.postgresUnavailable) out.push(`  PostgreSQL CPU: n/a: ${sus.postgresUnavailable}`);
    if (sus.load.errorSamples.length > 0) {
      out.push(`  errors: ${sus.load.errorSamples.join(" | ")}`);
    }
    out.push("");
  }

  const c = report.comparison;
  out.push(
    "Gateway vs proxy",
    `  throughput ratio: JSON ${pct(c.throughputRatio.json)}, SSE ${pct(c.throughputRatio.sse)}, SSE at ${s.wideConnections} connections ${pct(c.wideSseThroughputRatio)}, sustained JSON ${pct(c.sustainedThroughputRatio)}`,
    `  added latency, unloaded p50: JSON ${num(c.addedLatencyMs.json, 3)} ms, first SSE byte ${num(c.addedLatencyMs.sseFirstByte, 3)} ms`,
    `  added latency at load, p50: JSON ${num(c.addedLoadedLatencyMs.json, 0)} ms, SSE ${num(c.addedLoadedLatencyMs.sse, 0)} ms`,
    "",
    "Targets (issues 11 and 21)",
  );
  const targetRows: string[][] = [["measure", "value", "target", "verdict"]];
  for (const t of report.targets) targetRows.push([t.name, t.value, t.target, t.verdict]);
  out.push(
    table(targetRows, 4)
      .split("\n")
      .map((line) => `  ${line}`)
      .join("\n"),
  );
  for (const t of report.targets) {
    if (t.why) out.push(`  ${t.verdict}: ${t.name}: ${t.why}`);
  }
  if (report.problems.length > 0) {
    out.push("", "Problems");
    for (const p of report.problems) out.push(`  - ${p}`);
  }
  return `${out.join("\n")}\n`;
}
