import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { permitLedger } from "../../src/adapters/pg/ledger/index.js";
import { priceCredits } from "../../src/domain/pricing.js";
import { demoTariff } from "../../src/dev/demo-market.js";
import {
  startFakeUpstream,
  type FakeRequest,
  type FakeUpstream,
} from "../helpers/fake-upstream.js";
import { onboard, setOffer } from "../helpers/market.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * The priced limit is the provider's limit (issue 27, items 6 and 7): every upstream request
 * carries the output limit its quote priced, a server's own length control is refused before
 * any quote or provider call, and a JSON answer may take as long as its priced output needs at
 * UPSTREAM_MIN_TOKENS_PER_SECOND. Two offers of `demo-chat` (capabilities `max_output_tokens:
 * 4096`), each with its own fake provider, so a failover would show.
 */

const messages = [{ role: "user" as const, content: "hello limited gateway" }];
const chatPath = "/v1/chat/completions";

interface RecordRow {
  id: string;
  status: string;
  billing: string | null;
  credits_charged: string | null;
  input_tokens: string;
  output_tokens: string;
  offer_id: string;
}

describe("the priced limit is the provider's limit", () => {
  let stack: TestStack;
  let fakes: { a: FakeUpstream; b: FakeUpstream };
  let a: Hex;
  let b: Hex;
  let permitId: Hex;

  beforeAll(async () => {
    const started = await startChatStack({ PERMIT_CACHE_MS: "0" });
    stack = started.stack;
    permitId = stack.demo.permitId;
    a = started.chatOffer;
    b = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    await setOffer(stack, b, { status: 0 });
    fakes = {
      a: started.fake,
      b: await startFakeUpstream({ models: ["demo-chat"], chunks: 2 }),
    };
    await onboard(stack, b, fakes.b.url);
  }, 120_000);
  afterAll(async () => {
    fakes?.a.releaseHolds();
    fakes?.b.releaseHolds();
    await fakes?.b.stop();
    await fakes?.a.stop();
    await stack?.close();
  });
  beforeEach(() => {
    for (const fake of [fakes.a, fakes.b]) fake.setOptions({ stallBeforeHeadersMs: undefined });
  });

  const post = (path: string, body: object, headers: Record<string, string> = {}) =>
    authed(stack, path, {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId, ...headers },
      body: JSON.stringify(body),
    });
  const chat = (body: object, headers: Record<string, string> = {}) =>
    post(chatPath, { model: "demo-chat", messages, ...body }, headers);
  const quote = async (body: object) => {
    const res = await post("/v1/quotes", { model: "demo-chat", messages, ...body });
    expect(res.status).toBe(200);
    return json(res);
  };
  const chatCalls = () => fakes.a.calls(chatPath) + fakes.b.calls(chatPath);
  /** The chat requests the providers received since `before` (both fakes). */
  const received = (before: { a: number; b: number }): FakeRequest[] => [
    ...fakes.a.requests.filter((r) => r.path === chatPath).slice(before.a),
    ...fakes.b.requests.filter((r) => r.path === chatPath).slice(before.b),
  ];
  const counts = () => ({ a: fakes.a.calls(chatPath), b: fakes.b.calls(chatPath) });

  it("a request without an output limit reaches the provider with the priced one, per choice", async () => {
    for (const n of [1, 3]) {
      const q = await quote({ n });
      const before = counts();
      const res = await chat({ n }, { "x-gateway-quote": q.quote_id });
      expect(res.status, await res.clone().text()).toBe(200);
      await res.text();
      const [sent, ...more] = received(before);
      expect(more).toEqual([]);
      const body = sent!.body as Record<string, unknown>;
      // The quote priced max_output_tokens for all n choices: the provider hears it per choice.
      expect(q.max_output_tokens).toBe(String(4096 * n));
      expect(body["max_tokens"]).toBe(Number(q.max_output_tokens) / n);
      expect(body["max_completion_tokens"]).toBeUndefined();
      expect(body["n"]).toBe(n);
    }
    // A stream too.
    const before = counts();
    const streamed = await chat({ stream: true });
    expect(streamed.status).toBe(200);
    await streamed.text();
    expect((received(before)[0]!.body as Record<string, unknown>)["max_tokens"]).toBe(4096);
  });

  it("a request's own limit reaches the provider as it set it", async () => {
    for (const limit of [{ max_tokens: 10 }, { max_completion_tokens: 10 }]) {
      const q = await quote(limit);
      expect(q.max_output_tokens).toBe("10");
      const before = counts();
      const res = await chat(limit, { "x-gateway-quote": q.quote_id });
      expect(res.status).toBe(200);
      await res.text();
      const body = received(before)[0]!.body as Record<string, unknown>;
      expect(body).toMatchObject(limit);
      // The one it set, and no other.
      expect(Object.keys(body).filter((k) => k.startsWith("max_"))).toEqual(Object.keys(limit));
    }
    // Both: the priced one is max_completion_tokens; a larger max_tokens is held to it.
    const before = counts();
    const res = await chat({ max_tokens: 900, max_completion_tokens: 20 });
    expect(res.status).toBe(200);
    await res.text();
    expect(received(before)[0]!.body).toMatchObject({ max_tokens: 20, max_completion_tokens: 20 });
  });

  it("refuses a server's own length control 400 before any quote or provider call, in every dialect", async () => {
    const calls = chatCalls();
    const controls: [string, unknown][] = [
      ["n_predict", 100_000],
      ["min_tokens", 5000],
      ["ignore_eos", true],
      ["num_predict", -1],
      ["max_new_tokens", 8192],
      ["min_new_tokens", 64],
    ];
    for (const [field, value] of controls) {
      for (const stream of [false, true]) {
        const res = await chat({ [field]: value, stream });
        expect(res.status).toBe(400);
        const { error } = await json(res);
        expect(error.code).toBe("invalid_request");
        expect(error.type).toBe("invalid_request_error");
        expect(error.message).toContain(`'${field}'`);
        expect(error.message).toContain("priced output limit");
      }
      const quoted = await post("/v1/quotes", { model: "demo-chat", messages, [field]: value });
      expect(quoted.status).toBe(400);
      expect((await json(quoted)).error.code).toBe("invalid_request");

      // The dialects translate what they know and refuse any other member.
      const responses = await post("/v1/responses", {
        model: "demo-chat",
        input: "hello",
        [field]: value,
      });
      expect(responses.status).toBe(400);
      const viaResponses = await json(responses);
      expect(viaResponses.error.code).toBe("invalid_request");
      expect(viaResponses.error.message).toContain(field);
      const anthropic = await post("/v1/messages", {
        model: "demo-chat",
        max_tokens: 10,
        messages,
        [field]: value,
      });
      expect(anthropic.status).toBe(400);
      expect(JSON.stringify(await json(anthropic))).toContain(field);
    }
    expect(chatCalls()).toBe(calls);

    // null (and false) ask for nothing: served, and the provider never sees the member.
    const before = counts();
    const res = await chat({ n_predict: null, ignore_eos: false, max_tokens: 5 });
    expect(res.status).toBe(200);
    await res.text();
    const body = received(before)[0]!.body as Record<string, unknown>;
    expect(Object.keys(body).sort()).toEqual(["max_tokens", "messages", "model"]);
  });

  it("a JSON answer whose headers come after 45 s of generation is served and charged, not failed over", async () => {
    // Both providers take 45 s, as an OpenAI-compatible server sends a JSON answer's headers
    // once it is generated: whichever is chosen, the other must hear nothing.
    for (const fake of [fakes.a, fakes.b]) fake.setOptions({ stallBeforeHeadersMs: 45_000 });
    // The earlier tests' requests charged first: their closes may still be in flight (a loaded
    // machine), and one landing after the reading below would count as this request's.
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query<{ open: string }>(
        `SELECT count(*)::text AS open FROM inference_requests
          WHERE permit_id = $1 AND status IN ('pending', 'streaming')`,
        [permitId],
      );
      return rows[0]!.open === "0";
    }, 15_000);
    await eventually(
      async () => (await permitLedger(stack.database.db.pool, permitId)).reserved === 0n,
      15_000,
    );
    const ledgerBefore = await permitLedger(stack.database.db.pool, permitId);
    const before = counts();
    const started = performance.now();
    const res = await chat({});
    const body = await json(res);
    const took = performance.now() - started;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(took).toBeGreaterThanOrEqual(45_000);
    expect(body.choices[0].message.content).toBe("word0 word1");

    // Exactly one provider was called once: no retry, no failover.
    const served = res.headers.get("x-gateway-offer-id");
    const [servedBy, other] = served === a ? ["a", "b"] : ["b", "a"];
    expect([a, b]).toContain(served);
    const now = counts();
    expect(now[servedBy as "a" | "b"] - before[servedBy as "a" | "b"]).toBe(1);
    expect(now[other as "a" | "b"] - before[other as "a" | "b"]).toBe(0);

    // Charged as completed: the record, x_gateway and the permit's ledger agree.
    const charged = res.headers.get("x-gateway-credits-charged");
    let record: RecordRow | undefined;
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query<RecordRow>(
        `SELECT id, status, billing, credits_charged::text, input_tokens::text,
                  output_tokens::text, offer_id
             FROM inference_requests WHERE id = $1`,
        [res.headers.get("x-gateway-request-id")],
      );
      record = rows[0];
      return record !== undefined && record.status !== "pending";
    }, 15_000);
    expect(record).toMatchObject({ status: "completed", output_tokens: "2", offer_id: served });
    const expected = priceCredits(
      demoTariff,
      { inputTokens: BigInt(record!.input_tokens), outputTokens: 2n },
      false,
    );
    expect(record!.credits_charged).toBe(expected.toString());
    expect(charged).toBe(expected.toString());
    await eventually(
      async () => (await permitLedger(stack.database.db.pool, permitId)).reserved === 0n,
      15_000,
    );
    const ledgerAfter = await permitLedger(stack.database.db.pool, permitId);
    expect(ledgerAfter.charged - ledgerBefore.charged).toBe(expected);
  }, 90_000);
});
