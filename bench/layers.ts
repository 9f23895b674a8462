import { readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  aggregate,
  formatComparison,
  formatLayerTable,
  formatTopFunctions,
  parsePhases,
  parseProfile,
  plainResolver,
  sourceMapResolver,
  type CpuProfile,
  type LayerAggregate,
  type PhaseWindow,
} from "./lib/layers.js";

/**
 * `npm run bench:layers -- <.cpuprofile files or directories>`: the gateway's CPU per layer of a
 * request's path (issue 29), from the V8 CPU profiles `npm run bench` writes with
 * `BENCH_PROFILE_DIR` set. The bench writes one profile for the gateway's whole life, and beside
 * it `bench-phases-<pid>.json`, the measured window of each phase on the profile's clock; with
 * that file (found in a directory given, or `--phases FILE`) each phase gets its own table,
 * and a last table puts the phases side by side. Without it, one table for all samples.
 *
 *   --phase NAME       only this phase (repeatable)
 *   --phases FILE      the phases file, when it is not in a directory given
 *   --whole            also the whole profile, when there are phases
 *   --top N            functions listed per table (15)
 *   --locations        also the 40 locations (files) with the most self time, to check the mapping
 *   --no-source-maps   locations as the profile names them (dist/ files), not through source maps
 *
 * Run it on the build that was profiled: the bundle's source map is read from dist/ now.
 */

const root = fileURLToPath(new URL("..", import.meta.url));

interface Options {
  readonly inputs: string[];
  readonly phaseFiles: string[];
  readonly only: string[];
  whole: boolean;
  top: number;
  locations: boolean;
  sourceMaps: boolean;
}

function usage(message: string): never {
  process.stderr.write(
    `${message}\nusage: npm run bench:layers -- [--phase NAME]... [--phases FILE] [--whole] [--top N] [--locations] [--no-source-maps] <.cpuprofile files or directories>\n`,
  );
  process.exit(2);
}

function readOptions(args: readonly string[]): Options {
  const options: Options = {
    inputs: [],
    phaseFiles: [],
    only: [],
    whole: false,
    top: 15,
    locations: false,
    sourceMaps: true,
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    const value = (): string => args[++i] ?? usage(`${arg} needs a value`);
    if (arg === "--phase") options.only.push(value());
    else if (arg === "--phases") options.phaseFiles.push(value());
    else if (arg === "--whole") options.whole = true;
    else if (arg === "--top") options.top = Number(value());
    else if (arg === "--locations") options.locations = true;
    else if (arg === "--no-source-maps") options.sourceMaps = false;
    else if (arg.startsWith("--")) usage(`unknown option ${arg}`);
    else options.inputs.push(arg);
  }
  if (options.inputs.length === 0) usage("no profile given");
  if (!Number.isInteger(options.top) || options.top < 0) usage("--top needs a count");
  return options;
}

function collect(options: Options): { profiles: string[]; phaseFiles: string[] } {
  const profiles: string[] = [];
  const phaseFiles = [...options.phaseFiles];
  for (const input of options.inputs) {
    if (statSync(input).isDirectory()) {
      for (const name of readdirSync(input).sort()) {
        if (name.endsWith(".cpuprofile")) profiles.push(join(input, name));
        else if (/^bench-phases-.*\.json$/.test(name)) phaseFiles.push(join(input, name));
      }
    } else profiles.push(input);
  }
  if (profiles.length === 0) usage(`no .cpuprofile in ${options.inputs.join(", ")}`);
  return { profiles, phaseFiles };
}

function summary(result: LayerAggregate, wallUs: number, phase?: PhaseWindow): string {
  const requests = phase?.requests;
  const parts = [
    `${(wallUs / 1e6).toFixed(1)} s sampled`,
    `busy ${(result.busyUs / 1000).toFixed(0)} ms (${((100 * result.busyUs) / Math.max(1, wallUs)).toFixed(0)}% of the main thread)`,
    `idle ${(result.idleUs / 1000).toFixed(0)} ms`,
    `${result.samples} samples`,
  ];
  if (requests !== undefined && requests > 0) {
    parts.push(
      `${requests} answers: ${(result.busyUs / requests).toFixed(1)} µs of busy main thread per answer`,
    );
    if (phase?.gatewayCpuMs !== undefined) {
      parts.push(
        `the gateway process's CPU (all threads): ${((1000 * phase.gatewayCpuMs) / requests).toFixed(1)} µs per answer`,
      );
    }
  }
  return parts.join("; ");
}

function locationsTable(result: LayerAggregate, count: number): string {
  const byLocation = new Map<string, { layer: string; us: number }>();
  for (const f of result.functions) {
    const entry = byLocation.get(f.location) ?? { layer: f.layer, us: 0 };
    entry.us += f.selfUs;
    byLocation.set(f.location, entry);
  }
  const rows = [...byLocation]
    .sort((a, b) => b[1].us - a[1].us)
    .slice(0, count)
    .map(
      ([location, { layer, us }]) =>
        `| ${location} | ${layer} | ${((100 * us) / result.busyUs).toFixed(1)}% |`,
    );
  return ["| location | layer | share of busy |", "| --- | --- | ---: |", ...rows].join("\n");
}

function main(): void {
  const options = readOptions(process.argv.slice(2));
  const files = collect(options);
  const profiles: CpuProfile[] = files.profiles.map((file) =>
    parseProfile(readFileSync(file, "utf8"), file),
  );
  const resolver = options.sourceMaps ? sourceMapResolver(root) : plainResolver(root);
  const phases: PhaseWindow[] = files.phaseFiles.flatMap(
    (file) => parsePhases(readFileSync(file, "utf8"), file).phases,
  );
  const inProfile = (p: PhaseWindow): boolean =>
    profiles.some((profile) => p.startUs >= profile.startTime && p.endUs <= profile.endTime);
  const chosen = phases.filter(
    (p) => inProfile(p) && (options.only.length === 0 || options.only.includes(p.name)),
  );
  for (const name of options.only) {
    if (!chosen.some((p) => p.name === name)) {
      usage(`no phase ${name} in ${files.phaseFiles.join(", ") || "(no phases file)"}`);
    }
  }
  const out: string[] = [
    `Profiles: ${files.profiles.map((f) => basename(f)).join(", ")}` +
      (files.phaseFiles.length > 0
        ? `; phases: ${files.phaseFiles.map((f) => basename(f)).join(", ")}`
        : ""),
    "",
  ];
  const section = (
    title: string,
    result: LayerAggregate,
    wallUs: number,
    phase?: PhaseWindow,
  ): void => {
    out.push(`### ${title}`, "", summary(result, wallUs, phase), "");
    out.push(formatLayerTable(result, phase?.requests), "");
    if (options.top > 0) {
      out.push(`Top ${options.top} functions by self time:`, "");
      out.push(formatTopFunctions(result, options.top), "");
    }
    if (options.locations) out.push(locationsTable(result, 40), "");
  };
  if (chosen.length === 0 || options.whole) {
    const whole = aggregate(profiles, resolver);
    const wallUs = profiles.reduce((sum, p) => sum + (p.endTime - p.startTime), 0);
    section("whole profile", whole, wallUs);
  }
  const columns: Parameters<typeof formatComparison>[0][number][] = [];
  for (const phase of chosen) {
    const result = aggregate(profiles, resolver, phase);
    section(`phase: ${phase.name}`, result, phase.endUs - phase.startUs, phase);
    columns.push({
      name: phase.name,
      result,
      ...(phase.requests === undefined ? {} : { requests: phase.requests }),
      ...(phase.gatewayCpuMs === undefined ? {} : { cpuUs: 1000 * phase.gatewayCpuMs }),
    });
  }
  if (columns.length > 1) {
    out.push(
      "### the phases side by side",
      "",
      "Self time: share of each phase's busy time (µs per answer, on the profile's clock).",
      "",
      formatComparison(columns),
      "",
      "With Node's internals, regexps and WebAssembly charged to the layer that called them.",
      "",
      formatComparison(columns, "chargedUs"),
      "",
    );
  }
  process.stdout.write(`${out.join("\n")}\n`);
}

main();
