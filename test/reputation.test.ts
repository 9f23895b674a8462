import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { onboard, setOffer } from "./helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

const messages = [{ role: "user" as const, content: "hello gateway" }];

interface ShownReputation {
  score: number | null;
  success_rate_bps: number | null;
  time_to_first_token_ms: number | null;
  output_tokens_per_second: number | null;
  verification_pass_rate_bps: number | null;
  flags: number;
  requests: number;
  window_seconds: number;
}

/**
 * The score as docs/decisions/providers-and-routing.md ("Offer reputation") states it, from the shown measures: the
 * weighted mean (4, 2, 2, 2) of the terms with data, times the unflagged share tenfold; null
 * without a request counted.
 */
function documentedScore(r: ShownReputation): number | null {
  if (r.requests === 0) return null;
  const terms: [number | null, number][] = [
    [r.success_rate_bps, 4],
    [
      r.time_to_first_token_ms === null
        ? null
        : Math.floor(10_000_000 / (1000 + r.time_to_first_token_ms)),
      2,
    ],
    [
      r.output_tokens_per_second === null
        ? null
        : Math.floor((10000 * r.output_tokens_per_second) / (r.output_tokens_per_second + 50)),
      2,
    ],
    [r.verification_pass_rate_bps, 2],
  ];
  const present = terms.filter((t): t is [number, number] => t[0] !== null);
  const mean = Math.floor(
    present.reduce((n, [v, w]) => n + v * w, 0) / present.reduce((n, [, w]) => n + w, 0),
  );
  const flagged = Math.min(10000, Math.floor((r.flags * 10000) / r.requests));
  return Math.floor((mean * Math.max(0, 10000 - 10 * flagged)) / 10000);
}

/**
 * Offer reputation (issue 22): two offers of `demo-chat`, each served by its own fake provider,
 * measured through real requests; the catalog shows what was measured, `provider.sort` follows
 * it. The tests run in order and build on each other's counts.
 */
describe("offer reputation", () => {
  let stack: TestStack;
  let fakes: { a: FakeUpstream; b: FakeUpstream };
  let a: Hex;
  let b: Hex;

  const chat = (body: object, signal?: AbortSignal) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify({ model: "demo-chat", messages, ...body }),
      ...(signal === undefined ? {} : { signal }),
    });
  /** A whole answer; the offer that served it. */
  const served = async (body: object) => {
    const res = await chat(body);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return res.headers.get("x-gateway-offer-id");
  };
  const streamOn = async (offer: Hex, times: number) => {
    for (let i = 0; i < times; i++) expect(await served({ offer, stream: true })).toBe(offer);
  };
  const reputation = async (offer: Hex): Promise<ShownReputation> => {
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    const shown = (data as { offer_id: string; reputation: ShownReputation }[]).find(
      (o) => o.offer_id === offer,
    );
    return shown!.reputation;
  };
  const cooldownUntil = async (offer: Hex): Promise<number | null> => {
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    return (data as { offer_id: string; cooldown_until: number | null }[]).find(
      (o) => o.offer_id === offer,
    )!.cooldown_until;
  };
  const recordStatus = async (requestId: string) =>
    (await json(await authed(stack, `/v1/requests/${requestId}`))).status as string;

  beforeAll(async () => {
    const started = await startChatStack({
      PERMIT_CACHE_MS: "0",
      // The last test verifies again at once.
      VERIFY_MIN_INTERVAL_SECONDS: "0",
    });
    stack = started.stack;
    a = started.chatOffer;
    b = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    await setOffer(stack, b, { status: 0 });
    fakes = {
      a: started.fake,
      b: await startFakeUpstream({ models: ["demo-chat"], chunks: 2 }),
    };
    await onboard(stack, b, fakes.b.url);
    // a answers at once, b after 200 ms.
    fakes.b.setOptions({ stallBeforeHeadersMs: 200 });
  }, 120_000);
  afterAll(async () => {
    await fakes?.b.stop();
    await fakes?.a.stop();
    await stack?.close();
  });

  it("shows a new offer with no measurement and no score; its verification once counted", async () => {
    const empty = {
      score: null,
      success_rate_bps: null,
      time_to_first_token_ms: null,
      output_tokens_per_second: null,
      verification_pass_rate_bps: null,
      flags: 0,
      requests: 0,
      window_seconds: 900,
      model_mismatch: false,
    };
    expect(await reputation(b)).toEqual(empty);
    // Record counts are read on the sharing round (every 5 s; here at once): the onboarding's
    // verification passed. A verification alone is no record of serving: still no score.
    await stack.gateway.measurementSync.runOnce();
    expect(await reputation(b)).toEqual({ ...empty, verification_pass_rate_bps: 10000 });
  });

  it("time to first token follows a slowdown: the score falls and sort latency moves away", async () => {
    await streamOn(a, 3);
    await streamOn(b, 3);
    const before = await reputation(a);
    const ofB = await reputation(b);
    expect(before).toMatchObject({ requests: 3, success_rate_bps: 10000 });
    expect(ofB).toMatchObject({ requests: 3, success_rate_bps: 10000 });
    expect(before.time_to_first_token_ms).toBeLessThan(200);
    expect(ofB.time_to_first_token_ms).toBeGreaterThanOrEqual(200);
    expect(before.score).toBe(documentedScore(before));
    expect(ofB.score).toBe(documentedScore(ofB));
    expect(await served({ stream: true, provider: { sort: "latency" } })).toBe(a);

    // a slows down: 5 slow answers outnumber its 4 quick ones in the window.
    fakes.a.setOptions({ stallBeforeHeadersMs: 600 });
    await streamOn(a, 5);
    const after = await reputation(a);
    expect(after).toMatchObject({ requests: 9, success_rate_bps: 10000 });
    expect(after.time_to_first_token_ms).toBeGreaterThanOrEqual(600);
    expect(after.score).toBe(documentedScore(after));
    expect(after.score!).toBeLessThan(before.score!);
    expect(await served({ stream: true, provider: { sort: "latency" } })).toBe(b);
  });

  it("provider failures lower the success rate by their count; failing offers sort last", async () => {
    // b: 4 served so far (3 pinned, 1 sorted to it).
    const before = await reputation(b);
    expect(before).toMatchObject({ requests: 4, success_rate_bps: 10000 });

    // A stream the provider breaks off after its first byte.
    fakes.b.setOptions({ failMidStream: true, failAfterChunks: 2, chunks: 10, delayMs: 30 });
    const broken = await chat({ offer: b, stream: true });
    expect(broken.status, await broken.clone().text()).toBe(200);
    expect(await broken.text()).toContain('"upstream_error"');
    // Four answers of 500 (pinned: no failover).
    fakes.b.setOptions({ failMidStream: false, chunks: 2, delayMs: 0, failStatus: 500 });
    for (let i = 0; i < 4; i++) expect((await chat({ offer: b })).status).toBe(502);
    const failing = await reputation(b);
    expect(failing).toMatchObject({ requests: 9, success_rate_bps: Math.floor(40000 / 9) });
    expect(failing.score).toBe(documentedScore(failing));
    expect(failing.score!).toBeLessThan(before.score!);

    // Sorted to b (still the quicker, 9 requests are not enough to call it failing), which
    // fails: the request fails over to a, and b is counted failed once more.
    const ofA = await reputation(a);
    expect(await served({ stream: true, provider: { sort: "latency" } })).toBe(a);
    expect(await reputation(b)).toMatchObject({ requests: 10, success_rate_bps: 4000 });
    expect(await reputation(a)).toMatchObject({ requests: ofA.requests + 1 });

    // b answers again and is still the quicker one, but 40 % over 10 requests sorts it last.
    fakes.b.setOptions({ failStatus: undefined });
    expect(await served({ stream: true, provider: { sort: "latency" } })).toBe(a);
    expect((await reputation(b)).time_to_first_token_ms!).toBeLessThan(
      (await reputation(a)).time_to_first_token_ms!,
    );
  });

  it("a competitor's own cancels and bad requests do not count against the provider", async () => {
    const before = await reputation(b);

    // Cancelled while the provider holds its headers.
    fakes.b.setOptions({ stallBeforeHeadersMs: 5000 });
    const early = new AbortController();
    const calls = fakes.b.calls("/v1/chat/completions");
    const pending = chat({ offer: b, stream: true }, early.signal).catch(() => undefined);
    await eventually(async () => fakes.b.calls("/v1/chat/completions") > calls);
    early.abort();
    await pending;
    expect(await fakes.b.requests.at(-1)!.finished).toBe("aborted");
    fakes.b.releaseHolds();

    // Cancelled after its first chunk.
    fakes.b.setOptions({ stallBeforeHeadersMs: 200, stallAfterChunks: 1, chunks: 4 });
    const res = await chat({ offer: b, stream: true });
    const requestId = res.headers.get("x-gateway-request-id")!;
    const reader = res.body!.getReader();
    let received = "";
    while (!received.includes('"content":"'))
      received += new TextDecoder().decode((await reader.read()).value);
    await reader.cancel();
    await eventually(async () => (await recordStatus(requestId)) === "cancelled", 5000);
    fakes.b.releaseHolds();

    // The provider refuses the client's input (400), or says it is busy (429, which a flood
    // provokes at no cost to its sender: a first one only cools the offer down, for the second
    // it asked; test/cooldowns.test.ts).
    fakes.b.setOptions({ stallAfterChunks: undefined, chunks: 2 });
    for (const status of [400, 422]) {
      fakes.b.setOptions({ failStatus: status });
      expect((await chat({ offer: b })).status).toBe(502);
    }
    fakes.b.setOptions({ failStatus: 429, responseHeaders: { "retry-after": "1" } });
    const busy = await chat({ offer: b });
    expect(busy.status).toBe(503);
    expect((await json(busy)).error.code).toBe("offer_cooling_down");
    fakes.b.setOptions({ failStatus: undefined, responseHeaders: undefined });
    await eventually(async () => (await cooldownUntil(b)) === null, 5000);

    const after = await reputation(b);
    expect(after).toEqual(before);
  });

  it("over-reported usage is charged the count, and counts as a diverged claim, not an above-quote flag", async () => {
    const divergence = async () => {
      const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
      const shown = (
        data as { offer_id: string; usage_divergence: { claimed: number; diverged: number } }[]
      ).find((o) => o.offer_id === a);
      return shown!.usage_divergence;
    };
    await stack.gateway.measurementSync.runOnce();
    const before = { reputation: await reputation(a), divergence: await divergence() };
    fakes.a.setOptions({
      stallBeforeHeadersMs: undefined,
      usage: { prompt_tokens: 5_000_000, completion_tokens: 5_000_000 },
    });
    const res = await chat({ offer: a, max_tokens: 8 });
    expect(res.status).toBe(200);
    await res.text();
    fakes.a.setOptions({ usage: undefined });
    const requestId = res.headers.get("x-gateway-request-id")!;
    expect((await json(await authed(stack, `/v1/requests/${requestId}`))).usage_source).toBe(
      "gateway",
    );
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence()).toMatchObject({
      claimed: before.divergence.claimed + 1,
      diverged: before.divergence.diverged + 1,
    });
    const after = await reputation(a);
    // Charged the count: nothing priced above the quote, so no above-quote flag.
    expect(after.flags).toBe(before.reputation.flags);
    expect(after.score).toBe(documentedScore(after));
  });

  it("verification pass rate: runs that passed of those that passed or answered wrongly", async () => {
    // b lists no model: a wrong answer (the offer is out of routing until verified again).
    fakes.b.setOptions({ models: [] });
    const rejected = await authed(stack, `/v1/provider-offers/${b}/verify`, { method: "POST" });
    expect(rejected.status).toBe(422);
    fakes.b.setOptions({ models: ["demo-chat"] });
    await stack.gateway.measurementSync.runOnce();
    const shown = await reputation(b);
    expect(shown.verification_pass_rate_bps).toBe(5000);
    expect(shown.score).toBe(documentedScore(shown));
  });
});
