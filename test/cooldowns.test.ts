import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { priceCredits } from "../src/domain/pricing.js";
import { describeIfPostgres } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { dearerTariff, secondChatOffer } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { demoChat, useTwoGateways } from "./helpers/two-gateways.js";

/**
 * A provider's 429 honoured (issue 38, item 5; docs/decisions/providers-and-routing.md
 * "Cooldowns: a provider's 429"): two offers of `demo-chat` on their own fake providers, the
 * cheaper one (`a`, ranked first) answering 429 with Retry-After. The tests run in order.
 */

const messages = [{ role: "user" as const, content: "hello gateway" }];
const chatPath = "/v1/chat/completions";
/** The second offer's tariff: dearer, so the demo chat offer is ranked first. */
const dearer = dearerTariff;

interface ClosedRow {
  offer_id: string;
  status: string;
  billing: string;
  credits_charged: string;
  input_tokens: string;
  output_tokens: string;
  charges: string;
}

/** The request's record once closed, with its count of charges (inference_charges rows). */
async function closed(stack: TestStack, requestId: string): Promise<ClosedRow> {
  let row: ClosedRow | undefined;
  await eventually(async () => {
    const { rows } = await stack.database.db.pool.query<ClosedRow>(
      `SELECT offer_id, status, billing, credits_charged::text, input_tokens::text,
         output_tokens::text,
         (SELECT count(*) FROM inference_charges c WHERE c.request_id = r.id)::text AS charges
       FROM inference_requests r WHERE id = $1`,
      [requestId],
    );
    row = rows[0];
    return row !== undefined && row.status !== "pending" && row.status !== "streaming";
  });
  return row!;
}

describe("a provider's 429 takes its offer out of routing for the time it asked", () => {
  let stack: TestStack;
  let fakeA: FakeUpstream;
  let fakeB: FakeUpstream;
  let a: Hex;
  let b: Hex;
  // The gateway's clock: real while the stack starts, then held still by the tests and moved
  // past cooldowns without sleeping (so that every figure below is exact).
  let held: number | undefined;
  const clock = () => held ?? Math.floor(Date.now() / 1000);

  const chat = demoChat(() => stack);
  /** A served answer: the offer that served it, its request id and the charge it shows. */
  const served = async (body: object = {}) => {
    const res = await chat(body);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return {
      offer: res.headers.get("x-gateway-offer-id"),
      requestId: res.headers.get("x-gateway-request-id")!,
      charged: res.headers.get("x-gateway-credits-charged") ?? undefined,
    };
  };
  const offersView = async () => {
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    return data as {
      offer_id: string;
      cooldown_until: number | null;
      reputation: { requests: number; success_rate_bps: number | null };
    }[];
  };
  const shown = async (offer: Hex) => (await offersView()).find((o) => o.offer_id === offer)!;
  const calls = () => ({ a: fakeA.calls(chatPath), b: fakeB.calls(chatPath) });

  beforeAll(async () => {
    const started = await startChatStack({ PERMIT_CACHE_MS: "0" }, { clock });
    stack = started.stack;
    fakeA = started.fake;
    a = started.chatOffer;
    ({ b, fakeB } = await secondChatOffer(stack));
  }, 120_000);
  afterAll(async () => {
    await fakeB?.stop();
    await fakeA?.stop();
    await stack?.close();
  });

  it("fails the request over before the first byte, charged once, and calls the offer no more", async () => {
    held = clock();
    const at = held;
    expect((await served()).offer).toBe(a);
    fakeA.setOptions({ failStatus: 429, responseHeaders: { "retry-after": "30" } });
    const before = calls();
    const answers = [
      await served(),
      await served({ stream: true }),
      await served(),
      await served({ stream: true }),
    ];
    // The 429 was the only call to a: the request failed over, the next ones went to b.
    expect(calls()).toEqual({ a: before.a + 1, b: before.b + 4 });
    for (const answer of answers) {
      expect(answer.offer).toBe(b);
      const row = await closed(stack, answer.requestId);
      const charge = priceCredits(
        dearer,
        { inputTokens: BigInt(row.input_tokens), outputTokens: BigInt(row.output_tokens) },
        false,
      );
      expect(row).toEqual({
        offer_id: b.toLowerCase(),
        status: "completed",
        billing: "billed",
        credits_charged: charge.toString(),
        input_tokens: row.input_tokens,
        output_tokens: row.output_tokens,
        charges: "1",
      });
      expect(charge).toBeGreaterThan(0n);
      if (answer.charged !== undefined) expect(answer.charged).toBe(charge.toString());
    }

    // The offers view shows when it ends; a single 429 is not counted against the offer.
    const cooling = await shown(a);
    expect(cooling.cooldown_until).toBe(at + 30);
    expect(cooling.reputation).toMatchObject({ requests: 1, success_rate_bps: 10000 });
    expect((await shown(b)).cooldown_until).toBeNull();

    // A request pinned to it is refused 503 naming the cooldown, with the seconds left.
    const pinned = await chat({ offer: a });
    expect(pinned.status).toBe(503);
    expect((await json(pinned)).error.code).toBe("offer_cooling_down");
    expect(pinned.headers.get("retry-after")).toBe("30");
    // So is a quote pinned to it; an unpinned quote is for the other offer.
    const quote = (body: object) =>
      authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "demo-chat", messages, ...body }),
      });
    const pinnedQuote = await quote({ offer: a });
    expect(pinnedQuote.status).toBe(503);
    expect((await json(pinnedQuote)).error.code).toBe("offer_cooling_down");
    expect((await json(await quote({}))).offer_id).toBe(b);
    expect(calls().a).toBe(before.a + 1);

    const metrics = await (await fetch(stack.gateway.metricsUrl)).text();
    expect(metrics).toContain(`gateway_offer_cooldowns_total{model="demo-chat",offer="${a}"} 1`);
    expect(metrics).toMatch(/^gateway_offers_cooling_down 1$/m);
  });

  it("routes to the offer again once the time it asked has passed", async () => {
    const until = (await shown(a)).cooldown_until!;
    held = until - 1;
    // A second before the end: still out of routing.
    const pinned = await chat({ offer: a });
    expect(pinned.status).toBe(503);
    expect(pinned.headers.get("retry-after")).toBe("1");
    expect((await served()).offer).toBe(b);
    fakeA.setOptions({ failStatus: undefined, responseHeaders: undefined });
    const before = calls();
    held = until;
    expect((await served()).offer).toBe(a);
    expect(calls()).toEqual({ a: before.a + 1, b: before.b });
    expect((await shown(a)).cooldown_until).toBeNull();
  });

  it("counts a 429 against the offer's reputation only when it repeats", async () => {
    // The last cooldown (30 s) ended just now: a 429 within as long again repeats it.
    expect((await shown(a)).reputation).toMatchObject({ requests: 2, success_rate_bps: 10000 });
    fakeA.setOptions({ failStatus: 429, responseHeaders: { "retry-after": "5" } });
    expect((await served()).offer).toBe(b);
    expect((await shown(a)).reputation).toMatchObject({ requests: 3, success_rate_bps: 6666 });
    // Long after that 5 s cooldown (more than twice it), a 429 is a first one again.
    held! += 11;
    expect((await served()).offer).toBe(b);
    expect((await shown(a)).reputation).toMatchObject({ requests: 3, success_rate_bps: 6666 });
  });
});

describeIfPostgres("two gateway processes share a cooldown", () => {
  const two = useTwoGateways();
  const chat = demoChat(() => two().stack);

  it("the process that did not see the 429 does not call the cooling offer", async () => {
    const { stack, second, fakeA, a, b } = two();
    const first = await chat({}, second);
    expect(first.status).toBe(200);
    expect(first.headers.get("x-gateway-offer-id")).toBe(a);
    fakeA.setOptions({ failStatus: 429, responseHeaders: { "retry-after": "30" } });
    const callsA = fakeA.calls(chatPath);
    const failedOver = await chat();
    expect(failedOver.status).toBe(200);
    expect(failedOver.headers.get("x-gateway-offer-id")).toBe(b);
    expect(fakeA.calls(chatPath)).toBe(callsA + 1);

    // The second process's round (every 5 s) reads the shared row: its offers view shows it.
    await eventually(
      async () => {
        const { data } = await json(
          await fetch(`${second.url}/v1/models/demo-chat/offers`, {
            headers: { authorization: `Bearer ${stack.apiKey}` },
          }),
        );
        const shown = (data as { offer_id: string; cooldown_until: number | null }[]).find(
          (o) => o.offer_id === a,
        );
        return shown?.cooldown_until !== null;
      },
      10_000,
      100,
    );
    for (let i = 0; i < 3; i++) {
      const res = await chat(i % 2 === 0 ? {} : { stream: true }, second);
      await res.text();
      expect(res.status).toBe(200);
      expect(res.headers.get("x-gateway-offer-id")).toBe(b);
    }
    const pinned = await chat({ offer: a }, second);
    expect(pinned.status).toBe(503);
    expect((await json(pinned)).error.code).toBe("offer_cooling_down");
    const retryAfter = Number(pinned.headers.get("retry-after"));
    expect(retryAfter).toBeGreaterThanOrEqual(20);
    expect(retryAfter).toBeLessThanOrEqual(30);
    expect(fakeA.calls(chatPath)).toBe(callsA + 1);
    // One row for the offer, whichever process wrote it.
    const { rows } = await stack.database.db.pool.query<{ n: string }>(
      "SELECT count(*)::text AS n FROM offer_cooldowns WHERE offer_id = $1",
      [a.toLowerCase()],
    );
    expect(rows[0]!.n).toBe("1");
  });
});
