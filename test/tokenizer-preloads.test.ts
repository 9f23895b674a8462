import { describe, expect, it } from "vitest";
import { pino } from "pino";
import type { Hex } from "viem";
import { createTokenizerPreloads } from "../src/app/tokenizer-preloads.js";
import type { ModelRecord } from "../src/domain/catalog.js";
import { LogCapture, eventually } from "./helpers/stack.js";
import { watchedCounters } from "./helpers/watched-counters.js";

/**
 * The tokenizer preloads on their own (issue 35, item 5): which tokenizers a sweep loads, what
 * readiness says while they load, and a load that fails. The gateway-level test is
 * test/tokenizers-loaded.test.ts.
 */

const model = (repository: string, activeOffers: number, extra: Partial<ModelRecord> = {}) =>
  ({
    modelId: `0x${"01".repeat(32)}` as Hex,
    repository,
    revision: "main",
    status: "active",
    activeOffers,
    ...extra,
  }) as ModelRecord;

function setUp(models: ModelRecord[]) {
  const counters = watchedCounters({
    "acme/a": "qwen3",
    "acme/b": "qwen3",
    "acme/c": "gemma3",
    "acme/idle": "llama3.1",
    "acme/quarantined": "gpt-oss",
  });
  const logs = new LogCapture();
  const preloads = createTokenizerPreloads({
    tokens: counters,
    catalog: { listModels: async () => models },
    logger: pino({ level: "info" }, logs),
  });
  return { counters, preloads, logs };
}

describe("tokenizer preloads", () => {
  it("a sweep loads each tokenizer of the models with an active offer once, and nothing else", async () => {
    const { counters, preloads } = setUp([
      model("acme/a", 1),
      model("acme/b", 2),
      model("acme/c", 1),
      model("acme/unknown", 1),
      model("acme/idle", 0),
      model("acme/quarantined", 1, { quarantineReason: "bad_uri" }),
    ]);
    await preloads.sweep();
    // One load per tokenizer (qwen3 for a and b), none for a bound, idle or quarantined model.
    expect(counters.preloads.map((p) => p.sort()).sort()).toEqual([
      ["acme/a", "acme/b"],
      ["acme/c"],
    ]);
    const counted = (repository: string) => counters.forModel({ repository, revision: "main" });
    expect(["acme/a", "acme/b", "acme/c"].map((r) => counted(r)?.name)).toEqual([
      "qwen3",
      "qwen3",
      "gemma3",
    ]);
    expect(counted("acme/idle")).toBeUndefined();
    // Loaded ones are not loaded again.
    await preloads.sweep();
    expect(counters.preloads).toHaveLength(2);
    expect(preloads.readiness()).toEqual({ ok: true, loading: [], failed: [] });
  });

  it("is not ready while an active offer's tokenizer loads; a just-indexed model's load does not hold readiness", async () => {
    const { counters, preloads } = setUp([model("acme/a", 1)]);
    counters.hold("qwen3");
    const sweeping = preloads.sweep();
    await eventually(async () => counters.loading().includes("qwen3"));
    expect(preloads.readiness()).toEqual({ ok: false, loading: ["qwen3"], failed: [] });
    counters.release("qwen3");
    await sweeping;
    expect(preloads.readiness().ok).toBe(true);

    // The indexer wrote a model with no offer yet: loaded in the background, listed as loading,
    // but the gateway stays ready (no active offer needs it).
    counters.hold("llama3.1");
    const indexed = preloads.preload([{ repository: "acme/idle", revision: "main" }]);
    await eventually(async () => counters.loading().includes("llama3.1"));
    expect(preloads.readiness()).toEqual({ ok: true, loading: ["llama3.1"], failed: [] });
    counters.release("llama3.1");
    await indexed;
    expect(counters.forModel({ repository: "acme/idle", revision: "main" })).toBeDefined();
  });

  it("a load that fails is logged, named in readiness, never thrown, and tried again by the next sweep", async () => {
    const { counters, preloads, logs } = setUp([model("acme/c", 1)]);
    counters.breakLoads("gemma3");
    await expect(preloads.sweep()).resolves.toBeUndefined();
    expect(counters.forModel({ repository: "acme/c", revision: "main" })).toBeUndefined();
    expect(preloads.readiness()).toEqual({ ok: true, loading: [], failed: ["gemma3"] });
    expect(logs.text).toContain("tokenizer failed to load");
    expect(logs.text).toContain("acme/c@main");
    await preloads.sweep();
    expect(counters.preloads).toHaveLength(2);
  });

  it("counters that throw, or a catalog that fails, never fail a sweep", async () => {
    const logs = new LogCapture();
    const preloads = createTokenizerPreloads({
      tokens: {
        ...watchedCounters({}),
        meteringOf: () => {
          throw new TypeError("meteringOf is not a function");
        },
      },
      catalog: { listModels: async () => [model("acme/a", 1)] },
      logger: pino({ level: "info" }, logs),
    });
    await expect(preloads.sweep()).resolves.toBeUndefined();
    expect(logs.text).toContain("meteringOf is not a function");
    const failing = createTokenizerPreloads({
      tokens: watchedCounters({}),
      catalog: {
        listModels: () => Promise.reject(new Error("database_unavailable")),
      },
      logger: pino({ level: "info" }, logs),
    });
    await expect(failing.sweep()).resolves.toBeUndefined();
    expect(logs.text).toContain("database_unavailable");
  });
});
