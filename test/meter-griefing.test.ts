import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { TokenCounter } from "../src/domain/tokens.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { demoChatCounter, promptTokens } from "./helpers/token-counts.js";

/**
 * Issue 35, item 8: an honest offer cannot be made to diverge by what a competitor sends it.
 * Before, members forwarded as sent made an honest provider count tokens the client never saw
 * (`stop` strings it generated and cut, `include_reasoning: false`): its honest claim was judged
 * diverged, and 21 such requests took the demo offer out of routing. Now the counting controls
 * are refused before any provider is called, and a stopped choice's tolerance covers its
 * longest stop string.
 */

/** What the fake answers with `chunks: 5`. */
const fiveWords = "word0 word1 word2 word3 word4";
/** A long stop string (64 characters, the most allowed): an honest provider counts it. */
const stop = "<<END-OF-ANSWER:the-model-wrote-this-and-the-server-cut-it-off>>";

interface ShownDivergence {
  claimed: number;
  diverged: number;
  flagged: boolean;
  excluded: boolean;
}

describe("a competitor cannot make an honest offer diverge (issue 35)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let offer: Hex;
  let counter: TokenCounter;

  beforeAll(async () => {
    ({ stack, fake, chatOffer: offer } = await startChatStack({}, { chunks: 5 }));
    counter = await demoChatCounter();
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chat = (body: object) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify(body),
    });
  const divergence = async (): Promise<ShownDivergence> => {
    const { data } = await json(await authed(stack, "/v1/models/demo-chat/offers"));
    return (data as { offer_id: string; usage_divergence: ShownDivergence }[]).find(
      (o) => o.offer_id === offer,
    )!.usage_divergence;
  };

  it("refuses the members that make a provider count what the client never sees, before any call", async () => {
    const calls = fake.calls("/v1/chat/completions");
    for (const member of [
      { include_reasoning: false },
      { echo: true },
      { chat_template: "{{ messages }}" },
      { continue_final_message: true },
      { return_tokens_as_token_ids: true },
      { stop: ["a", "b", "c", "d", "e"] },
      { stop: ["x".repeat(65)] },
    ]) {
      const res = await chat({
        model: "demo-chat",
        messages: [{ role: "user", content: "Say five words." }],
        max_tokens: 64,
        ...member,
      });
      expect(res.status, JSON.stringify(member)).toBe(400);
      expect((await json(res)).error.code).toBe("invalid_request");
    }
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
  });

  it("21 requests whose honest claims count a stop string leave the offer unflagged and routable", async () => {
    const body = {
      model: "demo-chat",
      messages: [{ role: "user", content: "Say five words, then the end marker." }],
      max_tokens: 64,
      stop: [stop],
    };
    // The honest claim: the prompt as the model's template renders it, the five words, the stop
    // string the model generated (cut from the answer by its server) and its end of sequence.
    const stopTokens = counter.countOutput(stop);
    const honestOutput = counter.countOutput(fiveWords) + stopTokens + 1n;
    // The stop string alone is past the fixed tolerance (8 per choice plus 2 %): without the
    // widening, this claim is judged diverged.
    expect(stopTokens).toBeGreaterThan(9n);
    fake.setOptions({
      usage: {
        prompt_tokens: Number(await promptTokens(counter, body)),
        completion_tokens: Number(honestOutput),
      },
    });
    const before = await divergence();
    for (let i = 0; i < 21; i += 1) {
      const res = await chat({ ...body, stream: i % 2 === 1 });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    await stack.gateway.measurementSync.runOnce();
    expect(await divergence()).toMatchObject({
      claimed: before.claimed + 21,
      diverged: before.diverged,
      flagged: false,
      excluded: false,
    });
    // Still routed, unpinned.
    const res = await chat({ ...body, stop: undefined });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-gateway-offer-id")).toBe(offer);
    fake.setOptions({ usage: undefined });
  });
});
