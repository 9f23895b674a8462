import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

/**
 * The arrows between rooms (issue 30): the domain is free of protobuf and of every
 * transport and adapter, whatever it reaches through the modules it imports; `src/schema`
 * imports nothing above it. Read from the source text: every relative `import`/`export ... from`
 * (type-only ones included, and `import("...")`) is followed, transitively from each domain
 * module. Tests are not roots (a test may wire an adapter).
 */

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");

const specifier =
  /(?:^|[\s;])(?:import|export)\s+(?:type\s+)?(?:[^;"'`]*?\sfrom\s+)?["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;

/** The relative specifiers of a module's imports and re-exports, comments aside. */
function relativeSpecifiers(source: string): string[] {
  const text = source.replace(/\/\*[\s\S]*?\*\/|\/\/[^\n]*/g, "");
  return [...text.matchAll(specifier)]
    .map((match) => match[1] ?? match[2] ?? "")
    .filter((spec) => spec.startsWith("."));
}

/** The relative modules `file` imports, as paths from the repository root (`src/x.ts`). */
function importsOf(file: string): string[] {
  const found: string[] = [];
  for (const spec of relativeSpecifiers(readFileSync(join(root, file), "utf8"))) {
    const target = join(dirname(file), spec);
    const candidates = [
      target.replace(/\.js$/, ".ts"),
      target,
      `${target}.ts`,
      join(target, "index.ts"),
    ];
    found.push(candidates.find((c) => existsSync(join(root, c))) ?? target);
  }
  return found;
}

function sources(dir: string): string[] {
  return readdirSync(join(root, dir)).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(join(root, path)).isDirectory()) return sources(path);
    return path.endsWith(".ts") && !path.endsWith(".test.ts") ? [path] : [];
  });
}

/** Every module `from` reaches, each with the chain of imports that leads to it. */
function reach(from: string): Map<string, string[]> {
  const chains = new Map<string, string[]>([[from, [from]]]);
  const queue = [from];
  for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
    if (!file.endsWith(".ts") || file.startsWith("gen/")) continue;
    for (const next of importsOf(file)) {
      if (chains.has(next)) continue;
      chains.set(next, [...(chains.get(file) ?? []), next]);
      queue.push(next);
    }
  }
  return chains;
}

const forbidden = (rooms: readonly string[]) => (path: string) =>
  rooms.some((room) => path === room || path.startsWith(`${room}/`));

/**
 * The import circles among `files` (strongly connected components of more than one module, or a
 * module importing itself), each as its modules sorted (Tarjan's algorithm).
 */
export function circles(files: readonly string[], edges: (file: string) => string[]): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const inside = new Set(files);
  let next = 0;
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next);
    next += 1;
    stack.push(v);
    onStack.add(v);
    for (const w of edges(v).filter((t) => inside.has(t))) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      for (let w = stack.pop(); w !== undefined; w = w === v ? undefined : stack.pop()) {
        onStack.delete(w);
        component.push(w);
      }
      if (component.length > 1 || edges(v).includes(v)) found.push(component.sort());
    }
  };
  for (const file of files) if (!index.has(file)) visit(file);
  return found;
}

describe("architecture", () => {
  it("the domain reaches no generated protobuf code, adapter, Connect or REST module", () => {
    const outside = forbidden(["gen", "src/adapters", "src/connect", "src/rest"]);
    const problems: string[] = [];
    for (const file of sources("src/domain")) {
      for (const [reached, chain] of reach(file)) {
        if (outside(reached)) problems.push(chain.join(" -> "));
      }
    }
    expect(problems).toEqual([]);
  });

  it("src/schema imports nothing above it", () => {
    const above = forbidden(["src/domain", "src/adapters", "src/connect", "src/rest", "src/app"]);
    const problems = sources("src/schema").flatMap((file) =>
      importsOf(file)
        .filter(above)
        .map((target) => `${file} -> ${target}`),
    );
    expect(problems).toEqual([]);
  });

  it("src/ has no import circle (type-only imports included)", () => {
    expect(circles(sources("src"), importsOf)).toEqual([]);
  });

  it("finds a circle, however long, and only circles", () => {
    const graph: Record<string, string[]> = {
      a: ["b"],
      b: ["c"],
      c: ["a", "d"],
      d: [],
      e: ["e"],
      f: ["d"],
    };
    expect(circles(Object.keys(graph), (f) => graph[f] ?? [])).toEqual([["a", "b", "c"], ["e"]]);
  });

  it("reads every form of import", () => {
    const source = [
      'import { a } from "./a.js";',
      'import type { B } from "../b.js";',
      "import {\n  c,\n  type C,\n} from './c.js';",
      'export { d } from "./d.js";',
      'export type * from "./e.js";',
      'import "./f.js";',
      'const g = await import("./g.js");',
      '// import { h } from "./h.js";',
      'import { i } from "node:fs";',
    ].join("\n");
    expect(relativeSpecifiers(source)).toEqual([
      "./a.js",
      "../b.js",
      "./c.js",
      "./d.js",
      "./e.js",
      "./f.js",
      "./g.js",
    ]);
    expect(importsOf("src/domain/provider-preferences.ts")).toContain("src/schema/chat.ts");
  });

  it("no module in src/rest/ imports src/server.ts (the door is one way: server -> rest)", () => {
    const problems = sources("src/rest").flatMap((file) =>
      [...reach(file)]
        .filter(([reached]) => reached === "src/server.ts")
        .map(([, chain]) => chain.join(" -> ")),
    );
    expect(problems).toEqual([]);
  });

  it("no REST deps, options or call type receives a chat function by injection", () => {
    // The REST chat calls the InferenceService's chatInto, reached by its imports; a member
    // named `chat` (or typed as a chat call) in a type of src/rest/ would hand one down instead.
    const problems: string[] = [];
    const chatMember =
      /^\s*readonly\s+(chat\w*)\??\s*:|:\s*(?:Inference\[["']chatInto["']\]|RestChat)\b/m;
    for (const file of sources("src/rest")) {
      const text = readFileSync(join(root, file), "utf8").replace(
        /\/\*[\s\S]*?\*\/|\/\/[^\n]*/g,
        "",
      );
      for (const block of text.matchAll(/(?:interface|type)\s+(\w+)[^{=]*[{=]([\s\S]*?)\n\}/g)) {
        const name = block[1] ?? "";
        if (!/(Deps|Options|Call)$/.test(name)) continue;
        const found = chatMember.exec(block[2] ?? "");
        if (found !== null) problems.push(`${file}: ${name} carries ${found[0].trim()}`);
      }
    }
    expect(problems).toEqual([]);
    // The guard it checks: a deps type with a chat function is found.
    const planted = "export interface FacadeDeps {\n  readonly chat: RestChat;\n}";
    expect(chatMember.exec(planted)?.[1]).toBe("chat");
  });

  it("the request id is made in one module: the call guard", () => {
    // Made: a random id (randomHex, newRequestId) assigned as a request id. Read: anywhere.
    const makers = sources("src").filter((file) => {
      const text = readFileSync(join(root, file), "utf8");
      return /newRequestId|requestId[^\n]{0,80}randomHex|randomHex\(12\)/.test(text);
    });
    expect(makers).toEqual(["src/connect/call-guard.ts"]);
  });

  it("only a folder's face (its index.ts) re-exports other modules' names (docs/architecture.md, Conventions)", () => {
    // src/config.ts is the face of src/config/, at the root where the composition root reads it.
    const faces = (file: string) => file.endsWith("/index.ts") || file === "src/config.ts";
    const reExporting = sources("src").filter((file) => {
      const text = readFileSync(join(root, file), "utf8");
      return /^export (type )?(\*|\{[^}]*\}) from /m.test(text);
    });
    expect(reExporting.filter((file) => !faces(file))).toEqual([]);
    // The pattern finds both forms (a re-export over several lines included).
    const pattern = /^export (type )?(\*|\{[^}]*\}) from /m;
    expect(pattern.test('export * from "./a.js";')).toBe(true);
    expect(pattern.test('export type {\n  A,\n  B,\n} from "./a.js";')).toBe(true);
    expect(pattern.test("export { a };")).toBe(false);
  });

  it("the in-process transport is gone", () => {
    expect(existsSync(join(root, "src/connect/in-process-transport.ts"))).toBe(false);
    const problems = sources("src").filter((file) =>
      importsOf(file).includes("src/connect/in-process-transport.ts"),
    );
    expect(problems).toEqual([]);
  });
});
