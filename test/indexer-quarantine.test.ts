import fc from "fast-check";
import {
  concat,
  encodeAbiParameters,
  parseAbiParameters,
  toFunctionSelector,
  type Hex,
} from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { modelFromChain, offerFromChain } from "../src/adapters/chain/catalog-values.js";
import { createIndexer, writeCatalogRows } from "../src/adapters/chain/indexer.js";
import {
  createPgCatalogStore,
  upsertModel,
  upsertOffer,
  type ModelState,
  type OfferState,
} from "../src/adapters/pg/catalog.js";
import { isEligible } from "../src/domain/catalog.js";
import { demoMetadata, demoTariff, id32 } from "../src/dev/demo-market.js";
import { rawModelArb, rawOfferArb } from "./helpers/chain-values.js";
import { testModel, testOffer, now } from "./helpers/chat-market.js";
import { createTestDatabase, useTestDatabase } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

// Issue 12, item 6: one operator writing a value the catalog cannot hold must quarantine that
// offer (or model) only, never stop indexing. Runs on PGlite, and on PostgreSQL with
// TEST_DATABASE_URL set.

const modelId = id32("model:quarantine-unit");
const validModel: ModelState = {
  modelId,
  creator: `0x${"01".repeat(20)}`,
  creditToken: `0x${"02".repeat(20)}`,
  repository: "org/model",
  revision: "v1",
  task: "chat",
  poolId: `0x${"03".repeat(32)}`,
  positionTokenId: 1n,
  status: "active",
};
const validOffer = (offerId: Hex, overrides: Partial<OfferState> = {}): OfferState => ({
  offerId,
  modelId,
  owner: `0x${"04".repeat(20)}`,
  operator: `0x${"04".repeat(20)}`,
  payout: `0x${"04".repeat(20)}`,
  status: "active",
  tariff: { version: 1n, inputPricePerMTok: 1n, outputPricePerMTok: 1n, wakeFee: 0n },
  region: "eu",
  hardware: "cpu",
  maxConcurrency: 8,
  capabilities: {},
  ...overrides,
});

describe("quarantine: eligibility", () => {
  it("never routes to a quarantined offer, or to an offer of a quarantined model", () => {
    const offer = testOffer(`0x${"0a".repeat(32)}`);
    expect(isEligible(offer, testModel(1), now)).toBe(true);
    expect(isEligible({ ...offer, quarantineReason: "region_has_nul" }, testModel(1), now)).toBe(
      false,
    );
    expect(isEligible(offer, { ...testModel(1), quarantineReason: "task_has_nul" }, now)).toBe(
      false,
    );
  });
});

describe("quarantine: the database", () => {
  const database = useTestDatabase();
  beforeAll(async () => {
    await upsertModel(database.db.pool, validModel, 1n);
  });

  it("accepts the row of any chain offer or model, or its quarantine (no savepoint needed)", async () => {
    const pool = database.db.pool;
    const store = createPgCatalogStore(pool);
    let n = 0;
    await fc.assert(
      fc.asyncProperty(
        rawOfferArb(fc.constant(modelId)),
        rawModelArb,
        async (rawOffer, rawModel) => {
          const offerId = id32(`offer:prop:${n}`);
          const otherModel = id32(`model:prop:${n++}`);
          const offer = offerFromChain(offerId, rawOffer);
          const model = modelFromChain(otherModel, rawModel);
          await upsertOffer(pool, offer, 1n);
          await upsertModel(pool, model, 1n);
          const stored = await store.getOffer(offerId);
          expect(stored).toMatchObject({
            region: offer.region,
            hardware: offer.hardware,
            maxConcurrency: offer.maxConcurrency,
          });
          expect(stored?.quarantineReason).toBe(offer.quarantineReason);
          const { rows } = await pool.query<{
            repository: string;
            quarantine_reason: string | null;
          }>("SELECT repository, quarantine_reason FROM models WHERE model_id = $1", [otherModel]);
          expect(rows[0]).toEqual({
            repository: model.repository,
            quarantine_reason: model.quarantineReason ?? null,
          });
        },
      ),
      { numRuns: 300 },
    );
  });

  it("stores a row the database refuses as a quarantine and keeps the range's other rows", async () => {
    const pool = database.db.pool;
    const bad = id32("offer:db-rejected");
    const good = id32("offer:db-good");
    const badModel = id32("model:db-rejected");
    // Past the validation on purpose: this is the savepoint's job.
    const rows = {
      models: [{ ...validModel, modelId: badModel, repository: "a\u0000b" }],
      offers: [
        validOffer(bad, { region: "eu\u0000west" }),
        validOffer(bad.replace(/.$/, "f") as Hex, { maxConcurrency: 2 ** 31 }),
        validOffer(good, { region: "us-east" }),
      ],
    };
    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      const changes = await writeCatalogRows(db, rows, 5n);
      await db.query("COMMIT");
      expect(changes).toEqual([
        { kind: "model", id: badModel, reason: expect.stringMatching(/^db_rejected_22/) },
        { kind: "offer", id: bad, reason: expect.stringMatching(/^db_rejected_22/) },
        {
          kind: "offer",
          id: bad.replace(/.$/, "f"),
          reason: expect.stringMatching(/^db_rejected_22/),
        },
      ]);
    } finally {
      db.release();
    }
    const store = createPgCatalogStore(pool);
    expect(await store.getOffer(good)).toMatchObject({ region: "us-east" });
    expect((await store.getOffer(good))?.quarantineReason).toBeUndefined();
    expect(await store.getOffer(bad)).toMatchObject({
      region: "",
      maxConcurrency: 0,
      quarantineReason: expect.stringMatching(/^db_rejected_/),
    });
    expect(await store.getModel(badModel)).toBeUndefined();
  });
});

/**
 * `setOfferMetadata` calldata with the strings given as bytes (the same encoding), so a test can
 * put invalid UTF-8 on chain; the selector is the real one's.
 */
function rawSetOfferMetadata(
  offerId: Hex,
  metadata: { region: Hex; hardware: Hex; maxConcurrency: number; capabilities: Hex },
): Hex {
  const selector = toFunctionSelector("setOfferMetadata(bytes32,(string,string,uint32,string))");
  const args = encodeAbiParameters(parseAbiParameters("bytes32, (bytes, bytes, uint32, bytes)"), [
    offerId,
    [metadata.region, metadata.hardware, metadata.maxConcurrency, metadata.capabilities],
  ]);
  return concat([selector, args]);
}

describe("quarantine: indexing poisoned values on anvil", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  const messages = [{ role: "user", content: "hi" }];
  const marker = "POISON-MARKER";

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack());
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const send = async (
    key: Hex,
    functionName: string,
    args: readonly unknown[],
  ): Promise<bigint> => {
    const wallet = stack.clients.wallet(key);
    const hash = await wallet.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName,
      args,
    } as unknown as Parameters<typeof wallet.writeContract>[0]);
    const receipt = await stack.clients.publicClient.waitForTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
    return receipt.blockNumber;
  };
  const operatorKey = () => stack.roles.operator.privateKey;
  const creatorKey = () => stack.roles.creator.privateKey;
  const createOffer = (offerId: Hex, model: Hex, metadata: object) =>
    send(operatorKey(), "createOffer", [
      offerId,
      model,
      stack.roles.operator.address,
      stack.roles.operator.address,
      demoTariff,
      metadata,
    ]);
  const cursor = async () =>
    BigInt(
      (
        await stack.database.db.pool.query<{ block_number: string }>(
          "SELECT block_number FROM chain_cursors WHERE name = 'market'",
        )
      ).rows[0]!.block_number,
    );
  const indexedTo = async (block: bigint) => {
    await eventually(async () => {
      await stack.gateway.indexer.syncOnce().catch(() => undefined);
      return (await cursor()) >= block;
    }, 15_000);
  };
  const health = async (offerId: Hex) => {
    const res = await authed(stack, `/v1/provider-offers/${offerId}/health`);
    expect(res.status).toBe(200);
    return json(res);
  };
  const listedOffers = async (model: string): Promise<string[]> =>
    (await json(await authed(stack, `/v1/models/${model}/offers`))).data.map(
      (o: { offer_id: string }) => o.offer_id,
    );
  const chat = () =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
  const warnings = (id: Hex) =>
    stack.logs.lines
      .map(
        (l) =>
          JSON.parse(l) as {
            level: number;
            msg: string;
            offerId?: string;
            modelId?: string;
            reason?: string;
          },
      )
      .filter(
        (l) =>
          l.level === 40 && l.msg.includes("quarantined") && (l.offerId === id || l.modelId === id),
      );

  it("quarantines the poisoned offers and model only, and indexes everything after them", async () => {
    const chatModel = stack.demo.models[0]!.modelId;
    const coderOffer = stack.demo.offers.find((o) => o.modelId === stack.demo.models[1]!.modelId)!;
    expect((await chat()).status).toBe(200);

    // The poison, each in its own block.
    const bigConcurrency = id32("offer:q:concurrency");
    const longHardware = id32("offer:q:hardware");
    const nulJson = id32("offer:q:json");
    const badModel = id32("model:q:nul");
    const offerOfBadModel = id32("offer:q:of-bad-model");
    await createOffer(bigConcurrency, chatModel, {
      ...demoMetadata("eu", "gpu"),
      maxConcurrency: 2 ** 31,
    });
    await createOffer(longHardware, chatModel, demoMetadata("eu", `${marker}${"x".repeat(2000)}`));
    await createOffer(nulJson, chatModel, {
      ...demoMetadata("eu", "gpu"),
      capabilities: `{"note":"${marker}\\u0000"}`,
    });
    await send(operatorKey(), "setOfferMetadata", [
      chatOffer,
      demoMetadata(`eu${marker}\u0000west`, "gpu"),
    ]);
    await send(creatorKey(), "createModel", [
      badModel,
      stack.demo.models[0]!.creditToken,
      `org/${marker}\u0000`,
      "v1",
      "chat",
      id32("pool:q"),
      7n,
    ]);
    await send(creatorKey(), "setModelStatus", [badModel, 1]);
    await createOffer(offerOfBadModel, badModel, demoMetadata("eu", "gpu"));
    // Invalid UTF-8 (viem would decode it as U+FFFD; the indexer reads the bytes).
    const wallet = stack.clients.wallet(operatorKey());
    const invalidUtf8 = await wallet.sendTransaction({
      to: stack.demo.market,
      data: rawSetOfferMetadata(coderOffer.offerId, {
        region: "0x65ff75",
        hardware: "0x677075",
        maxConcurrency: 4,
        capabilities: "0x7b7d",
      }),
    });
    expect(
      (await stack.clients.publicClient.waitForTransactionReceipt({ hash: invalidUtf8 })).status,
    ).toBe("success");

    // Valid changes after the poison: a tariff change of the paused demo-chat offer, a new
    // model with an offer.
    const pausedOffer = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    await send(operatorKey(), "setOfferTariff", [pausedOffer, 5n, 6n, 0n]);
    const newModel = id32("model:q:fresh");
    const newOffer = id32("offer:q:fresh");
    await send(creatorKey(), "createModel", [
      newModel,
      stack.demo.models[0]!.creditToken,
      "org/fresh",
      "v1",
      "chat",
      id32("pool:fresh"),
      8n,
    ]);
    await send(creatorKey(), "setModelStatus", [newModel, 1]);
    const last = await createOffer(newOffer, newModel, demoMetadata("ap-south", "gpu-l4"));

    await indexedTo(last);

    // Later valid changes are indexed.
    expect(await listedOffers(newModel)).toEqual([newOffer]);
    const models = (await json(await authed(stack, "/v1/models"))).data.map(
      (m: { model_id: string }) => m.model_id,
    );
    expect(models).toContain(newModel);
    expect(models).not.toContain(badModel);
    const paused = (await json(await authed(stack, "/v1/models/demo-chat/offers?status=paused")))
      .data[0];
    expect(paused).toMatchObject({ offer_id: pausedOffer, tariff_version: "2" });

    // The poisoned ones are quarantined: stored, not listed, not routed to, visible in health.
    const expected: [Hex, string][] = [
      [bigConcurrency, "max_concurrency_out_of_range"],
      [longHardware, "hardware_too_long"],
      [nulJson, "capabilities_has_nul"],
      [chatOffer, "region_has_nul"],
      [coderOffer.offerId, "region_invalid_utf8"],
      [offerOfBadModel, "model_quarantined"],
    ];
    for (const [offerId, reason] of expected) {
      expect(await health(offerId)).toMatchObject({
        offer_id: offerId,
        status: "active",
        quarantine_reason: reason,
      });
    }
    expect((await health(pausedOffer)).quarantine_reason).toBeNull();
    expect(await listedOffers("demo-chat")).toEqual([pausedOffer]);
    expect(await listedOffers("demo-coder")).toEqual([]);
    expect((await authed(stack, `/v1/models/${badModel}`)).status).toBe(404);
    const { rows } = await stack.database.db.pool.query<{ quarantine_reason: string }>(
      "SELECT quarantine_reason FROM models WHERE model_id = $1",
      [badModel],
    );
    expect(rows).toEqual([{ quarantine_reason: "repository_has_nul" }]);

    // The quarantined chat offer was the only eligible one.
    const refused = await chat();
    expect(refused.status).toBe(503);
    expect((await json(refused)).error.code).toBe("no_eligible_offer");

    // Logged once each, with the id and the reason, never the value.
    for (const [offerId, reason] of expected.filter(([, r]) => r !== "model_quarantined")) {
      expect(warnings(offerId)).toEqual([expect.objectContaining({ offerId, reason })]);
    }
    expect(warnings(badModel)).toEqual([
      expect.objectContaining({ modelId: badModel, reason: "repository_has_nul" }),
    ]);
    expect(stack.logs.text).not.toContain(marker);
  });

  it("logs a quarantine once, and lifts it with a later valid update", async () => {
    const bigConcurrency = id32("offer:q:concurrency");
    // Still poisoned: indexed again, not logged again.
    await send(operatorKey(), "setOfferTariff", [bigConcurrency, 2n, 2n, 0n]);
    const block = await send(operatorKey(), "setOfferMetadata", [
      chatOffer,
      demoMetadata("eu-west", "gpu-a100"),
    ]);
    await indexedTo(block);
    expect(warnings(bigConcurrency)).toHaveLength(1);
    expect((await health(bigConcurrency)).quarantine_reason).toBe("max_concurrency_out_of_range");

    expect(await health(chatOffer)).toMatchObject({ quarantine_reason: null, status: "active" });
    expect(await listedOffers("demo-chat")).toContain(chatOffer);
    const offer = (await json(await authed(stack, "/v1/models/demo-chat"))).offers.find(
      (o: { offer_id: string }) => o.offer_id === chatOffer,
    );
    expect(offer).toMatchObject({ region: "eu-west", hardware: "gpu-a100", max_concurrency: 8 });
    expect(
      stack.logs.lines.some((l) => {
        const line = JSON.parse(l) as { msg: string; offerId?: string };
        return line.msg === "offer quarantine lifted" && line.offerId === chatOffer;
      }),
    ).toBe(true);
    const res = await chat();
    expect(res.status).toBe(200);
  });

  it("stores an offer whose model predates START_BLOCK, with its model", async () => {
    const pausedOffer = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    const block = await send(operatorKey(), "setOfferTariff", [pausedOffer, 7n, 7n, 0n]);
    const fresh = await createTestDatabase();
    try {
      const indexer = createIndexer({
        client: stack.clients.publicClient,
        market: stack.demo.market,
        pool: fresh.db.pool,
        confirmations: 0,
        startBlock: block,
        pollIntervalMs: 100,
        logger: stack.logger,
      });
      while ((await indexer.syncOnce())?.behind === true);
      const store = createPgCatalogStore(fresh.db.pool);
      expect(await store.getOffer(pausedOffer)).toMatchObject({
        offerId: pausedOffer,
        status: "paused",
      });
      expect(await store.getModel(stack.demo.models[0]!.modelId)).toMatchObject({
        repository: "demo/chat-small",
      });
    } finally {
      await fresh.drop();
    }
  });
});
