import type { LoadResult, Percentiles, Preflight, Scenario } from "./measure.js";

/** The issue's targets. */
export const targets = {
  /** Non-streaming throughput of the gateway, as a fraction of the proxy's. */
  minJsonThroughputRatio: 0.35,
  /** Unloaded (one connection) p50 added latency, ms, for JSON and for time to first SSE byte. */
  maxAddedLatencyMs: 1,
} as const;

export type TargetName = "gateway" | "proxy";

/** Per process, per measured window: CPU time (user + system) per request, ms. */
export interface CpuFigures {
  readonly gatewayMsPerRequest?: number;
  readonly proxyMsPerRequest?: number;
  readonly upstreamMsPerRequest?: number;
  /** CPU share of the window each process used, in cores (1.0 = one core busy). */
  readonly cores: Partial<Record<"gateway" | "proxy" | "upstream", number>>;
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

export type Verdict = "PASS" | "FAIL" | "NOT MEASURED";

export interface TargetCheck {
  readonly name: string;
  readonly target: string;
  readonly value: string;
  readonly verdict: Verdict;
  readonly why?: string;
}

export interface BenchReport {
  readonly version: 1;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly machine: { cpus: number; node: string; platform: string };
  readonly settings: {
    seconds: number;
    warmupSeconds: number;
    connections: number;
    unloadedRequests: number;
    offerMaxConcurrency: number;
    permitDeposit: string;
    request: string;
  };
  readonly setupSeconds: number;
  readonly preflight: Record<TargetName, Partial<Record<Scenario, Preflight>>>;
  readonly unloaded: Record<TargetName, Partial<Record<Scenario, UnloadedFigures>>>;
  readonly load: Record<TargetName, Partial<Record<Scenario, LoadPhase>>>;
  readonly comparison: {
    throughputRatio: Partial<Record<Scenario, number>>;
    /** Gateway p50 − proxy p50, unloaded, ms. */
    addedLatencyMs: { json?: number; sseFirstByte?: number };
    /** Gateway p50 − proxy p50 at load, ms. */
    addedLoadedLatencyMs: Partial<Record<Scenario, number>>;
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

export function compare(
  load: BenchReport["load"],
  unloaded: BenchReport["unloaded"],
  preflight: BenchReport["preflight"],
): Pick<BenchReport, "comparison" | "targets"> {
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
  const gJson = unloaded.gateway.json?.totalMs;
  const pJson = unloaded.proxy.json?.totalMs;
  const gSse = unloaded.gateway.sse?.firstByteMs;
  const pSse = unloaded.proxy.sse?.firstByteMs;
  const addedLatencyMs = {
    ...(gJson && pJson ? { json: gJson.p50 - pJson.p50 } : {}),
    ...(gSse && pSse ? { sseFirstByte: gSse.p50 - pSse.p50 } : {}),
  };

  const checks: TargetCheck[] = [];
  {
    const why = refused("json") ?? phaseClean(load.gateway.json) ?? phaseClean(load.proxy.json);
    const ratio = throughputRatio.json;
    checks.push({
      name: "non-streaming throughput, gateway / proxy (32 connections)",
      target: `>= ${(targets.minJsonThroughputRatio * 100).toFixed(0)}%`,
      value: ratio === undefined ? "-" : `${(ratio * 100).toFixed(1)}%`,
      ...verdict(ratio, (r) => r >= targets.minJsonThroughputRatio, why),
    });
  }
  {
    const why =
      refused("json") ?? unloadedClean(unloaded.gateway.json) ?? unloadedClean(unloaded.proxy.json);
    checks.push({
      name: "unloaded added latency, JSON, p50 (1 connection)",
      target: `<= ${targets.maxAddedLatencyMs} ms`,
      value: addedLatencyMs.json === undefined ? "-" : `${addedLatencyMs.json.toFixed(3)} ms`,
      ...verdict(addedLatencyMs.json, (v) => v <= targets.maxAddedLatencyMs, why),
    });
  }
  {
    const why =
      refused("sse") ?? unloadedClean(unloaded.gateway.sse) ?? unloadedClean(unloaded.proxy.sse);
    checks.push({
      name: "unloaded added time to first SSE byte, p50 (1 connection)",
      target: `<= ${targets.maxAddedLatencyMs} ms`,
      value:
        addedLatencyMs.sseFirstByte === undefined
          ? "-"
          : `${addedLatencyMs.sseFirstByte.toFixed(3)} ms`,
      ...verdict(addedLatencyMs.sseFirstByte, (v) => v <= targets.maxAddedLatencyMs, why),
    });
  }
  return { comparison: { throughputRatio, addedLatencyMs, addedLoadedLatencyMs }, targets: checks };
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

// ------------------------------------------------------------------ text

const num = (v: number | undefined, digits = 2): string =>
  v === undefined ? "-" : v.toFixed(digits);

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length)));
  return rows
    .map((r) =>
      r
        .map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!)))
        .join("  "),
    )
    .join("\n");
}

export function formatReport(report: BenchReport): string {
  const out: string[] = [];
  const s = report.settings;
  out.push(
    `Gateway benchmark — ${report.finishedAt}`,
    `node ${report.machine.node}, ${report.machine.cpus} CPUs (load generator, gateway, proxy, upstream, PostgreSQL and anvil share them)`,
    `request: POST /v1/chat/completions ${s.request} (+ "stream": true)`,
    `load: ${s.connections} connections, ${s.seconds} s measured after ${s.warmupSeconds} s warm-up; unloaded: ${s.unloadedRequests} sequential requests on 1 connection`,
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
    ["load", "req/s", "p50 ms", "p99 ms", "CPU ms/req", "CPU cores", "2xx", "non-2xx", "errors"],
  ];
  for (const scenario of ["json", "sse"] as const) {
    for (const target of ["proxy", "gateway"] as const) {
      const phase = report.load[target][scenario];
      const label = `${scenario === "json" ? "JSON" : "SSE (20 chunks)"} ${target}`;
      if (!phase) {
        loadRows.push([label, "-", "-", "-", "-", "-", "-", "-", "-"]);
        continue;
      }
      const cpu =
        target === "gateway" ? phase.cpu.gatewayMsPerRequest : phase.cpu.proxyMsPerRequest;
      loadRows.push([
        label,
        num(phase.requestsPerSecond, 0),
        num(phase.ok > 0 ? phase.latencyMs.p50 : undefined, 0),
        num(phase.ok > 0 ? phase.latencyMs.p99 : undefined, 0),
        num(cpu, 3),
        num(phase.cpu.cores[target], 2),
        String(phase.ok),
        String(phase.non2xx),
        String(phase.errors),
      ]);
    }
  }
  out.push(table(loadRows));
  out.push(
    "  (req/s counts 2xx answers only; latency is autocannon's, whole response, 1 ms resolution;",
    "   CPU ms/req is the target process's user+system CPU over the measured window / responses;",
    '   "-": not measured, because its preflight failed)',
  );
  for (const scenario of ["json", "sse"] as const) {
    for (const target of ["proxy", "gateway"] as const) {
      const phase = report.load[target][scenario];
      if (phase && phase.errorSamples.length > 0) {
        out.push(`  ${target} ${scenario} errors: ${phase.errorSamples.join(" | ")}`);
      }
    }
  }
  out.push("");

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

  const c = report.comparison;
  out.push(
    "Gateway vs proxy",
    `  throughput ratio: JSON ${c.throughputRatio.json === undefined ? "-" : `${(c.throughputRatio.json * 100).toFixed(1)}%`}, SSE ${c.throughputRatio.sse === undefined ? "-" : `${(c.throughputRatio.sse * 100).toFixed(1)}%`}`,
    `  added latency, unloaded p50: JSON ${num(c.addedLatencyMs.json, 3)} ms, first SSE byte ${num(c.addedLatencyMs.sseFirstByte, 3)} ms`,
    `  added latency at load, p50: JSON ${num(c.addedLoadedLatencyMs.json, 0)} ms, SSE ${num(c.addedLoadedLatencyMs.sse, 0)} ms`,
    "",
    "Targets",
  );
  for (const t of report.targets) {
    out.push(
      `  [${t.verdict}] ${t.name}: ${t.value} (target ${t.target})${t.why ? ` — ${t.why}` : ""}`,
    );
  }
  if (report.problems.length > 0) {
    out.push("", "Problems");
    for (const p of report.problems) out.push(`  - ${p}`);
  }
  return `${out.join("\n")}\n`;
}
