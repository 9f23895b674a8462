import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CatalogService } from "../gen/gateway/v1/catalog_pb.js";
import { MeteringKind } from "../gen/gateway/v1/market_pb.js";
import { QuoteService } from "../gen/gateway/v1/quote_pb.js";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { demoChatOffer, onboard, openPermit, setOfferMetadata } from "./helpers/market.js";
import { authed, eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";
import { watchedCounters, type WatchedCounters } from "./helpers/watched-counters.js";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { demoMetadata, id32 } from "../src/dev/demo-market.js";

/**
 * Issue 35, items 5 and 10: every tokenizer a model with an active offer needs is loaded before
 * the gateway serves (at start-up, and when the indexer brings news), never on a request's path;
 * `/ready` names what is still loading; a model whose tokenizer loads is listed but not routable.
 * The catalog, quotes and the RPC say how each model and offer is metered, and
 * `provider.require_exact_metering` refuses byte-bound metering.
 */
describe("tokenizers loaded before served, metering shown", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let coderFake: FakeUpstream;
  let permits: { chat: Hex; coder: Hex };
  let coderOffer: Hex;
  // The demo's two models span two embedded tokenizers.
  const counters: WatchedCounters = watchedCounters({
    "demo/chat-small": "gemma3",
    "demo/coder-small": "llama3.1",
  });
  let atStart: { preloads: number; notLoaded: number; loading: readonly string[] };
  /** Whether the gateway had started (and listened) while its tokenizers were still loading. */
  let startedWhileLoading: boolean | undefined;

  beforeAll(async () => {
    // The loads are held until the test has seen the gateway wait for them.
    counters.hold("gemma3");
    counters.hold("llama3.1");
    let started = false;
    const starting = startTestStack(
      // No routing cache: a route a test changes holds at once.
      { ALLOW_PRIVATE_ENDPOINTS: "true", PROBE_INTERVAL_MS: "600000", ROUTING_CACHE_MS: "0" },
      { tokens: counters },
    ).then((running) => {
      started = true;
      return running;
    });
    starting.catch(() => undefined);
    await eventually(async () => counters.loading().length === 2, 60_000);
    // Long enough for a gateway that did not wait to answer the stack's first requests.
    await new Promise((r) => setTimeout(r, 2000));
    startedWhileLoading = started;
    counters.release("gemma3");
    counters.release("llama3.1");
    stack = await starting;
    atStart = {
      preloads: counters.preloads.length,
      notLoaded: counters.notLoaded.length,
      loading: counters.loading(),
    };
    const coderModel = stack.demo.models[1]!.modelId;
    coderOffer = stack.demo.offers.find(
      (o) => o.status === "active" && o.modelId === coderModel,
    )!.offerId;
    fake = await startFakeUpstream({ models: ["demo-chat"], chunks: 2 });
    await onboard(stack, demoChatOffer(stack), fake.url);
    coderFake = await startFakeUpstream({ models: ["demo-coder"], chunks: 2 });
    await onboard(stack, coderOffer, coderFake.url);
    permits = {
      chat: await openPermit(stack, { deposit: 10n ** 24n }),
      coder: await openPermit(stack, { deposit: 10n ** 24n, model: 1 }),
    };
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await coderFake?.stop();
    await stack?.close();
  });

  const chat = (model: "demo-chat" | "demo-coder", extra: object = {}) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": model === "demo-chat" ? permits.chat : permits.coder,
      },
      body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], ...extra }),
    });
  const quote = async (model: string) =>
    authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }] }),
    });
  const ready = async () => {
    const res = await fetch(`${stack.gateway.url}/ready`);
    return { status: res.status, body: await json(res) };
  };

  it("loads every active offer's tokenizer before it listens; the first request of each model loads nothing", async () => {
    // The start-up waited for both tokenizers before it listened, and nothing was loading after.
    expect(startedWhileLoading).toBe(false);
    expect([...new Set(counters.preloads.flat())].sort()).toEqual([
      "demo/chat-small",
      "demo/coder-small",
    ]);
    expect(atStart.loading).toEqual([]);
    expect(await ready()).toMatchObject({
      status: 200,
      body: { status: "ready", checks: { tokenizers: { ok: true, loading: [], failed: [] } } },
    });
    for (const model of ["demo-chat", "demo-coder"] as const) {
      const res = await chat(model);
      expect(res.status, model).toBe(200);
      await res.text();
    }
    // No request asked for a load, nor found a tokenizer missing.
    expect(counters.preloads.length).toBe(atStart.preloads);
    expect(counters.notLoaded.length).toBe(atStart.notLoaded);
  });

  it("shows how each model, offer and quote is metered, over REST and RPC", async () => {
    const models = (await json(await authed(stack, "/v1/models"))).data as {
      id: string;
      metering: string;
      tokenizer: string | null;
    }[];
    expect(
      models
        .map(({ id, metering, tokenizer }) => ({ id, metering, tokenizer }))
        .sort((a, b) => a.id.localeCompare(b.id)),
    ).toEqual([
      { id: "demo-chat", metering: "exact", tokenizer: "gemma3" },
      { id: "demo-coder", metering: "exact", tokenizer: "llama3.1" },
    ]);
    const withOffers = await json(await authed(stack, "/v1/models/demo-chat"));
    expect(withOffers).toMatchObject({ metering: "exact", tokenizer: "gemma3" });
    expect(withOffers.offers.length).toBeGreaterThan(0);
    for (const offer of withOffers.offers)
      expect(offer).toMatchObject({ metering: "exact", tokenizer: "gemma3" });
    const offers = (await json(await authed(stack, "/v1/models/demo-coder/offers"))).data;
    for (const offer of offers)
      expect(offer).toMatchObject({ metering: "exact", tokenizer: "llama3.1" });
    expect(await json(await quote("demo-chat"))).toMatchObject({
      metering: "exact",
      tokenizer: "gemma3",
    });

    // A model no tokenizer is registered for: bound, everywhere.
    counters.route("demo/coder-small", undefined);
    try {
      const coder = await json(await authed(stack, "/v1/models/demo-coder"));
      expect(coder).toMatchObject({ metering: "bound", tokenizer: null });
      for (const offer of coder.offers)
        expect(offer).toMatchObject({ metering: "bound", tokenizer: null });
      expect(await json(await quote("demo-coder"))).toMatchObject({
        metering: "bound",
        tokenizer: null,
      });

      const client = grpcClient(stack.gateway.url);
      const auth = { authorization: `Bearer ${stack.apiKey}` };
      try {
        const got = await grpcUnary(
          client,
          CatalogService.method.getModel,
          { id: "demo-chat" },
          auth,
        );
        expect(got.model).toMatchObject({ metering: MeteringKind.EXACT, tokenizer: "gemma3" });
        expect(got.offers.every((o) => o.metering === MeteringKind.EXACT)).toBe(true);
        const listed = await grpcUnary(client, CatalogService.method.listModels, {}, auth);
        expect(listed.models.find((m) => m.id === "demo-coder")).toMatchObject({
          metering: MeteringKind.BOUND,
          tokenizer: "",
        });
        const quoted = await grpcUnary(
          client,
          QuoteService.method.createQuote,
          {
            body: new TextEncoder().encode(
              JSON.stringify({ model: "demo-coder", messages: [{ role: "user", content: "hi" }] }),
            ),
          },
          auth,
        );
        expect(quoted.quote).toMatchObject({ metering: MeteringKind.BOUND, tokenizer: "" });
      } finally {
        client.close();
      }
    } finally {
      counters.route("demo/coder-small", "llama3.1");
    }
  });

  it("provider.require_exact_metering excludes bound offers, refusing a request only they could serve", async () => {
    const exact = await chat("demo-chat", { provider: { require_exact_metering: true } });
    expect(exact.status).toBe(200);
    await exact.text();
    counters.route("demo/coder-small", undefined);
    try {
      // Without the preference the bound offer serves; with it, refused, naming why.
      const plain = await chat("demo-coder");
      expect(plain.status).toBe(200);
      await plain.text();
      const refused = await chat("demo-coder", { provider: { require_exact_metering: true } });
      expect(refused.status).toBe(503);
      const { error } = await json(refused);
      expect(error.code).toBe("no_eligible_offer");
      expect(error.message).toContain("provider.require_exact_metering");
      expect(error.message).toContain("byte bound");
      // Pinned to the offer, the same.
      const pinned = await chat("demo-coder", {
        offer: coderOffer,
        provider: { require_exact_metering: true },
      });
      expect(pinned.status).toBe(503);
      expect((await json(pinned)).error.message).toContain("provider.require_exact_metering");
    } finally {
      counters.route("demo/coder-small", "llama3.1");
    }
  });

  it("a model whose tokenizer loads is listed but not routable, and /ready names it until it is loaded", async () => {
    // The operator's registry now counts the coder model with a tokenizer not loaded yet: the
    // next indexed change loads it, in the background.
    counters.hold("qwen3");
    counters.route("demo/coder-small", "qwen3");
    const metadata = demoMetadata("eu-test", "gpu-test");
    await setOfferMetadata(stack, coderOffer, metadata);
    await eventually(async () => counters.loading().includes("qwen3"));
    const loading = await ready();
    expect(loading.status).toBe(503);
    expect(loading.body.checks.tokenizers).toMatchObject({ ok: false, loading: ["qwen3"] });
    // Listed, with its metering...
    const listed = (await json(await authed(stack, "/v1/models"))).data;
    expect(listed.find((m: { id: string }) => m.id === "demo-coder")).toMatchObject({
      metering: "exact",
      tokenizer: "qwen3",
    });
    // ...but not routable, and the request does not wait for the load.
    const before = counters.preloads.length;
    const refused = await chat("demo-coder");
    expect(refused.status).toBe(503);
    const { error } = await json(refused);
    expect(error.code).toBe("no_eligible_offer");
    expect(error.message).toContain("still loading");
    expect(counters.preloads.length).toBe(before);
    // The other model serves meanwhile.
    const other = await chat("demo-chat");
    expect(other.status).toBe(200);
    await other.text();

    counters.release("qwen3");
    await eventually(async () => (await ready()).status === 200);
    const served = await chat("demo-coder");
    expect(served.status).toBe(200);
    await served.text();
  });

  it("loads the tokenizer of a model the indexer adds, before it has an offer", async () => {
    counters.route("acme/new-model", "gpt-oss");
    const creator = stack.clients.wallet(stack.roles.creator.privateKey);
    const hash = await creator.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "createModel",
      args: [
        id32("model:acme-new"),
        stack.demo.models[0]!.creditToken,
        "acme/new-model",
        "v1",
        "chat",
        id32("pool:acme-new"),
        99n,
      ],
    });
    await stack.clients.publicClient.waitForTransactionReceipt({ hash });
    await stack.gateway.indexer.syncOnce();
    await eventually(async () =>
      counters.preloads.some((models) => models.includes("acme/new-model")),
    );
    await eventually(
      async () => counters.forModel({ repository: "acme/new-model", revision: "v1" }) !== undefined,
    );
    // Listed, metered by its tokenizer, though it has no offer yet.
    const listed = (await json(await authed(stack, "/v1/models"))).data;
    expect(
      listed.find((m: { repository: string }) => m.repository === "acme/new-model"),
    ).toMatchObject({ metering: "exact", tokenizer: "gpt-oss" });
  });

  it("a load that fails is logged; its model stays unroutable, the gateway ready", async () => {
    counters.breakLoads("llama3.2-broken");
    counters.route("demo/coder-small", "llama3.2-broken");
    try {
      await setOfferMetadata(stack, coderOffer, demoMetadata("eu-test-2", "gpu-test"));
      // Ready once the failure is known (another check, the database's or the chain's, may
      // answer late on a loaded machine: the wait is for both, and times out if the failed
      // load kept the gateway unready).
      let state = await ready();
      await eventually(async () => {
        state = await ready();
        return state.body.checks.tokenizers.failed.length > 0 && state.status === 200;
      });
      expect(state.status).toBe(200);
      expect(state.body.checks.tokenizers).toMatchObject({
        ok: true,
        loading: [],
        failed: ["llama3.2-broken"],
      });
      expect(stack.logs.text).toContain("tokenizer failed to load");
      const refused = await chat("demo-coder");
      expect(refused.status).toBe(503);
      expect((await json(refused)).error.code).toBe("no_eligible_offer");
    } finally {
      counters.route("demo/coder-small", "llama3.1");
    }
  });
});
