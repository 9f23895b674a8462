import { describe, expect, it } from "vitest";
import { isEligible, ModelDirectory, type OfferRecord } from "./catalog.js";

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
