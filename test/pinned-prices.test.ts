import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { priceCredits } from "../src/domain/pricing.js";
import { demoTariff } from "../src/dev/demo-market.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

const messages = [{ role: "user" as const, content: "hello gateway" }];
const windowSeconds = 300;

/**
 * Issue 27, item 10: the prices a client sets hold whatever pins its request, wake fee included,
 * and a wake fee is charged only when the gateway saw the endpoint asleep, once per window.
 * `demo-chat`'s offer is served by a fake provider; the demo tariff has a wake fee of 10^13.
 */
describe("prices the client set hold, whatever pins the request; wake fees the gateway saw", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let offer: Hex;
  let pinnedPermit: Hex;
  // The gateway's clock, moved past wake windows without sleeping.
  let offset = 0;
  const clock = () => Math.floor(Date.now() / 1000) + offset;

  beforeAll(async () => {
    ({
      stack,
      fake,
      chatOffer: offer,
    } = await startChatStack(
      {
        PERMIT_CACHE_MS: "0",
        ROUTING_CACHE_MS: "0",
        WAKE_FEE_WINDOW_SECONDS: String(windowSeconds),
      },
      { clock },
    ));
    pinnedPermit = await openPermit(stack, { offerId: offer, deposit: 10n ** 18n });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chatCalls = () => fake.calls("/v1/chat/completions");
  const chat = (body: object, headers: Record<string, string> = {}) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        ...headers,
      },
      body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 16, ...body }),
    });
  const quote = async (): Promise<{
    quote_id: string;
    wakes_endpoint: boolean;
    maximum_credits: string;
  }> => {
    const res = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 16 }),
    });
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    return body;
  };
  /** The liveness probe fails (GET /v1/models answers 404) while chat works, or passes again. */
  const probeSees = async (running: boolean) => {
    fake.setOptions({ listModels: running });
    await stack.gateway.health.probeAll();
    const health = await stack.gateway.health.probeIfStale(offer);
    expect(health?.running).toBe(running);
  };
  /** A request's record once its close is written. */
  const record = async (requestId: string) => {
    let body: Record<string, string> = {};
    await eventually(async () => {
      body = await json(await authed(stack, `/v1/requests/${requestId}`));
      return body.status === "completed";
    });
    return body;
  };
  /** Serves one JSON request; its record's charge and what its usage costs without the fee. */
  const served = async (body: object = {}, headers: Record<string, string> = {}) => {
    const res = await chat(body, headers);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    const r = await record(res.headers.get("x-gateway-request-id")!);
    const usage = { inputTokens: BigInt(r.input_tokens!), outputTokens: BigInt(r.output_tokens!) };
    return {
      charged: BigInt(r.credits_charged!),
      tokensOnly: priceCredits(demoTariff, usage, false),
      maximum: BigInt(r.maximum_credits!),
    };
  };

  /** The three ways to pin the offer: the body's `offer`, a quote, a permit pinned to it. */
  const pins = async (): Promise<[string, object, Record<string, string>][]> => [
    ["offer", { offer }, {}],
    ["quote", {}, { "x-gateway-quote": (await quote()).quote_id }],
    ["permit", {}, { "x-gateway-permit": pinnedPermit }],
  ];
  /** max_price at the tariff's own prices, `minus` below them (input and output alike). */
  const atTariff = (minus = 0n) => ({
    prompt: (demoTariff.inputPricePerMTok - minus).toString(),
    completion: (demoTariff.outputPricePerMTok - minus).toString(),
  });

  it("refuses a pinned request above max_price before any provider call (permit, quote, body offer)", async () => {
    for (const [pin, body, headers] of await pins()) {
      const before = chatCalls();
      const res = await chat({ ...body, provider: { max_price: atTariff(1n) } }, headers);
      const { error } = await json(res);
      expect([pin, res.status, error.code]).toEqual([pin, 503, "no_eligible_offer"]);
      expect(error.message).toContain(`offer ${offer} costs up to`);
      expect(error.message).toContain("provider.max_price");
      expect(chatCalls()).toBe(before);
    }
    // At the tariff's own prices, with the endpoint running (no wake fee): served, each pin.
    for (const [pin, body, headers] of await pins()) {
      const res = await chat({ ...body, provider: { max_price: atTariff() } }, headers);
      expect([pin, res.status]).toEqual([pin, 200]);
      await res.text();
    }
  });

  it("refuses a pinned request that max_price covers only without the wake fee, before any provider call", async () => {
    await probeSees(false);
    try {
      const asleep = await quote();
      expect(asleep.wakes_endpoint).toBe(true);
      for (const [pin, body, headers] of [
        ["offer", { offer }, {}],
        ["quote", {}, { "x-gateway-quote": asleep.quote_id }],
        ["permit", {}, { "x-gateway-permit": pinnedPermit }],
      ] as const) {
        const before = chatCalls();
        const res = await chat({ ...body, provider: { max_price: atTariff() } }, headers);
        const { error } = await json(res);
        expect([pin, res.status, error.code]).toEqual([pin, 503, "no_eligible_offer"]);
        expect(error.message).toContain(`wake fee ${demoTariff.wakeFee}`);
        expect(chatCalls()).toBe(before);
      }
      // Unpinned alike: the only offer is excluded.
      const before = chatCalls();
      const res = await chat({ provider: { max_price: atTariff() } });
      expect(res.status).toBe(503);
      expect((await json(res)).error.message).toContain("wake fee included");
      expect(chatCalls()).toBe(before);
    } finally {
      await probeSees(true);
    }
  });

  it("charges a provider that fails its liveness probe on purpose the wake fee at most once per window", async () => {
    const running = await served();
    expect(running.charged).toBe(running.tokensOnly);

    await probeSees(false);
    // Every request is quoted the fee (a maximum); only the first of the window is charged it.
    const charges: bigint[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await served();
      expect(r.maximum).toBe(running.maximum + demoTariff.wakeFee);
      charges.push(r.charged - r.tokensOnly);
    }
    expect(charges).toEqual([demoTariff.wakeFee, 0n, 0n]);

    // The window has passed, but no probe has seen the endpoint asleep since the fee: none.
    offset += windowSeconds + 1;
    let r = await served();
    expect(r.charged - r.tokensOnly).toBe(0n);

    // A probe sees it down again: one more fee, then none in this window.
    await probeSees(false);
    const again: bigint[] = [];
    for (let i = 0; i < 2; i++) {
      r = await served();
      again.push(r.charged - r.tokensOnly);
    }
    expect(again).toEqual([demoTariff.wakeFee, 0n]);

    // Inside the window a fresh probe changes nothing.
    offset += 10;
    await probeSees(false);
    r = await served();
    expect(r.charged - r.tokensOnly).toBe(0n);
    await probeSees(true);
  });

  it("serves a pinned request whose max_price leaves room for the wake fee, and charges it once", async () => {
    offset += windowSeconds + 1;
    await probeSees(false);
    try {
      // 16 output tokens at 1,000 times the output price leave room for the fee (10^13).
      const roomy = {
        prompt: demoTariff.inputPricePerMTok.toString(),
        completion: (demoTariff.outputPricePerMTok * 1000n).toString(),
      };
      const first = await served({ offer, provider: { max_price: roomy } });
      expect(first.charged - first.tokensOnly).toBe(demoTariff.wakeFee);
      const second = await served({}, { "x-gateway-permit": pinnedPermit });
      expect(second.charged - second.tokensOnly).toBe(0n);
    } finally {
      await probeSees(true);
    }
  });
});
