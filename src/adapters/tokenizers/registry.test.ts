import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { boundCounter } from "../../domain/tokens.js";
import {
  checkTokenizerRegistry,
  embeddedRegistryFile,
  findTokenizer,
  loadTokenizerRegistry,
  readTokenizerRegistry,
} from "./registry.js";
import { createTokenCounters } from "./token-counters.js";

const dir = mkdtempSync(join(tmpdir(), "tokenizer-registry-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");
const template = "{% for m in messages %}{{ m.content }}{% endfor %}";
const tokenizerText = '{"model": {}}';

/** Writes a registry file (and the files it names) and returns its path. */
function registryFile(name: string, registry: object): string {
  writeFileSync(join(dir, "template.jinja"), template);
  writeFileSync(join(dir, "tokenizer.json"), tokenizerText);
  const file = join(dir, `${name}.json`);
  writeFileSync(file, JSON.stringify(registry));
  return file;
}

const entry = (overrides: object = {}) => ({
  tokenizer: "./tokenizer.json",
  sha256: sha256(tokenizerText),
  chatTemplate: "./template.jinja",
  templateSha256: sha256(template),
  ...overrides,
});

describe("start-up check", () => {
  it("passes for the embedded registry (every pinned file is installed)", async () => {
    await expect(checkTokenizerRegistry(loadTokenizerRegistry())).resolves.toBeUndefined();
  });

  it("fails naming the file that is missing, its entry and its registry", async () => {
    const file = registryFile("missing", {
      tokenizers: { mine: entry({ tokenizer: "./absent/tokenizer.json" }) },
      models: [],
    });
    await expect(createTokenCounters({ registryFile: file })).rejects.toThrow(
      `tokenizer file ${join(dir, "absent/tokenizer.json")} for "mine" (registry ${file}) is missing`,
    );
  });

  it("fails naming the file whose SHA-256 is not the one pinned, with both digests", async () => {
    const pinned = "ab".repeat(32);
    const file = registryFile("mismatch", {
      tokenizers: { mine: entry({ templateSha256: pinned }) },
      models: [],
    });
    await expect(createTokenCounters({ registryFile: file })).rejects.toThrow(
      `tokenizer file ${join(dir, "template.jinja")} for "mine" has sha256 ${sha256(template)}, the registry ${file} pins ${pinned}`,
    );
  });

  it("refuses a malformed registry, and a route to a tokenizer nobody declares", () => {
    const bad = registryFile("bad", { tokenizers: { mine: entry({ sha256: "xyz" }) }, models: [] });
    expect(() => readTokenizerRegistry(bad)).toThrow(
      `tokenizer registry ${bad}: "mine".sha256 must be a SHA-256 in lower-case hex (64 digits)`,
    );
    const unknown = registryFile("unknown", {
      tokenizers: {},
      models: [{ repository: "acme/model", tokenizer: "nope" }],
    });
    expect(() => loadTokenizerRegistry(unknown)).toThrow(
      'the route of "acme/model" names tokenizer "nope", which no registry declares',
    );
    const nowhere = registryFile("package", {
      tokenizers: { mine: entry({ tokenizer: "@no-such/package/tokenizer.json" }) },
      models: [],
    });
    expect(() => readTokenizerRegistry(nowhere)).toThrow(
      '"mine".tokenizer: @no-such/package/tokenizer.json is not a file of an installed package',
    );
  });
});

describe("routes", () => {
  const embedded = loadTokenizerRegistry();
  const nameOf = (repository: string, revision = "main") =>
    findTokenizer(embedded, { repository, revision })?.name;

  it("maps families by pattern and the demo's models to Qwen 3", () => {
    expect(
      [
        "meta-llama/Meta-Llama-3-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen3-235B-A22B",
        "google/gemma-3-27b-it",
        "deepseek-ai/DeepSeek-V3-0324",
        "deepseek-ai/DeepSeek-R1",
        "openai/gpt-oss-120b",
        "demo/chat-small",
        "demo/coder-small",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "Qwen/Qwen2.5-7B-Instruct",
      ].map((repository) => nameOf(repository)),
    ).toEqual([
      "llama3",
      "llama3.1",
      "llama3.1",
      "qwen3",
      "gemma3",
      "deepseek-v3",
      "deepseek-v3",
      "gpt-oss",
      "qwen3",
      "qwen3",
      undefined,
      undefined,
    ]);
  });

  it("says which models hide their reasoning: gpt-oss only (issue 35, item 9)", () => {
    const hides = (repository: string) =>
      findTokenizer(embedded, { repository, revision: "main" })?.hidesReasoning === true;
    expect(hides("openai/gpt-oss-120b")).toBe(true);
    for (const shows of [
      "deepseek-ai/DeepSeek-R1",
      "Qwen/Qwen3-235B-A22B",
      "demo/chat-small",
      "meta-llama/Llama-3.3-70B-Instruct",
      "google/gemma-3-27b-it",
    ]) {
      expect(hides(shows), shows).toBe(false);
    }
    const file = registryFile("hides", {
      tokenizers: { mine: entry({ hidesReasoning: true }), theirs: entry() },
      models: [],
    });
    const read = readTokenizerRegistry(file);
    expect(read.tokenizers.get("mine")?.hidesReasoning).toBe(true);
    expect(read.tokenizers.get("theirs")?.hidesReasoning).toBeUndefined();
    const bad = registryFile("hides-bad", {
      tokenizers: { mine: entry({ hidesReasoning: "yes" }) },
      models: [],
    });
    expect(() => readTokenizerRegistry(bad)).toThrow('"mine".hidesReasoning must be true or false');
  });

  it("puts the operator's routes first, an exact repository before a pattern, a revision before none", () => {
    const file = registryFile("operator", {
      tokenizers: { mine: entry() },
      models: [
        { repository: "Qwen/Qwen3-*", tokenizer: "mine" },
        { repository: "acme/*", tokenizer: "mine" },
        { repository: "acme/model", revision: "v2", tokenizer: "gemma3" },
      ],
    });
    const merged = loadTokenizerRegistry(file);
    const nameIn = (repository: string, revision = "main") =>
      findTokenizer(merged, { repository, revision })?.name;
    expect(nameIn("Qwen/Qwen3-8B")).toBe("mine");
    expect(nameIn("demo/chat-small")).toBe("qwen3");
    expect(nameIn("acme/model")).toBe("mine");
    expect(nameIn("acme/model", "v2")).toBe("gemma3");
    expect(merged.tokenizers.get("mine")?.registry).toBe(file);
    expect(merged.tokenizers.get("qwen3")?.registry).toBe(embeddedRegistryFile);
  });
});

describe("preloading", () => {
  it("gives the byte bound for an unknown model, loading nothing", async () => {
    const counters = await createTokenCounters({ threads: 0 });
    const unknown = { repository: "acme/unknown", revision: "1" };
    expect(counters.forModel(unknown)).toBe(boundCounter);
    expect(counters.meteringOf(unknown)).toEqual({ kind: "bound" });
    await counters.preload([unknown]);
    expect(counters.loaded()).toEqual([]);
  });

  it("loads a tokenizer shared by several models once; nothing before preload, nothing on a request's path", async () => {
    const loads: string[] = [];
    const counters = await createTokenCounters({ onLoad: (name) => loads.push(name) });
    const models = [
      { repository: "demo/chat-small", revision: "1" },
      { repository: "demo/coder-small", revision: "1" },
      { repository: "Qwen/Qwen3-8B", revision: "1" },
    ];
    // Not loaded: no counter (the model is not routable), and asking loads nothing.
    expect(counters.forModel(models[0]!)).toBeUndefined();
    expect(counters.meteringOf(models[0]!)).toEqual({ kind: "exact", tokenizer: "qwen3" });
    expect(counters.loaded()).toEqual([]);
    const preloading = Promise.all([counters.preload(models), counters.preload(models.slice(1))]);
    expect(counters.loading()).toEqual(["qwen3"]);
    await preloading;
    expect(counters.loading()).toEqual([]);
    const [a, b, c] = models.map((m) => counters.forModel(m)!);
    expect(a).toBe(b);
    expect(a).toBe(c);
    expect(loads).toEqual(["qwen3"]);
    expect([a!.name, a!.exact, a!.countOutput("Hello, world!")]).toEqual(["qwen3", true, 4n]);
    await counters.preload(models);
    expect(loads).toEqual(["qwen3"]);
    await counters.close();
  }, 60_000);
});
