import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { createPgCatalogStore, upsertModel, upsertOffer, type OfferState } from "./catalog.js";

// The hidden reasoning ratio is a priced term of the tariff version (issue 35, item 9; migration
// 032; docs/decisions/metering-and-tokens.md "Hidden reasoning").

const modelId = `0x${"21".repeat(32)}` as Hex;
const offerId = `0x${"22".repeat(32)}` as Hex;
const address = `0x${"23".repeat(20)}` as Hex;

const test = useTestDatabase();

beforeAll(async () => {
  await upsertModel(
    test.db.pool,
    {
      modelId,
      creator: address,
      creditToken: address,
      repository: "openai/gpt-oss-20b",
      revision: "main",
      task: "chat",
      poolId: modelId,
      positionTokenId: 1n,
      status: "active",
    },
    1n,
  );
});

const offer = (version: bigint, ratio: unknown): OfferState => ({
  offerId,
  modelId,
  owner: address,
  operator: address,
  payout: address,
  status: "active",
  tariff: { version, inputPricePerMTok: 1n, outputPricePerMTok: 2n, wakeFee: 0n },
  region: "eu",
  hardware: "gpu",
  maxConcurrency: 4,
  capabilities: ratio === undefined ? {} : { hidden_reasoning_ratio: ratio as number },
});

describe("the hidden reasoning ratio of a tariff version", () => {
  it("is read from the capabilities with a new version and kept while the version stands", async () => {
    const store = createPgCatalogStore(test.db.pool);
    const ratioOf = async () => (await store.getOffer(offerId))?.tariff.hiddenReasoningRatio;
    await upsertOffer(test.db.pool, offer(1n, 4), 10n);
    expect(await ratioOf()).toBe(4n);
    // The operator raises it in the metadata alone: the version's ratio stands.
    await upsertOffer(test.db.pool, offer(1n, 64), 11n);
    expect(await ratioOf()).toBe(4n);
    expect((await store.getOffer(offerId))?.capabilities).toEqual({ hidden_reasoning_ratio: 64 });
    // A new tariff version takes the capabilities' ratio (quotes of version 1 no longer hold).
    await upsertOffer(test.db.pool, offer(2n, 64), 12n);
    expect(await ratioOf()).toBe(64n);
    // Dropped with the next version; what is not a ratio is none.
    await upsertOffer(test.db.pool, offer(3n, undefined), 13n);
    expect(await ratioOf()).toBeUndefined();
    await upsertOffer(test.db.pool, offer(4n, 65), 14n);
    expect(await ratioOf()).toBeUndefined();
  });
});
