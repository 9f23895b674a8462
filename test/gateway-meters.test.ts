import type { Hex } from "viem";
import { generatePrivateKey } from "viem/accounts";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import { demoTariff } from "../src/dev/demo-market.js";
import { priceCredits } from "../src/domain/pricing.js";
import type { TokenCounter } from "../src/domain/tokens.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcServerStream } from "./helpers/grpc.js";
import { openPermit } from "./helpers/market.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { demoChatCounter, promptTokens, truncated } from "./helpers/token-counts.js";

/**
 * Issue 27: the gateway meters, providers claim. A provider's usage report is a claim by the
 * party it pays; the payer is charged the lower of it and the gateway's own count (plus a small
 * tolerance for an honest claim), and the output priced is the most the client gets.
 */

const message = "Tell me a very short story about a lighthouse keeper and a seagull.";
const messages = [{ role: "user", content: message }];
/** What the fake answers with `chunks: 5`. */
const fiveWords = "word0 word1 word2 word3 word4";

interface Sse {
  readonly event: string | undefined;
  readonly data: string;
}
function sse(text: string): Sse[] {
  return text
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map((block) => {
      let event: string | undefined;
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      return { event, data: data.join("\n") };
    });
}

describe("the gateway meters, providers claim", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let chatOffer: Hex;
  let permitId: Hex;
  let counter: TokenCounter;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack(
      { RECEIPT_PRIVATE_KEY: generatePrivateKey() },
      { chunks: 5 },
    ));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    counter = await demoChatCounter();
  }, 90_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() =>
    fake.setOptions({
      usage: undefined,
      chunks: 5,
      ignoreLimit: false,
      extraMembers: undefined,
      omitUsage: false,
    }),
  );

  async function post(path: string, body: unknown) {
    return authed(stack, path, {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify(body),
    });
  }

  async function record(requestId: string) {
    const res = await authed(stack, `/v1/requests/${requestId}`);
    expect(res.status).toBe(200);
    return json(res);
  }

  const charge = (input: bigint, output: bigint) =>
    priceCredits(demoTariff, { inputTokens: input, outputTokens: output }, false).toString();

  /** A liar: five words, `max_tokens` claimed out and 50 times the characters sent claimed in. */
  const lie = { prompt_tokens: 50 * message.length, completion_tokens: 2_000 };

  describe("a provider that inflates its usage is charged what the gateway counted", () => {
    for (const stream of [false, true]) {
      it(`chat ${stream ? "SSE" : "JSON"}`, async () => {
        fake.setOptions({ usage: lie });
        const body = { model: "demo-chat", messages, max_tokens: 2_000, stream };
        const res = await post("/v1/chat/completions", body);
        expect(res.status).toBe(200);
        const text = await res.text();
        const requestId = res.headers.get("x-gateway-request-id")!;
        const input = await promptTokens(counter, body);
        const output = counter.countOutput(fiveWords);
        const rec = await record(requestId);
        expect(rec).toMatchObject({
          status: "completed",
          billing: "billed",
          input_tokens: input.toString(),
          output_tokens: output.toString(),
          credits_charged: charge(input, output),
          usage_source: "gateway",
          usage_claimed: {
            input_tokens: String(lie.prompt_tokens),
            output_tokens: String(lie.completion_tokens),
            cached_input_tokens: "0",
            reasoning_tokens: "0",
          },
          usage_counted: {
            input_tokens: input.toString(),
            output_tokens: output.toString(),
            cached_input_tokens: "0",
            reasoning_tokens: "0",
          },
        });
        // The receipt signs both numbers and whose was charged.
        const receipt = await authed(stack, `/v1/requests/${requestId}/receipt`);
        expect(receipt.status).toBe(200);
        const { receipt: signed } = (await receipt.json()) as {
          receipt: { message: Record<string, unknown> };
        };
        expect(signed.message).toMatchObject({
          usageSource: "gateway",
          claimed: {
            present: true,
            inputTokens: String(lie.prompt_tokens),
            outputTokens: String(lie.completion_tokens),
          },
          counted: {
            present: true,
            inputTokens: input.toString(),
            outputTokens: output.toString(),
          },
        });
        if (stream) {
          const events = sse(text);
          expect(events.at(-1)!.data).toBe("[DONE]");
          const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, unknown> })
            .x_gateway;
          expect(x).toMatchObject({
            input_tokens: input.toString(),
            output_tokens: output.toString(),
            credits_charged: charge(input, output),
          });
        } else {
          expect(res.headers.get("x-gateway-credits-charged")).toBe(charge(input, output));
        }
      });
    }

    for (const [path, dialect] of [
      ["/v1/responses", "responses"],
      ["/v1/messages", "messages"],
    ] as const) {
      for (const stream of [false, true]) {
        it(`${path} ${stream ? "stream" : "JSON"}`, async () => {
          fake.setOptions({ usage: lie });
          const body =
            dialect === "responses"
              ? { model: "demo-chat", input: message, max_output_tokens: 2_000, stream }
              : { model: "demo-chat", messages, max_tokens: 2_000, stream };
          const res = await post(path, body);
          expect(res.status).toBe(200);
          const text = await res.text();
          const x = stream
            ? (JSON.parse(sse(text).at(-1)!.data) as { x_gateway: Record<string, string> })
                .x_gateway
            : (JSON.parse(text) as { x_gateway: Record<string, string> }).x_gateway;
          const input = await promptTokens(counter, body, dialect);
          const output = counter.countOutput(fiveWords);
          expect(x).toMatchObject({
            input_tokens: input.toString(),
            output_tokens: output.toString(),
            credits_charged: charge(input, output),
          });
          expect(await record(x["request_id"]!)).toMatchObject({
            input_tokens: input.toString(),
            output_tokens: output.toString(),
            credits_charged: charge(input, output),
          });
        });
      }
    }

    it("the RPC", async () => {
      fake.setOptions({ usage: lie });
      const client = grpcClient(stack.gateway.url);
      try {
        const body = { model: "demo-chat", messages, max_tokens: 2_000, stream: true };
        const responses = await grpcServerStream(
          client,
          InferenceService.method.streamChatCompletion,
          { body: new TextEncoder().encode(JSON.stringify(body)), permitId },
          { authorization: `Bearer ${stack.apiKey}` },
        );
        const last = responses.at(-1)!.event;
        if (last.case !== "completed") throw new Error(`the stream ended with ${last.case}`);
        const input = await promptTokens(counter, body);
        const output = counter.countOutput(fiveWords);
        expect(last.value).toMatchObject({
          inputTokens: input,
          outputTokens: output,
          creditsCharged: charge(input, output),
          usageFromProvider: false,
        });
      } finally {
        client.close();
      }
    });
  });

  it("an honest provider is charged exactly what it reports", async () => {
    for (const stream of [false, true]) {
      const body = { model: "demo-chat", messages, max_tokens: 2_000, stream };
      const input = await promptTokens(counter, body);
      const output = counter.countOutput(fiveWords);
      const honest = { prompt_tokens: Number(input), completion_tokens: Number(output) + 1 };
      fake.setOptions({ usage: honest });
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      await res.text();
      expect(await record(res.headers.get("x-gateway-request-id")!)).toMatchObject({
        input_tokens: input.toString(),
        output_tokens: (output + 1n).toString(),
        credits_charged: charge(input, output + 1n),
      });
    }
  });

  describe("the priced limit is the provider's limit", () => {
    it("SSE: a provider streaming ten times the priced output is cut at the limit, finish_reason length", async () => {
      fake.setOptions({ ignoreLimit: true, chunks: 100, usage: lie });
      const body = { model: "demo-chat", messages, max_tokens: 10, stream: true };
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      const events = sse(await res.text());
      expect(events.at(-1)!.data).toBe("[DONE]");
      const chunks = events.slice(0, -2).map(
        (e) =>
          JSON.parse(e.data) as {
            choices: { delta: { content?: string }; finish_reason: string | null }[];
          },
      );
      const content = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
      expect(counter.countOutput(content)).toBe(10n);
      expect(content).toBe(
        truncated(
          counter,
          Array.from({ length: 100 }, (_, i) => (i === 0 ? "word0" : ` word${i}`)).join(""),
          10n,
        ),
      );
      expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("length");
      const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, string> })
        .x_gateway;
      expect(x["output_tokens"]).toBe("10");
      expect(await record(x["request_id"]!)).toMatchObject({ output_tokens: "10" });
    });

    it("JSON: the answer is cut at the limit, finish_reason length, charged at most it", async () => {
      fake.setOptions({ ignoreLimit: true, chunks: 100, usage: lie });
      const body = { model: "demo-chat", messages, max_tokens: 10 };
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      const answer = (await res.json()) as {
        choices: { message: { content: string }; finish_reason: string }[];
      };
      expect(counter.countOutput(answer.choices[0]!.message.content)).toBe(10n);
      expect(answer.choices[0]!.finish_reason).toBe("length");
      const input = await promptTokens(counter, body);
      expect(await record(res.headers.get("x-gateway-request-id")!)).toMatchObject({
        output_tokens: "10",
        credits_charged: charge(input, 10n),
      });
    });

    it("/v1/messages and /v1/responses end at the limit in their own words", async () => {
      fake.setOptions({ ignoreLimit: true, chunks: 100, usage: lie });
      const messagesRes = await post("/v1/messages", {
        model: "demo-chat",
        messages,
        max_tokens: 10,
      });
      expect(messagesRes.status).toBe(200);
      const m = (await messagesRes.json()) as {
        stop_reason: string;
        x_gateway: Record<string, string>;
      };
      expect(m.stop_reason).toBe("max_tokens");
      expect(m.x_gateway["output_tokens"]).toBe("10");
      const responsesRes = await post("/v1/responses", {
        model: "demo-chat",
        input: message,
        max_output_tokens: 10,
      });
      expect(responsesRes.status).toBe(200);
      const r = (await responsesRes.json()) as {
        status: string;
        incomplete_details: { reason: string } | null;
        x_gateway: Record<string, string>;
      };
      expect(r.status).toBe("incomplete");
      expect(r.incomplete_details?.reason).toBe("max_output_tokens");
      expect(r.x_gateway["output_tokens"]).toBe("10");
    });
  });

  it("a provider's own x_gateway in a JSON answer never reaches the client", async () => {
    fake.setOptions({
      extraMembers: { x_gateway: { credits_charged: "0", billing: "void" }, note: "kept" },
    });
    const res = await post("/v1/chat/completions", {
      model: "demo-chat",
      messages,
      max_tokens: 20,
    });
    expect(res.status).toBe(200);
    const answer = (await res.json()) as Record<string, unknown>;
    expect(Object.hasOwn(answer, "x_gateway")).toBe(false);
    expect(answer["note"]).toBe("kept");
    expect((answer["choices"] as unknown[]).length).toBe(1);
    expect(chatOffer).toBe(res.headers.get("x-gateway-offer-id"));
  });
});
