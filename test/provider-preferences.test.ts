import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { createPgMeasurementStore } from "../src/adapters/pg/offer-measurements.js";
import { createMeasurementSync } from "../src/domain/reputation/measurement-sync.js";
import { createOfferMeasurements } from "../src/domain/reputation/measurements.js";
import { demoMetadata, demoTariff, id32 } from "../src/dev/demo-market.js";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { onboard, openPermit, setOffer } from "./helpers/market.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

const messages = [{ role: "user" as const, content: "hello gateway" }];
const tools = [
  {
    type: "function",
    function: { name: "get_weather", parameters: { type: "object", properties: {} } },
  },
];

/**
 * Provider preferences (DESIGN.md section 9) against three offers of `demo-chat`, each served
 * by its own fake provider: `cheap` (the demo offer) is the cheapest and slowest to its first
 * token, `quick` is the quickest to its first token and the slowest stream, `dear` is the most
 * expensive, the fastest stream, and the only one whose verification proved tools.
 */
describe("provider preferences (OpenRouter's provider object)", () => {
  let stack: TestStack;
  let fakes: Record<"cheap" | "quick" | "dear", FakeUpstream>;
  let cheap: Hex;
  let quick: Hex;
  let dear: Hex;
  const optionsOf = {
    // Far apart, so that a loaded machine's scheduling delays cannot swap the order: time to
    // first token quick << dear << cheap, output tokens per second dear >> cheap > quick.
    cheap: { stallBeforeHeadersMs: 300, delayMs: 90 },
    quick: { delayMs: 120 },
    dear: { stallBeforeHeadersMs: 150, delayMs: 3 },
  };

  const chat = (body: object, headers: Record<string, string> = {}) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        ...headers,
      },
      body: JSON.stringify({ model: "demo-chat", messages, ...body }),
    });
  const servedBy = async (body: object, headers: Record<string, string> = {}) => {
    const res = await chat(body, headers);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return res.headers.get("x-gateway-offer-id");
  };
  const calls = () => Object.values(fakes).reduce((n, f) => n + f.calls("/v1/chat/completions"), 0);

  beforeAll(async () => {
    const started = await startChatStack({ PERMIT_CACHE_MS: "0" });
    stack = started.stack;
    cheap = started.chatOffer;
    quick = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    dear = id32("offer:chat-prefs-dear");
    const operator = stack.clients.wallet(stack.roles.operator.privateKey);
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await operator.writeContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "createOffer",
        args: [
          dear,
          stack.demo.models[0]!.modelId,
          stack.roles.operator.address,
          stack.roles.operator.address,
          demoTariff,
          demoMetadata("ap-south", "gpu-h100"),
        ],
      }),
    });
    const times = (n: bigint) => ({
      input: demoTariff.inputPricePerMTok * n,
      output: demoTariff.outputPricePerMTok * n,
      wake: 0n,
    });
    await setOffer(stack, quick, { status: 0, tariff: times(2n) });
    await setOffer(stack, dear, { tariff: times(3n) });
    fakes = {
      cheap: started.fake,
      quick: await startFakeUpstream({ models: ["demo-chat"], chunks: 2 }),
      dear: await startFakeUpstream({ models: ["demo-chat"], chunks: 2, toolCalls: true }),
    };
    await onboard(stack, quick, fakes.quick.url);
    await onboard(stack, dear, fakes.dear.url);
    // What the gateway measures comes from served requests: a few streams on each offer.
    for (const [name, offer] of [
      ["cheap", cheap],
      ["quick", quick],
      ["dear", dear],
    ] as const) {
      fakes[name].setOptions(optionsOf[name]);
      for (let i = 0; i < 3; i++) expect(await servedBy({ offer, stream: true })).toBe(offer);
    }
  }, 120_000);
  afterAll(async () => {
    await fakes?.quick.stop();
    await fakes?.dear.stop();
    await fakes?.cheap.stop();
    await stack?.close();
  });
  beforeEach(() => {
    for (const name of ["cheap", "quick", "dear"] as const)
      fakes[name].setOptions({ failStatus: undefined, ...optionsOf[name] });
  });

  it("shows the features each offer's verification proved", async () => {
    const offers = (await json(await authed(stack, "/v1/models/demo-chat/offers"))).data as {
      offer_id: string;
      verified_features: string[];
    }[];
    const features = (id: Hex) => offers.find((o) => o.offer_id === id)?.verified_features;
    expect(features(dear)).toEqual(["json_schema", "stream_usage", "tools"]);
    expect(features(cheap)).toEqual(["json_schema", "stream_usage"]);
  });

  it("routes to the cheapest offer without preferences", async () => {
    expect(await servedBy({})).toBe(cheap);
  });

  it("order: the listed offers are tried first, in order", async () => {
    expect(await servedBy({ provider: { order: [dear, quick] } })).toBe(dear);
    expect(await servedBy({ provider: { order: [quick, dear] } })).toBe(quick);
  });

  it("order falls back to the other offers when the ordered one fails, unless allow_fallbacks is false", async () => {
    fakes.dear.setOptions({ failStatus: 500 });
    expect(await servedBy({ provider: { order: [dear] } })).toBe(cheap);

    const before = calls();
    const refused = await chat({ provider: { order: [dear], allow_fallbacks: false } });
    expect(refused.status).toBe(502);
    expect((await json(refused)).error.code).toBe("upstream_error");
    // Only the ordered offer was called.
    expect(calls()).toBe(before + 1);
  });

  it("only restricts routing to the listed offers, ignore excludes offers", async () => {
    expect(await servedBy({ provider: { only: [quick, dear] } })).toBe(quick);
    expect(await servedBy({ provider: { only: [dear] } })).toBe(dear);
    expect(await servedBy({ provider: { ignore: [cheap] } })).toBe(quick);
    expect(await servedBy({ provider: { ignore: [cheap, quick] } })).toBe(dear);
  });

  it("sort orders by price, by measured latency, and by measured throughput", async () => {
    expect(await servedBy({ provider: { sort: "price" } })).toBe(cheap);
    expect(await servedBy({ provider: { sort: "latency" } })).toBe(quick);
    expect(await servedBy({ provider: { sort: "throughput" } })).toBe(dear);
  });

  it("max_price excludes offers above it, and refuses clearly when none remain", async () => {
    const price = (n: bigint) => ({
      prompt: (demoTariff.inputPricePerMTok * n).toString(),
      completion: (demoTariff.outputPricePerMTok * n).toString(),
    });
    expect(await servedBy({ provider: { max_price: price(2n), sort: "latency" } })).toBe(quick);
    expect(await servedBy({ provider: { max_price: price(1n), sort: "throughput" } })).toBe(cheap);

    const before = calls();
    const res = await chat({
      provider: {
        max_price: { prompt: "1", completion: demoTariff.outputPricePerMTok.toString() },
      },
    });
    expect(res.status).toBe(503);
    const { error } = await json(res);
    expect(error.code).toBe("no_eligible_offer");
    expect(error.message).toContain("max_price");
    expect(calls()).toBe(before);
  });

  it("require_parameters routes a tools request only to the offer whose verification proved tools", async () => {
    expect(await servedBy({ tools })).toBe(cheap);
    const before = fakes.dear.calls("/v1/chat/completions");
    expect(await servedBy({ tools, provider: { require_parameters: true } })).toBe(dear);
    expect(fakes.dear.calls("/v1/chat/completions")).toBe(before + 1);
    const res = await chat({ tools, provider: { require_parameters: true, ignore: [dear] } });
    expect(res.status).toBe(503);
    expect((await json(res)).error.message).toContain("require_parameters");
  });

  it("a quote's or a permit's offer pin still wins over the preferences, but not over max_price", async () => {
    const quoted = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
    const quote = await json(quoted);
    expect(quote.offer_id).toBe(cheap);
    expect(
      await servedBy(
        { provider: { ignore: [cheap], order: [dear] } },
        { "x-gateway-quote": quote.quote_id },
      ),
    ).toBe(cheap);

    const pinned = await openPermit(stack, { offerId: quick, deposit: 10n ** 18n });
    expect(
      await servedBy(
        { provider: { order: [dear], allow_fallbacks: false } },
        { "x-gateway-permit": pinned },
      ),
    ).toBe(quick);
    // The prices the client set hold whatever pins the request (test/pinned-prices.test.ts).
    const before = calls();
    const refused = await chat(
      { provider: { order: [dear], max_price: { prompt: "1" } } },
      { "x-gateway-permit": pinned },
    );
    expect(refused.status).toBe(503);
    const { error } = await json(refused);
    expect(error.code).toBe("no_eligible_offer");
    expect(error.message).toContain(`offer ${quick} costs up to`);
    expect(calls()).toBe(before);
  });

  it("a quote respects the preferences it is made with", async () => {
    const res = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "demo-chat", messages, provider: { only: [dear] } }),
    });
    expect((await json(res)).offer_id).toBe(dear);
  });

  it("the Responses and Messages dialects pass the provider object through", async () => {
    const responses = await authed(stack, "/v1/responses", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", input: "hi", provider: { only: [dear] } }),
    });
    expect(responses.status).toBe(200);
    expect(responses.headers.get("x-gateway-offer-id")).toBe(dear);
    const messagesRes = await authed(stack, "/v1/messages", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({
        model: "demo-chat",
        max_tokens: 16,
        messages,
        provider: { only: [quick] },
      }),
    });
    expect(messagesRes.status).toBe(200);
    expect(messagesRes.headers.get("x-gateway-offer-id")).toBe(quick);
  });

  it("never shows the provider the client's offer or provider members (JSON, SSE, dialects)", async () => {
    // What one client could leak to a provider through the body: its pin and the competitors
    // it ranks, restricts or excludes. The provider gets the body without them.
    const received = async (fake: FakeUpstream, send: () => Promise<Response>) => {
      const chats = () => fake.requests.filter((r) => r.path === "/v1/chat/completions");
      const before = chats().length;
      const res = await send();
      const text = await res.text();
      expect(res.status, text).toBe(200);
      const bodies = chats()
        .slice(before)
        .map((r) => r.body as Record<string, unknown>);
      expect(bodies.length).toBeGreaterThan(0);
      for (const body of bodies) {
        expect(body).not.toHaveProperty("offer");
        expect(body).not.toHaveProperty("provider");
        expect(body).toHaveProperty("messages");
      }
      return bodies;
    };
    const json = await received(fakes.dear, () =>
      chat({
        offer: dear,
        provider: { order: [dear, quick], ignore: [cheap], sort: "price" },
        x_keep: { offer: "nested members stay" },
      }),
    );
    // An unknown member is not forwarded either (issue 35: the provider sees an allowlist).
    expect(json[0]).toMatchObject({ model: "demo-chat" });
    expect(json[0]).not.toHaveProperty("x_keep");
    const sse = await received(fakes.quick, () =>
      chat({ stream: true, offer: null, provider: { only: [quick] } }),
    );
    expect(sse[0]).toMatchObject({ stream: true, stream_options: { include_usage: true } });
    const post = (path: string, body: object) =>
      authed(stack, path, {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
        body: JSON.stringify(body),
      });
    await received(fakes.dear, () =>
      post("/v1/responses", { model: "demo-chat", input: "hi", offer: dear, stream: true }),
    );
    await received(fakes.quick, () =>
      post("/v1/messages", {
        model: "demo-chat",
        max_tokens: 16,
        messages,
        provider: { only: [quick] },
      }),
    );
  });

  it("refuses an invalid provider object 400 invalid_request naming the field, calling no provider", async () => {
    const before = calls();
    for (const [provider, field] of [
      [{ order: ["chat-eu"] }, "provider.order[0]"],
      [{ sort: "cheapest" }, "provider.sort"],
      [{ max_price: { prompt: 1 } }, "provider.max_price.prompt"],
      [{ allow_fallbacks: "no" }, "provider.allow_fallbacks"],
      [{ quantizations: ["int8"] }, "provider.quantizations"],
      ["fast", "provider"],
    ] as const) {
      const res = await chat({ provider });
      expect(res.status).toBe(400);
      const { error } = await json(res);
      expect(error.code).toBe("invalid_request");
      expect(error.message).toContain(`'${field}'`);
    }
    expect(calls()).toBe(before);
  });

  it("shares measurements between processes through the database", async () => {
    const store = createPgMeasurementStore(stack.gateway.db.pool);
    // An offer the running gateway never served (its own windows are shared the same way).
    const unserved = id32("offer:measured-elsewhere");
    const clock = () => Math.floor(Date.now() / 1000);
    const other = createOfferMeasurements({ instanceId: "gw_other" });
    other.served(unserved, { latencyMs: 5000, outputTokens: 10n, generationMs: 10_000 });
    other.failed(unserved);
    const otherSync = createMeasurementSync({
      measurements: other,
      store,
      instanceId: "gw_other",
      intervalMs: 1000,
      clock,
    });
    await otherSync.runOnce();
    const mine = createOfferMeasurements({ instanceId: "gw_mine" });
    const mineSync = createMeasurementSync({
      measurements: mine,
      store,
      instanceId: "gw_mine",
      intervalMs: 1000,
      clock,
    });
    await mineSync.runOnce();
    expect(mine.get(unserved)).toEqual({
      latencyMs: 5000,
      throughput: 1,
      served: 1,
      failed: 1,
      samples: 1,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: false,
    });
    mine.served(unserved, { latencyMs: 1000, outputTokens: 10n, generationMs: 1000 });
    mine.served(unserved, { latencyMs: 1000, outputTokens: 10n, generationMs: 1000 });
    // Latencies 1000, 1000, 5000: the median is this process's.
    expect(mine.get(unserved)).toMatchObject({ latencyMs: 1000, served: 3, failed: 1 });
    // A process whose window no longer holds the offer deletes its row: it stops counting.
    await createMeasurementSync({
      measurements: createOfferMeasurements({ instanceId: "gw_other" }),
      store,
      instanceId: "gw_other",
      intervalMs: 1000,
      clock,
    }).runOnce();
    await mineSync.runOnce();
    expect(mine.get(unserved)).toMatchObject({ latencyMs: 1000, served: 2, failed: 0 });
  });
});
