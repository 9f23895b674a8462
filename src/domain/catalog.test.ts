import { describe, expect, it } from "vitest";
import {
  createCatalog,
  isEligible,
  ModelDirectory,
  type CatalogStore,
  type ModelRecord,
  type OfferRecord,
} from "./catalog.js";
import { boundCounter, type TokenCounters } from "./tokens.js";

const modelId = `0x${"ab".repeat(32)}` as const;

describe("ModelDirectory", () => {
  const directory = new ModelDirectory([{ id: "demo-chat", modelId, aliases: ["chat"] }]);

  it("resolves public id, alias and ModelID in any hex case", () => {
    expect(directory.resolve("demo-chat")).toBe(modelId);
    expect(directory.resolve("chat")).toBe(modelId);
    expect(directory.resolve(modelId.toUpperCase().replace("0X", "0x"))).toBe(modelId);
    expect(directory.resolve("unknown")).toBeUndefined();
  });

  it("names uncatalogued models by their ModelID", () => {
    const other = `0x${"cd".repeat(32)}` as const;
    expect(directory.publicId(other)).toBe(other);
    expect(directory.publicId(modelId)).toBe("demo-chat");
    expect(directory.aliases(modelId)).toEqual(["chat"]);
  });

  it("refuses ambiguous catalogs", () => {
    expect(
      () =>
        new ModelDirectory([
          { id: "a", modelId, aliases: [] },
          { id: "b", modelId: `0x${"cd".repeat(32)}`, aliases: ["a"] },
        ]),
    ).toThrow(/used twice/);
  });
});

describe("isEligible", () => {
  const offer: OfferRecord = {
    offerId: `0x${"01".repeat(32)}`,
    modelId,
    owner: `0x${"02".repeat(20)}`,
    operator: `0x${"02".repeat(20)}`,
    payout: `0x${"02".repeat(20)}`,
    status: "active",
    tariff: { version: 1n, inputPricePerMTok: 1n, outputPricePerMTok: 1n, wakeFee: 0n },
    region: "eu",
    hardware: "cpu",
    maxConcurrency: 1,
    capabilities: {},
    verifiedAt: 1000,
    verificationExpiresAt: 2000,
    endpointRegistered: true,
    endpointRunning: true,
    inFlight: 0,
  };
  const active = { status: "active" } as const;

  it("admits a verified, unexpired, active offer with a registered endpoint", () => {
    expect(isEligible(offer, active, 1500)).toBe(true);
  });

  it("refuses every missing condition", () => {
    expect(isEligible(offer, active, 2000)).toBe(false); // verification lapsed
    expect(isEligible({ ...offer, status: "paused" }, active, 1500)).toBe(false);
    expect(isEligible(offer, { status: "paused" }, 1500)).toBe(false);
    expect(isEligible({ ...offer, endpointRegistered: false }, active, 1500)).toBe(false);
    expect(
      isEligible(
        { ...offer, verifiedAt: undefined, verificationExpiresAt: undefined },
        active,
        1500,
      ),
    ).toBe(false);
  });
});

describe("the catalog's metering (issue 35)", () => {
  const record = {
    modelId,
    repository: "acme/model",
    revision: "main",
    status: "active",
    activeOffers: 1,
  } as ModelRecord;
  const store: CatalogStore = {
    listModels: async () => [record],
    getModel: async (id) => (id === modelId ? record : undefined),
    listOffers: async () => [],
    getOffer: async () => undefined,
  };
  let loaded = false;
  const tokens: Pick<TokenCounters, "forModel" | "meteringOf"> = {
    forModel: () => (loaded ? boundCounter : undefined),
    meteringOf: (m) =>
      m.repository === "acme/model" ? { kind: "exact", tokenizer: "qwen3" } : { kind: "bound" },
  };
  const directory = new ModelDirectory([{ id: "acme", modelId, aliases: [] }]);

  it("says how every model it returns is metered; bound without counters", async () => {
    const catalog = createCatalog({ store, directory, tokens });
    const exact = { kind: "exact", tokenizer: "qwen3" };
    expect((await catalog.listModels())[0]!.metering).toEqual(exact);
    expect((await catalog.getModel("acme")).metering).toEqual(exact);
    expect(catalog.metering({ repository: "other/model", revision: "x" })).toEqual({
      kind: "bound",
    });
    const plain = createCatalog({ store, directory });
    expect((await plain.getModel("acme")).metering).toEqual({ kind: "bound" });
    expect((await plain.routingView("acme")).model.tokenizerLoading).toBeUndefined();
  });

  it("marks a routing view whose tokenizer is still loading, asked at every use (the view is cached)", async () => {
    const catalog = createCatalog({ store, directory, tokens, routingCacheMs: 60_000 });
    loaded = false;
    const loading = await catalog.routingView("acme");
    expect(loading.model.tokenizerLoading).toBe(true);
    loaded = true;
    const ready = await catalog.routingView("acme");
    expect(ready.model.tokenizerLoading).toBeUndefined();
    expect(ready.model.metering).toEqual({ kind: "exact", tokenizer: "qwen3" });
  });
});
