import OpenAI from "openai";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import { priceCredits } from "../src/domain/pricing.js";
import { demoTariff } from "../src/dev/demo-market.js";
import { grpcClient, grpcServerStream } from "./helpers/grpc.js";
import { closePermit, onboard, openPermit, requestClose, setOffer } from "./helpers/market.js";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";

const messages = [{ role: "user" as const, content: "hello gateway" }];

describe("metered chat completions", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let offset = 0;
  const clock = () => Math.floor(Date.now() / 1000) + offset;
  let chatOffer: Hex;
  let pausedOffer: Hex;

  beforeAll(async () => {
    stack = await startTestStack(
      { ALLOW_PRIVATE_ENDPOINTS: "true", PROBE_INTERVAL_MS: "600000", PERMIT_CACHE_MS: "0" },
      { clock },
    );
    fake = await startFakeUpstream({ models: ["demo-chat"], chunks: 5 });
    chatOffer = stack.demo.offers.find(
      (o) => o.status === "active" && o.modelId === stack.demo.models[0]!.modelId,
    )!.offerId;
    pausedOffer = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    await onboard(stack, chatOffer, fake.url);
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => {
    offset = 0;
    fake.setOptions({
      failStatus: undefined,
      failMidStream: false,
      delayMs: 0,
      omitUsage: false,
      chunks: 5,
    });
  });

  const chat = (body: object, headers: Record<string, string> = {}) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        ...headers,
      },
      body: JSON.stringify(body),
    });
  const requestCount = async () =>
    Number(
      (
        await stack.database.db.pool.query<{ n: string }>(
          "SELECT count(*) AS n FROM inference_requests",
        )
      ).rows[0]!.n,
    );

  it("serves the official openai SDK, JSON and streaming, with the X-Gateway headers and a charge by the tariff", async () => {
    const client = new OpenAI({
      apiKey: stack.apiKey,
      baseURL: `${stack.gateway.url}/v1`,
      defaultHeaders: { "X-Gateway-Permit": stack.demo.permitId },
      maxRetries: 0,
    });
    const { data: completion, response } = await client.chat.completions
      .create({ model: "demo-chat", messages, max_tokens: 16 })
      .withResponse();
    expect(completion.choices[0]!.message.content).toEqual(expect.any(String));
    for (const name of [
      "x-gateway-request-id",
      "x-gateway-quote-id",
      "x-gateway-offer-id",
      "x-gateway-tariff-version",
      "x-gateway-credits-charged",
    ]) {
      expect(response.headers.get(name), name).toBeTruthy();
    }
    expect(response.headers.get("x-gateway-offer-id")).toBe(chatOffer);
    const requestId = response.headers.get("x-gateway-request-id")!;
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    const expected = priceCredits(
      demoTariff,
      {
        inputTokens: BigInt(completion.usage!.prompt_tokens),
        outputTokens: BigInt(completion.usage!.completion_tokens),
      },
      false,
    );
    expect(record).toMatchObject({
      id: requestId,
      object: "inference.request",
      status: "completed",
      billing: "billed",
      stream: false,
      credits_charged: expected.toString(),
      input_tokens: String(completion.usage!.prompt_tokens),
      output_tokens: String(completion.usage!.completion_tokens),
      settlement: { status: "unsettled" },
    });
    expect(response.headers.get("x-gateway-credits-charged")).toBe(expected.toString());
    expect(BigInt(record.credits_charged)).toBeLessThanOrEqual(BigInt(record.maximum_credits));

    const { data: stream, response: streamResponse } = await client.chat.completions
      .create({ model: "demo-chat", messages, stream: true })
      .withResponse();
    let text = "";
    let last: unknown;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      last = chunk;
    }
    expect(text.length).toBeGreaterThan(0);
    const gateway = (last as { x_gateway: Record<string, string> }).x_gateway;
    expect(gateway).toMatchObject({
      request_id: streamResponse.headers.get("x-gateway-request-id"),
      billing: "billed",
    });
    const streamed = await json(await authed(stack, `/v1/requests/${gateway.request_id}`));
    expect(streamed).toMatchObject({
      status: "completed",
      stream: true,
      credits_charged: gateway.credits_charged,
    });
    expect(BigInt(streamed.credits_charged)).toBeLessThanOrEqual(BigInt(streamed.maximum_credits));
    // The gateway asked for usage upstream, and hid the usage-only chunk from a client that did not.
    const upstreamBody = fake.requests.at(-1)!.body as {
      stream_options?: { include_usage?: boolean };
    };
    expect(upstreamBody.stream_options?.include_usage).toBe(true);
  });

  it("sends the SSE trailer and keeps the usage chunk for a client that asked for it", async () => {
    const res = await chat({
      model: "demo-chat",
      messages,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const text = await res.text();
    const events = text
      .split("\n\n")
      .filter((e) => e.startsWith("data: "))
      .map((e) => e.slice(6));
    expect(events.at(-1)).toBe("[DONE]");
    const parsed = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(parsed.some((c) => Array.isArray(c.choices) && c.choices.length === 0 && c.usage)).toBe(
      true,
    );
    expect(parsed.at(-1).x_gateway.credits_charged).toMatch(/^\d+$/);
  });

  it("rejects each permit problem with 402 and its code, without calling the provider", async () => {
    const coderPermit = await openPermit(stack, { model: 1, deposit: 10n ** 18n });
    const pinned = await openPermit(stack, { offerId: chatOffer, deposit: 10n ** 18n });
    const tiny = await openPermit(stack, { deposit: 1n });
    const closing = await openPermit(stack, { deposit: 10n ** 18n });
    await requestClose(stack, closing);
    const closed = await openPermit(stack, { deposit: 10n ** 18n });
    await closePermit(stack, closed);
    const block = await stack.clients.publicClient.getBlock();
    const expiresAt = block.timestamp + 3600n;
    const expiring = await openPermit(stack, { deposit: 10n ** 18n, expiresAt });

    const calls = fake.calls("/v1/chat/completions");
    const before = await requestCount();
    const cases: [Record<string, string>, object, string][] = [
      [{ "x-gateway-permit": "" }, {}, "permit_missing"],
      [{ "x-gateway-permit": `0x${"42".repeat(32)}` }, {}, "permit_not_found"],
      [{ "x-gateway-permit": coderPermit }, {}, "permit_model_mismatch"],
      [{ "x-gateway-permit": pinned }, { offer: pausedOffer }, "permit_offer_mismatch"],
      [{ "x-gateway-permit": tiny }, {}, "insufficient_credits"],
      [{ "x-gateway-permit": closing }, {}, "permit_closing"],
      [{ "x-gateway-permit": closed }, {}, "permit_closed"],
    ];
    for (const [headers, extra, code] of cases) {
      const res = await chat({ model: "demo-chat", messages, ...extra }, headers);
      const body = await json(res);
      expect(res.status, `${code}: ${JSON.stringify(body).slice(0, 300)}`).toBe(402);
      expect(body.error, code).toMatchObject({ code, type: "payment_required" });
    }
    offset = Number(expiresAt) - Math.floor(Date.now() / 1000) + 1; // the gateway's clock is past the expiry
    const expired = await chat({ model: "demo-chat", messages }, { "x-gateway-permit": expiring });
    expect(expired.status).toBe(402);
    expect((await json(expired)).error.code).toBe("permit_expired");
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    expect(await requestCount()).toBe(before);
  });

  describe("quotes", () => {
    const quoteBody = {
      model: "demo-chat",
      messages,
      max_tokens: 32,
      tools: [{ type: "function", function: { name: "f", parameters: {} } }],
      tool_choice: "auto",
      response_format: { type: "text" },
    };
    const quote = async (body: object = quoteBody) => {
      const res = await authed(stack, "/v1/quotes", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      expect(res.status).toBe(200);
      return json(res);
    };

    it("returns every Quote field", async () => {
      const before = clock();
      const q = await quote();
      expect(q).toMatchObject({
        quote_id: expect.stringMatching(/^0x[0-9a-f]{64}$/),
        model: "demo-chat",
        model_id: stack.demo.models[0]!.modelId,
        offer_id: chatOffer,
        tariff_version: "1",
        input_tokens: expect.stringMatching(/^\d+$/),
        max_output_tokens: "32",
        wakes_endpoint: false,
        maximum_credits: expect.stringMatching(/^\d+$/),
      });
      expect(q.expires_at).toBeGreaterThanOrEqual(before + 60);
      expect(q.expires_at).toBeLessThanOrEqual(clock() + 60);
      const expected = priceCredits(
        demoTariff,
        { inputTokens: BigInt(q.input_tokens), outputTokens: 32n },
        false,
      );
      expect(q.maximum_credits).toBe(expected.toString());
    });

    it("binds a chat to its quote: used once, mismatches and age refused", async () => {
      const q = await quote();
      const ok = await chat(quoteBody, { "x-gateway-quote": q.quote_id });
      expect(ok.status).toBe(200);
      expect(ok.headers.get("x-gateway-quote-id")).toBe(q.quote_id);
      const reused = await chat(quoteBody, { "x-gateway-quote": q.quote_id });
      expect(reused.status).toBe(409);
      expect((await json(reused)).error.code).toBe("quote_used");

      const changes: Record<string, object> = {
        model: { model: "chat" }, // an alias of the same model is still another model string
        messages: { messages: [{ role: "user", content: "something else" }] },
        "output limit": { max_tokens: 33 },
        tools: { tools: [] },
        "tool choice": { tool_choice: "none" },
        "response format": { response_format: { type: "json_object" } },
      };
      for (const [field, change] of Object.entries(changes)) {
        const fresh = await quote();
        const res = await chat({ ...quoteBody, ...change }, { "x-gateway-quote": fresh.quote_id });
        expect(res.status, field).toBe(409);
        expect((await json(res)).error.code, field).toBe("quote_mismatch");
      }
      // Key order does not matter.
      const reordered = await quote();
      const { response_format, tool_choice, tools, max_tokens, model, messages: m } = quoteBody;
      const res = await chat(
        { response_format, tool_choice, tools, max_tokens, messages: m, model },
        { "x-gateway-quote": reordered.quote_id },
      );
      expect(res.status).toBe(200);
    });

    it("refuses a 61-second-old quote and an unknown one", async () => {
      const q = await quote();
      offset = 61;
      const old = await chat(quoteBody, { "x-gateway-quote": q.quote_id });
      expect(old.status).toBe(409);
      expect((await json(old)).error.code).toBe("quote_expired");
      const unknown = await chat(quoteBody, { "x-gateway-quote": `0x${"77".repeat(32)}` });
      expect(unknown.status).toBe(404);
      expect((await json(unknown)).error.code).toBe("quote_not_found");
    });
  });

  describe("streams that end early", () => {
    it("aborts the provider at once when the client disconnects, and charges the partial answer", async () => {
      fake.setOptions({ delayMs: 200, chunks: 50 });
      const abort = new AbortController();
      const res = await chat({ model: "demo-chat", messages, stream: true }, {});
      const requestId = res.headers.get("x-gateway-request-id")!;
      const reader = res.body!.getReader();
      let received = "";
      while (!received.includes('"content":"'))
        received += new TextDecoder().decode((await reader.read()).value);
      const upstreamRequest = fake.requests.at(-1)!;
      const cancelledAt = Date.now();
      await reader.cancel();
      abort.abort();
      expect(await upstreamRequest.finished).toBe("aborted");
      expect(Date.now() - cancelledAt).toBeLessThan(1000);
      await eventually(
        async () =>
          (await json(await authed(stack, `/v1/requests/${requestId}`))).status === "cancelled",
        3000,
      );
      const record = await json(await authed(stack, `/v1/requests/${requestId}`));
      expect(record.billing).toBe("partial");
      expect(BigInt(record.credits_charged)).toBeGreaterThan(0n);
      expect(BigInt(record.credits_charged)).toBeLessThanOrEqual(BigInt(record.maximum_credits));
    });

    it("ends the SSE with an error event when the provider dies mid-stream, and records the failure", async () => {
      fake.setOptions({ failMidStream: true, failAfterChunks: 2, chunks: 10 });
      const res = await chat({ model: "demo-chat", messages, stream: true });
      expect(res.status).toBe(200);
      const text = await res.text();
      const events = text
        .split("\n\n")
        .filter((e) => e.startsWith("data: "))
        .map((e) => e.slice(6));
      expect(events.at(-1)).not.toBe("[DONE]");
      expect(JSON.parse(events.at(-1)!).error).toMatchObject({
        code: "upstream_error",
        type: "api_error",
      });
      const record = await json(
        await authed(stack, `/v1/requests/${res.headers.get("x-gateway-request-id")}`),
      );
      expect(record.status).toBe("failed");
      expect(["partial", "void"]).toContain(record.billing);
    });
  });

  describe("idempotency", () => {
    it("replays a JSON answer with one upstream call and one charge", async () => {
      const key = `idem-json-${Date.now()}`;
      const calls = fake.calls("/v1/chat/completions");
      const first = await chat({ model: "demo-chat", messages }, { "idempotency-key": key });
      const firstBody = await first.text();
      const second = await chat({ model: "demo-chat", messages }, { "idempotency-key": key });
      expect(second.status).toBe(first.status);
      expect(await second.text()).toBe(firstBody);
      for (const name of [
        "x-gateway-request-id",
        "x-gateway-quote-id",
        "x-gateway-offer-id",
        "x-gateway-tariff-version",
        "x-gateway-credits-charged",
      ]) {
        expect(second.headers.get(name), name).toBe(first.headers.get(name));
      }
      expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
      const { rows } = await stack.database.db.pool.query(
        "SELECT count(*)::int AS n FROM inference_requests WHERE id = $1",
        [first.headers.get("x-gateway-request-id")],
      );
      expect(rows[0].n).toBe(1);

      const other = await chat(
        { model: "demo-chat", messages: [{ role: "user", content: "other" }] },
        { "idempotency-key": key },
      );
      expect(other.status).toBe(422);
      expect((await json(other)).error.code).toBe("idempotency_key_reused");
    });

    it("replays a stream's events, and refuses a duplicate in flight", async () => {
      const key = `idem-sse-${Date.now()}`;
      fake.setOptions({ delayMs: 100 });
      const calls = fake.calls("/v1/chat/completions");
      const first = chat(
        { model: "demo-chat", messages, stream: true },
        { "idempotency-key": key },
      );
      await eventually(async () => fake.calls("/v1/chat/completions") > calls, 3000, 10);
      const duplicate = await chat(
        { model: "demo-chat", messages, stream: true },
        { "idempotency-key": key },
      );
      expect(duplicate.status).toBe(409);
      expect((await json(duplicate)).error.code).toBe("idempotency_in_progress");
      const firstText = await (await first).text();
      const replay = await chat(
        { model: "demo-chat", messages, stream: true },
        { "idempotency-key": key },
      );
      expect(await replay.text()).toBe(firstText);
      expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    });
  });

  it("streams metered chunks and the final charge to a @grpc/grpc-js client", async () => {
    const client = grpcClient(stack.gateway.url);
    try {
      const responses = await grpcServerStream(
        client,
        InferenceService.method.streamChatCompletion,
        {
          body: new TextEncoder().encode(
            JSON.stringify({ model: "demo-chat", messages, stream: true }),
          ),
          permitId: stack.demo.permitId,
        },
        { authorization: `Bearer ${stack.apiKey}` },
      );
      expect(responses[0]!.event.case).toBe("started");
      const chunks = responses.filter((r) => r.event.case === "chunk");
      expect(chunks.length).toBeGreaterThan(1);
      const outputs = chunks.map((c) =>
        c.event.case === "chunk" ? c.event.value.metering!.outputTokens : -1n,
      );
      expect(outputs).toEqual([...outputs].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)));
      const last = responses.at(-1)!;
      expect(last.event.case).toBe("completed");
      if (last.event.case === "completed") {
        expect(BigInt(last.event.value.creditsCharged)).toBeGreaterThan(0n);
        const record = await json(
          await authed(stack, `/v1/requests/${last.event.value.requestId}`),
        );
        expect(record.credits_charged).toBe(last.event.value.creditsCharged);
      }
    } finally {
      client.close();
    }
  });

  it("validates the chat request and stores nothing for an invalid one", async () => {
    const before = await requestCount();
    const cases: [string | object, number, string][] = [
      ["{not json", 400, "invalid_json"],
      [{ messages }, 400, "invalid_request"],
      [{ model: "demo-chat", messages: [] }, 400, "invalid_request"],
      [{ model: "demo-chat", messages: [{ role: "robot", content: "x" }] }, 400, "invalid_request"],
      [{ model: "demo-chat", messages, max_tokens: 0 }, 400, "invalid_request"],
      [{ model: "demo-chat", messages, max_completion_tokens: 1.5 }, 400, "invalid_request"],
      [{ model: "demo-chat", messages, offer: "0x12" }, 400, "invalid_hex"],
      [
        { model: "demo-chat", messages: [{ role: "user", content: "x".repeat(5 * 1024 * 1024) }] },
        413,
        "request_too_large",
      ],
    ];
    for (const [body, status, code] of cases) {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });
      expect(res.status, code).toBe(status);
      expect((await json(res)).error.code, JSON.stringify(body).slice(0, 80)).toBe(code);
    }
    expect(await requestCount()).toBe(before);
  });

  it("keeps request records private to the API key that made them", async () => {
    const res = await chat({ model: "demo-chat", messages });
    const id = res.headers.get("x-gateway-request-id")!;
    const { createApiKey } = await import("../src/adapters/pg/api-keys.js");
    const other = await createApiKey(stack.database.db.pool, "other");
    const foreign = await fetch(`${stack.gateway.url}/v1/requests/${id}`, {
      headers: { authorization: `Bearer ${other.key}` },
    });
    expect(foreign.status).toBe(404);
    expect((await json(foreign)).error.code).toBe("request_not_found");
  });

  it("fails over to the next offer on a 5xx before the first byte, but never when pinned", async () => {
    const backup = await startFakeUpstream({ models: ["demo-chat"] });
    try {
      await setOffer(stack, pausedOffer, {
        status: 0,
        tariff: {
          input: demoTariff.inputPricePerMTok * 2n,
          output: demoTariff.outputPricePerMTok * 2n,
          wake: 0n,
        },
      });
      await onboard(stack, pausedOffer, backup.url);
      const verifyCalls = backup.calls("/v1/chat/completions");
      fake.setOptions({ failStatus: 500 });
      const res = await chat({ model: "demo-chat", messages });
      expect(res.status).toBe(200);
      expect(res.headers.get("x-gateway-offer-id")).toBe(pausedOffer);
      expect(backup.calls("/v1/chat/completions")).toBe(verifyCalls + 1);

      const pinned = await chat({ model: "demo-chat", messages, offer: chatOffer });
      expect(pinned.status).toBe(502);
      expect((await json(pinned)).error.code).toBe("upstream_error");
      expect(backup.calls("/v1/chat/completions")).toBe(verifyCalls + 1);
    } finally {
      await setOffer(stack, pausedOffer, { status: 1 });
      await backup.stop();
    }
  });

  // Last: it stops the chain.
  it("answers 503 chain_unavailable when the chain cannot be read, with no upstream call", async () => {
    const calls = fake.calls("/v1/chat/completions");
    await stack.anvil.stop();
    const res = await chat({ model: "demo-chat", messages });
    expect(res.status).toBe(503);
    expect((await json(res)).error.code).toBe("chain_unavailable");
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
  });
});
