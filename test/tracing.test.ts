import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import { parseConfig } from "../src/config.js";
import { demoTariff } from "../src/dev/demo-market.js";
import { priceCredits } from "../src/domain/pricing.js";
import { createTracing } from "../src/runtime/tracing.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcServerStream } from "./helpers/grpc.js";
import { openPermit } from "./helpers/market.js";
import { startOtlpReceiver, type ReceivedSpan } from "./helpers/otlp-receiver.js";
import { flush, settlingEnv } from "./helpers/settlement.js";
import { sseData } from "./helpers/sse.js";
import { authed, eventually, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Issue 21, item 4: OpenTelemetry spans (off by default) with the GenAI conventions and the
 * gateway's own attributes, received by a real OTLP/HTTP receiver from a real stack: a JSON
 * chat, an SSE chat, a dialect request, an RPC stream, a refused request and a settlement flush.
 */

// What the fake provider reports for every answer here: the usage the charge is priced on.
const usage = {
  prompt_tokens: 20,
  completion_tokens: 8,
  prompt_tokens_details: { cached_tokens: 12 },
  completion_tokens_details: { reasoning_tokens: 5 },
};
const price = priceCredits(demoTariff, { inputTokens: 20n, outputTokens: 8n }, false).toString();

const chatBody = (stream: boolean) =>
  JSON.stringify({
    model: "demo-chat",
    messages: [{ role: "user", content: "hello" }],
    max_tokens: 64,
    stream,
  });

describe("tracing", () => {
  let receiver: Awaited<ReturnType<typeof startOtlpReceiver>>;
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let permitId: Hex;

  beforeAll(async () => {
    receiver = await startOtlpReceiver();
    ({ stack, fake, chatOffer } = await startChatStack(
      {
        ...settlingEnv,
        OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
        OTEL_SERVICE_NAME: "gateway-under-test",
      },
      { chunks: 3 },
    ));
    fake.setOptions({ usage });
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
  }, 90_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
    await receiver?.stop();
  });

  it("is off without an OTLP endpoint", () => {
    const base = {
      RPC_URL: "http://127.0.0.1:8545",
      CHAIN_ID: "31337",
      MARKET_ADDRESS: "0x5FbDB2315678afecb367f032d93F642f64180aa3",
      SETTLEMENT_OPERATOR_TOKEN: "s3cret-operator-token-123",
    };
    expect(createTracing(parseConfig(base), stack.logger)).toBeUndefined();
  });

  it("exports a span per chat (REST, SSE, dialect, RPC, refused) and per settlement batch", async () => {
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    const parentId = "00f067aa0ba902b7";
    // 1. A JSON chat, in the caller's trace (W3C traceparent).
    const json = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        traceparent: `00-${traceId}-${parentId}-01`,
      },
      body: chatBody(false),
    });
    expect(json.status).toBe(200);
    await json.text();
    const jsonId = json.headers.get("x-gateway-request-id")!;
    expect(json.headers.get("x-gateway-credits-charged")).toBe(price);

    // 2. An SSE chat.
    const sse = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: chatBody(true),
    });
    expect(sse.status).toBe(200);
    const sseEvents = sseData(await sse.text());
    expect(sseEvents.at(-1)).toBe("[DONE]");
    const sseX = (JSON.parse(sseEvents.at(-2)!) as { x_gateway: Record<string, string> }).x_gateway;
    expect(sseX["credits_charged"]).toBe(price);
    const sseId = sse.headers.get("x-gateway-request-id")!;

    // 3. A dialect request (Anthropic Messages).
    const messages = await authed(stack, "/v1/messages", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({
        model: "demo-chat",
        max_tokens: 64,
        messages: [{ role: "user", content: "hi" }],
      }),
    });
    expect(messages.status).toBe(200);
    const messagesX = ((await messages.json()) as { x_gateway: Record<string, string> }).x_gateway;
    const messagesId = messagesX["request_id"]!;

    // 4. The RPC itself (gRPC), streaming.
    const client = grpcClient(stack.gateway.url);
    let rpcId: string;
    try {
      const responses = await grpcServerStream(
        client,
        InferenceService.method.streamChatCompletion,
        { body: new TextEncoder().encode(chatBody(true)), permitId },
        { authorization: `Bearer ${stack.apiKey}` },
      );
      const last = responses.at(-1)!.event;
      if (last.case !== "completed") throw new Error(`the stream ended with ${last.case}`);
      rpcId = last.value.requestId;
    } finally {
      client.close();
    }

    // 5. A refused request: its error code, and nothing reserved.
    const refused = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
    });
    expect(refused.status).toBe(404);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
      "model_not_found",
    );

    // 6. A settlement flush of those four charges.
    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    const batch = (flushed.body as { batches: Record<string, unknown>[] }).batches[0]!;
    expect(batch).toMatchObject({ status: "settled", requests: 4 });

    // The batch processor exports within its delay (5 s by default).
    const chats = () => receiver.spans.filter((s) => s.name.startsWith("chat"));
    await eventually(
      async () => chats().length >= 5 && receiver.spans.some((s) => s.name === "settlement batch"),
      15_000,
      100,
    );
    expect(receiver.contentTypes.every((t) => t === "application/json")).toBe(true);
    expect(new Set(receiver.spans.map((s) => s.serviceName))).toEqual(
      new Set(["gateway-under-test"]),
    );

    const byRequest = (requestId: string): ReceivedSpan => {
      const found = chats().filter((s) => s.attributes["gateway.request.id"] === requestId);
      expect(found).toHaveLength(1);
      return found[0]!;
    };
    const completed = (requestId: string, stream: boolean) => ({
      name: "chat demo-chat",
      kind: 2, // SERVER
      attributes: {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "demo-chat",
        "gen_ai.usage.input_tokens": 20,
        "gen_ai.usage.output_tokens": 8,
        "gen_ai.usage.cache_read.input_tokens": 12,
        "gen_ai.usage.reasoning.output_tokens": 5,
        "gateway.request.id": requestId,
        "gateway.offer.id": chatOffer,
        "gateway.permit.id": permitId,
        "gateway.charge.credits": price,
        "gateway.billing": "billed",
        "gateway.status": "completed",
        "gateway.usage.source": "provider",
        "gateway.stream": stream,
      },
    });

    const jsonSpan = byRequest(jsonId);
    expect(jsonSpan).toMatchObject(completed(jsonId, false));
    expect(jsonSpan.traceId).toBe(traceId);
    expect(jsonSpan.parentSpanId).toBe(parentId);
    expect(jsonSpan.events).toEqual(["permit", "route", "reserved", "upstream", "closed"]);
    expect(jsonSpan.attributes["gateway.quote.id"]).toMatch(/^0x[0-9a-f]{64}$/);
    expect(BigInt(jsonSpan.attributes["gateway.charge.maximum_credits"] as string)).toBeGreaterThan(
      BigInt(price),
    );
    expect(jsonSpan.status.code ?? 0).toBe(0);
    expect(jsonSpan.attributes["error.type"]).toBeUndefined();

    const sseSpan = byRequest(sseId);
    expect(sseSpan).toMatchObject(completed(sseId, true));
    expect(sseSpan.events).toEqual([
      "permit",
      "route",
      "reserved",
      "upstream",
      "first_token",
      "closed",
    ]);
    // No traceparent: a trace of its own.
    expect(sseSpan.parentSpanId).toBeUndefined();
    expect(sseSpan.traceId).not.toBe(traceId);

    expect(byRequest(messagesId)).toMatchObject({
      ...completed(messagesId, false),
      attributes: { ...completed(messagesId, false).attributes, "gateway.dialect": "messages" },
    });
    expect(byRequest(rpcId)).toMatchObject(completed(rpcId, true));

    const refusedSpan = chats().find(
      (s) => s.attributes["gen_ai.request.model"] === "no-such-model",
    )!;
    expect(refusedSpan).toMatchObject({
      name: "chat no-such-model",
      status: { code: 2, message: "model_not_found" }, // ERROR
      attributes: { "error.type": "model_not_found", "gen_ai.operation.name": "chat" },
    });
    expect(refusedSpan.attributes["gateway.request.id"]).toBeUndefined();
    expect(refusedSpan.attributes["gateway.charge.credits"]).toBeUndefined();

    const batchSpans = receiver.spans.filter((s) => s.name === "settlement batch");
    expect(batchSpans).toHaveLength(1);
    expect(batchSpans[0]!.attributes).toEqual({
      "gateway.settlement.batch_id": batch["batch_id"],
      "gateway.settlement.status": "settled",
      "gateway.settlement.requests": 4,
      "gateway.settlement.charges": batch["charges"],
      "gateway.settlement.credits": (4n * BigInt(price)).toString(),
      "gateway.settlement.tx_hash": batch["tx_hash"],
      "gateway.settlement.gas": expect.stringMatching(/^[1-9]\d*$/) as unknown,
    });
    expect(batch["credits"]).toBe((4n * BigInt(price)).toString());

    // Nothing secret in any attribute: the API key, the operator token, the provider's endpoint.
    const everything = JSON.stringify(receiver.spans);
    for (const secret of [stack.apiKey, stack.operatorToken, fake.url]) {
      expect(everything).not.toContain(secret);
    }
  }, 60_000);

  it("marks a quoted chat's quote step, and a replay of an Idempotency-Key as replayed", async () => {
    const quoted = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatBody(false),
    });
    expect(quoted.status).toBe(200);
    const quoteId = ((await quoted.json()) as { quote_id: string }).quote_id;
    const key = `trace-${Date.now()}`;
    const send = () =>
      authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "x-gateway-permit": permitId,
          "x-gateway-quote": quoteId,
          "idempotency-key": key,
        },
        body: chatBody(false),
      });
    const first = await send();
    expect(first.status).toBe(200);
    await first.text();
    const requestId = first.headers.get("x-gateway-request-id")!;
    const again = await send();
    expect(again.status).toBe(200);
    await again.text();
    expect(again.headers.get("x-gateway-request-id")).toBe(requestId);

    const replayed = () =>
      receiver.spans.filter((s) => s.name === "chat demo-chat" && s.events.includes("replayed"));
    await eventually(async () => replayed().length === 1, 15_000, 100);
    const served = receiver.spans.filter((s) => s.attributes["gateway.request.id"] === requestId);
    expect(served).toHaveLength(1);
    expect(served[0]!.events).toEqual([
      "quote",
      "permit",
      "route",
      "reserved",
      "upstream",
      "closed",
    ]);
    expect(served[0]!.attributes).toMatchObject({
      "gateway.quote.id": quoteId,
      "gateway.charge.credits": price,
      "gen_ai.usage.input_tokens": 20,
    });
    // The replay answers from the stored result: nothing reserved, routed or charged again.
    expect(replayed()[0]!.events).toEqual(["replayed"]);
    expect(replayed()[0]!.attributes["gateway.charge.credits"]).toBeUndefined();
  }, 30_000);
});
