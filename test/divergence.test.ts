import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { authorizeKey } from "./helpers/authorize.js";
import { onboard, openPermit, setOffer } from "./helpers/market.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Divergence costs the liar, not a competitor (issue 27, item 5; docs/decisions/metering-and-tokens.md "Usage
 * divergence"), end to end: two offers of `demo-chat`, each served by its own fake provider,
 * measured through real requests. The liar answers five words and claims the request's
 * `max_tokens` as its output; the relay judges every answer's claim (`judgeUsage`) and reports
 * it to the offer that served it (`measurements.claimed`), with the payer of the request's
 * permit. A flag needs diverged answers from at least 2 distinct payers, an exclusion from at
 * least 3 (src/domain/reputation/divergence.ts): so the liar's lies come from three payers, the demo payer
 * and two more of anvil's accounts, each with a permit of its own that the stack's key was
 * authorized to spend, and the last case tells the same lies from one payer only. The tests run
 * in order and build on each other's counts.
 */

interface ShownDivergence {
  claimed: number;
  diverged: number;
  share_bps: number | null;
  flagged: boolean;
  excluded: boolean;
}

const honest: ShownDivergence = {
  claimed: 0,
  diverged: 0,
  share_bps: null,
  flagged: false,
  excluded: false,
};

describe("usage divergence", () => {
  let stack: TestStack;
  let fakes: { liar: FakeUpstream; honest: FakeUpstream };
  /** The liar's offer: the cheaper, so routing prefers it until it is flagged. */
  let liar: Hex;
  let other: Hex;
  /** Three payers' permits, the demo payer's first; the stack's key may spend each of them. */
  let permits: [Hex, Hex, Hex];

  const chat = (body: object, permit: Hex = stack.demo.permitId) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permit },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "Say five words." }],
        max_tokens: 2000,
        ...body,
      }),
    });
  /** A whole answer; the offer that served it. */
  const served = async (body: object = {}, permit?: Hex) => {
    const res = await chat(body, permit);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return res.headers.get("x-gateway-offer-id") as Hex;
  };
  /** `times` answers of `offer`, their permits taken in turn from `from` (the demo payer's). */
  const answersOf = async (
    offer: Hex,
    times: number,
    from: readonly Hex[] = [stack.demo.permitId],
  ) => {
    for (let i = 0; i < times; i++) {
      expect(await served({ offer, stream: i % 2 === 1 }, from[i % from.length])).toBe(offer);
    }
  };
  const divergence = async (offer: Hex): Promise<ShownDivergence> => {
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    const shown = (data as { offer_id: string; usage_divergence: ShownDivergence }[]).find(
      (o) => o.offer_id === offer,
    );
    return shown!.usage_divergence;
  };
  const verify = (offer: Hex) =>
    authed(stack, `/v1/provider-offers/${offer}/verify`, { method: "POST" });

  beforeAll(async () => {
    const started = await startChatStack({
      PERMIT_CACHE_MS: "0",
      VERIFY_MIN_INTERVAL_SECONDS: "0",
    });
    stack = started.stack;
    liar = started.chatOffer;
    other = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    await setOffer(stack, other, {
      status: 0,
      tariff: { input: 3_000_000_000_000_000n, output: 7_000_000_000_000_000n, wake: 0n },
    });
    fakes = {
      liar: started.fake,
      honest: await startFakeUpstream({ models: ["demo-chat"], chunks: 5 }),
    };
    fakes.liar.setOptions({ chunks: 5 });
    await onboard(stack, other, fakes.honest.url);
    // Two more payers (anvil's accounts 5 and 6; the demo market's roles are 0 to 4), each with
    // a deposit of its own, authorize the stack's key for their permit.
    const more: Hex[] = [];
    for (const account of stack.anvil.accounts.slice(5, 7)) {
      const permitId = await openPermit(stack, {
        deposit: stack.demo.permitDeposit,
        payerPrivateKey: account.privateKey,
      });
      await authorizeKey(stack.gateway.url, stack.apiKey, account.privateKey, { permitId });
      more.push(permitId);
    }
    permits = [stack.demo.permitId, more[0]!, more[1]!];
  }, 120_000);
  afterAll(async () => {
    await fakes?.honest.stop();
    await fakes?.liar.stop();
    await stack?.close();
  });

  it("a competitor's varied requests to an honest offer never flag it", async () => {
    expect(await divergence(other)).toEqual(honest);
    const tool = (i: number) => ({
      type: "function",
      function: {
        name: `lookup_${i}`,
        description: "Looks up a record. ".repeat(40),
        parameters: {
          type: "object",
          properties: Object.fromEntries(
            Array.from({ length: 30 }, (_, k) => [
              `field_${k}`,
              { type: "string", enum: ["ä", "😀"] },
            ]),
          ),
        },
      },
    });
    const contents = [
      "Grüß Gott, wie geht's? Ça va très bien.",
      "東京の天気を教えてください。",
      "🌧️🌈 emoji 👩‍👩‍👧‍👦 and ZWJ sequences",
      "function f(x) { return x ** 2; } // code",
      "a".repeat(3000),
    ];
    for (let i = 0; i < 30; i++) {
      const body = {
        offer: other,
        stream: i % 2 === 0,
        messages: [
          { role: "system", content: "You are terse." },
          { role: "user", content: contents[i % contents.length]! },
        ],
        ...(i % 3 === 0 ? { tools: [tool(i), tool(i + 1)] } : {}),
        max_tokens: 16 + i,
      };
      expect(await served(body)).toBe(other);
    }
    // Every answer carried a claim; none above the gateway's count.
    expect(await divergence(other)).toEqual({ ...honest, claimed: 30, share_bps: 0 });
  });

  it("counts an answer only for the offer that gave it (a failover's first offer claims nothing)", async () => {
    // The liar's offer is the cheaper: asked first, it fails before its first byte, and the
    // request fails over to the honest one.
    fakes.liar.setOptions({ failStatus: 500 });
    expect(await served()).toBe(other);
    fakes.liar.setOptions({ failStatus: undefined });
    expect(await divergence(liar)).toEqual(honest);
    expect(await divergence(other)).toEqual({ ...honest, claimed: 31, share_bps: 0 });
  });

  it("flags the liar after more than 10 % of 20 claims from two payers, and routes it after every other offer", async () => {
    // 17 honest answers, then it starts to claim its output limit for five words: to the demo
    // payer and to a second payer.
    await answersOf(liar, 17);
    fakes.liar.setOptions({ inflateUsage: { outputLimit: true } });
    await answersOf(liar, 2, permits.slice(0, 2));
    // 2 of 19: too few claims to judge; still preferred (the cheaper).
    expect(await divergence(liar)).toEqual({
      claimed: 19,
      diverged: 2,
      share_bps: 1052,
      flagged: false,
      excluded: false,
    });
    expect(await served({}, permits[1])).toBe(liar);
    // That one diverged too: 3 of 20, 15 %, from two payers.
    expect(await divergence(liar)).toEqual({
      claimed: 20,
      diverged: 3,
      share_bps: 1500,
      flagged: true,
      excluded: false,
    });
    // Sorted last whatever the request asks to sort by; still served when pinned.
    expect(await served()).toBe(other);
    expect(await served({ provider: { sort: "price" } })).toBe(other);
    expect(await served({ provider: { sort: "latency" } })).toBe(other);
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    const reputation = (data as { offer_id: string; reputation: { score: number } }[]).find(
      (o) => o.offer_id === liar,
    )!.reputation;
    expect(reputation.score).toBe(0);
    // The honest offer's answers never counted against the liar, nor the liar's against it.
    expect(await divergence(other)).toEqual({ ...honest, claimed: 34, share_bps: 0 });
  });

  it("takes the liar out of routing above half its claims from three payers, pins included, until it verifies again", async () => {
    // 3 of 20 so far; 15 more lies to the same two payers: 18 of 35, more than half.
    await answersOf(liar, 15, permits.slice(0, 2));
    // The sharing round writes an exclusion for every process (every 5 s; here at once): not
    // from two payers (the gateway's own probe is to confirm it), so still only flagged.
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence(liar)).toEqual({
      claimed: 35,
      diverged: 18,
      share_bps: 5142,
      flagged: true,
      excluded: false,
    });
    // A lie to a third payer: 19 of 36, from three payers.
    await answersOf(liar, 1, permits.slice(2));
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence(liar)).toEqual({
      claimed: 36,
      diverged: 19,
      share_bps: 5277,
      flagged: true,
      excluded: true,
    });
    const calls = fakes.liar.calls("/v1/chat/completions");
    for (const permit of permits) {
      const pinned = await chat({ offer: liar }, permit);
      expect(pinned.status).toBe(503);
      expect((await json(pinned)).error.code).toBe("no_eligible_offer");
    }
    expect(await served()).toBe(other);
    expect(fakes.liar.calls("/v1/chat/completions")).toBe(calls);

    // A restarted gateway agrees (the exclusion is in the database).
    await stack.restart();
    const again = await chat({ offer: liar });
    expect(again.status).toBe(503);

    // Verifying while it still lies: a wrong answer, with the figures; still excluded.
    const rejected = await verify(liar);
    expect(rejected.status).toBe(422);
    const { error } = await json(rejected);
    expect(error.code).toBe("usage_diverged");
    expect(error.message).toContain(
      "usage claim 200 output tokens for an answer the gateway counts",
    );
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence(liar)).toMatchObject({ excluded: true });

    // Honest again, and verified: back in routing, its divergence counted afresh.
    fakes.liar.setOptions({ inflateUsage: undefined });
    expect((await verify(liar)).status).toBe(200);
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence(liar)).toEqual(honest);
    expect(await served({ offer: liar })).toBe(liar);
    expect(await served()).toBe(liar);
  });

  it("the same lies from one payer neither flag nor exclude the liar", async () => {
    // Counted afresh since its verification: 2 honest answers, 15 more, then the same 19 lies
    // as above, every one to the demo payer.
    expect(await divergence(liar)).toEqual({ ...honest, claimed: 2, share_bps: 0 });
    await answersOf(liar, 15);
    fakes.liar.setOptions({ inflateUsage: { outputLimit: true } });
    await answersOf(liar, 2);
    // The third, unpinned: preferred (the cheaper), 2 of 19 being too few claims to judge.
    expect(await served()).toBe(liar);
    // 3 of 20 from one payer: not flagged.
    expect(await divergence(liar)).toEqual({
      claimed: 20,
      diverged: 3,
      share_bps: 1500,
      flagged: false,
      excluded: false,
    });
    // 18 of 35 from one payer: the sharing round writes no exclusion (the gateway's own probe
    // is to confirm it), and routing, not flagging it, still prefers it: 19 of 36.
    await answersOf(liar, 15);
    await stack.gateway.measurementSync.runOnce();
    expect(await served()).toBe(liar);
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence(liar)).toEqual({
      claimed: 36,
      diverged: 19,
      share_bps: 5277,
      flagged: false,
      excluded: false,
    });
    expect(await served({ offer: liar })).toBe(liar);
  });
});
