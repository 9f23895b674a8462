import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { demoTariff } from "../src/dev/demo-market.js";
import { strayChunkLimit } from "../src/domain/chat/output-tally.js";
import { priceCredits } from "../src/domain/pricing.js";
import type { TokenCounter } from "../src/domain/tokens.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { demoChatCounter, promptTokens } from "./helpers/token-counts.js";

/**
 * Issue 35: tolerance only for what the client received. The reproductions of the issue over
 * real HTTP (a fake provider, the gateway in process, the demo model's own tokenizer): "Hi"
 * padded with empty tool-call entries, choices nobody asked for, invented choice indexes, and
 * padding a dialect's translator never reads, each with a claim of the whole priced limit, are
 * charged what was delivered; an honest Chinese stream is cut at exactly its limit; the usage
 * a client's SDK reads is what was charged; a completed answer with no visible output charges
 * its input.
 */

const messages = [{ role: "user", content: "Say hi." }];
/** A claim of the whole priced limit (4,096) for whatever was sent. */
const limit = 4_096;
const claim = { prompt_tokens: 10_000, completion_tokens: limit };

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

/** A provider's stream, byte for byte: these chunks (chat.completion.chunk), then `[DONE]`. */
function rawStream(chunks: readonly object[]): Uint8Array[] {
  const encoder = new TextEncoder();
  const frame = (extra: object) => ({
    id: "chatcmpl-pad",
    object: "chat.completion.chunk",
    created: 1_700_000_000,
    model: "demo-chat",
    ...extra,
  });
  return [
    ...chunks.map((c) => encoder.encode(`data: ${JSON.stringify(frame(c))}\n\n`)),
    encoder.encode(`data: ${JSON.stringify(frame({ choices: [], usage: claim }))}\n\n`),
    encoder.encode("data: [DONE]\n\n"),
  ];
}

const delta = (index: number, d: object, finish: string | null = null) => ({
  choices: [{ index, delta: d, finish_reason: finish }],
});

/** "Hi", then 300 empty tool-call entries, then 600 one-character choices nobody asked for. */
const paddedStream = rawStream([
  delta(0, { role: "assistant", content: "Hi" }),
  {
    choices: [
      {
        index: 0,
        delta: {
          tool_calls: Array.from({ length: 300 }, (_, i) => ({
            index: i,
            id: `call_${i}`,
            type: "function",
            function: { name: "", arguments: "" },
          })),
        },
        finish_reason: null,
      },
    ],
  },
  {
    choices: Array.from({ length: 600 }, (_, i) => ({
      index: i + 1,
      delta: { content: "x" },
      finish_reason: null,
    })),
  },
  delta(0, {}, "stop"),
]);

/** The same padding in a JSON answer. */
const paddedAnswer = {
  choices: [
    {
      index: 0,
      message: {
        role: "assistant",
        content: "Hi",
        tool_calls: Array.from({ length: 300 }, (_, i) => ({
          id: `call_${i}`,
          type: "function",
          function: { name: "", arguments: "" },
        })),
      },
      finish_reason: "stop",
    },
    ...Array.from({ length: 600 }, (_, i) => ({
      index: i + 1,
      message: { role: "assistant", content: "x" },
      finish_reason: "stop",
    })),
  ],
  usage: claim,
};

describe("tolerance only for what the client received (issue 35)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let counter: TokenCounter;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({}, { chunks: 5 }));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    counter = (await demoChatCounter())!;
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
      rawStream: undefined,
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

  it('chat SSE: "Hi" plus 300 empty tool calls and 600 choices nobody asked for is charged "Hi"', async () => {
    fake.setOptions({ rawStream: paddedStream });
    const body = { model: "demo-chat", messages, max_tokens: limit, stream: true };
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const events = sse(await res.text());
    const chunks = events
      .slice(0, -2)
      .map((e) => JSON.parse(e.data) as { choices: { index: number }[] });
    // Nothing of the choices nobody asked for reached the client.
    expect(chunks.every((c) => c.choices.every((choice) => choice.index === 0))).toBe(true);
    const input = await promptTokens(counter, body);
    const output = counter.countOutput("Hi");
    const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, unknown> }).x_gateway;
    expect(x).toMatchObject({
      output_tokens: output.toString(),
      credits_charged: charge(input, output),
      usage_source: "gateway",
    });
    expect(await record(x["request_id"] as string)).toMatchObject({
      status: "completed",
      input_tokens: input.toString(),
      output_tokens: output.toString(),
      credits_charged: charge(input, output),
    });
  });

  it('chat JSON: the same padding is dropped from the answer and charged "Hi"; the usage shown is the charge', async () => {
    fake.setOptions({ extraMembers: paddedAnswer });
    const body = { model: "demo-chat", messages, max_tokens: limit };
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const answer = (await res.json()) as {
      choices: { index: number }[];
      usage: Record<string, unknown>;
    };
    expect(answer.choices.map((c) => c.index)).toEqual([0]);
    const input = await promptTokens(counter, body);
    const output = counter.countOutput("Hi");
    expect(answer.usage).toMatchObject({
      prompt_tokens: Number(input),
      completion_tokens: Number(output),
      total_tokens: Number(input + output),
    });
    expect(await record(res.headers.get("x-gateway-request-id")!)).toMatchObject({
      output_tokens: output.toString(),
      credits_charged: charge(input, output),
      usage_claimed: { output_tokens: String(limit) },
    });
  });

  it("invented choice indexes are never relayed or counted; a provider that keeps sending them fails", async () => {
    const invented = [-1, 0.5, 1, 2 ** 40, 1e300];
    fake.setOptions({
      rawStream: rawStream([
        delta(0, { role: "assistant", content: "Hi" }),
        ...invented.map((index) => delta(index, { content: " padding" })),
        delta(0, {}, "stop"),
      ]),
    });
    const body = { model: "demo-chat", messages, max_tokens: limit, stream: true };
    const res = await post("/v1/chat/completions", body);
    const events = sse(await res.text());
    const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, string> }).x_gateway;
    expect(x["output_tokens"]).toBe(counter.countOutput("Hi").toString());
    expect(events.slice(0, -2).some((e) => e.data.includes("padding"))).toBe(false);

    // Past the limit of such chunks, the stream fails as the provider's: the client gets an
    // error event, and is charged at most what it was sent.
    fake.setOptions({
      rawStream: rawStream([
        delta(0, { role: "assistant", content: "Hi" }),
        ...Array.from({ length: strayChunkLimit + 5 }, (_, i) => delta(i + 1, { content: "x" })),
      ]),
    });
    const failing = await post("/v1/chat/completions", body);
    const failed = sse(await failing.text());
    expect(JSON.parse(failed.at(-1)!.data)).toMatchObject({ error: { code: "upstream_error" } });
    expect(await record(failing.headers.get("x-gateway-request-id")!)).toMatchObject({
      status: "failed",
      output_tokens: counter.countOutput("Hi").toString(),
    });
  });

  for (const [path, dialect] of [
    ["/v1/responses", "responses"],
    ["/v1/messages", "messages"],
  ] as const) {
    for (const stream of [false, true]) {
      it(`${path} ${stream ? "stream" : "JSON"}: padding the translator never reads is not charged; its usage is the charge`, async () => {
        fake.setOptions(stream ? { rawStream: paddedStream } : { extraMembers: paddedAnswer });
        const body =
          dialect === "responses"
            ? { model: "demo-chat", input: "Say hi.", max_output_tokens: limit, stream }
            : { model: "demo-chat", messages, max_tokens: limit, stream };
        const res = await post(path, body);
        expect(res.status).toBe(200);
        const text = await res.text();
        const last = stream
          ? (JSON.parse(sse(text).at(-1)!.data) as Record<string, unknown>)
          : (JSON.parse(text) as Record<string, unknown>);
        const x = last["x_gateway"] as Record<string, string>;
        const input = await promptTokens(counter, body, dialect);
        const output = counter.countOutput("Hi");
        expect(x).toMatchObject({
          output_tokens: output.toString(),
          credits_charged: charge(input, output),
        });
        // The usage the SDK reads: the charge.
        if (dialect === "responses") {
          const response = (stream ? last["response"] : last) as { usage: Record<string, number> };
          expect(response.usage).toMatchObject({
            input_tokens: Number(input),
            output_tokens: Number(output),
          });
        } else if (!stream) {
          expect(last["usage"]).toMatchObject({ output_tokens: Number(output) });
        } else {
          const messageDelta = sse(text).find((e) => e.event === "message_delta")!;
          expect(JSON.parse(messageDelta.data)).toMatchObject({
            usage: { output_tokens: Number(output) },
          });
        }
      });
    }
  }

  it("an honest Chinese stream with max_tokens 1000 is cut at exactly 1,000 tokens of the model's tokenizer", async () => {
    const text = "我们今天讨论一下这个问题的解决方案，并且尽量说明每一个步骤的原因。".repeat(200);
    const pieces: object[] = [delta(0, { role: "assistant", content: "" })];
    for (let at = 0; at < text.length; at += 3)
      pieces.push(delta(0, { content: text.slice(at, at + 3) }));
    fake.setOptions({ rawStream: rawStream(pieces) });
    const body = { model: "demo-chat", messages, max_tokens: 1_000, stream: true };
    const res = await post("/v1/chat/completions", body);
    const events = sse(await res.text());
    const chunks = events.slice(0, -2).map(
      (e) =>
        JSON.parse(e.data) as {
          choices: { delta: { content?: string }; finish_reason: string | null }[];
        },
    );
    const content = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
    expect(counter.countOutput(content)).toBe(1_000n);
    expect(text.startsWith(content)).toBe(true);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("length");
    const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, string> }).x_gateway;
    expect(x["output_tokens"]).toBe("1000");
  });

  it("SSE with include_usage: the usage chunk is the charge, the claim only in x_gateway", async () => {
    fake.setOptions({ usage: claim });
    const body = {
      model: "demo-chat",
      messages,
      max_tokens: limit,
      stream: true,
      stream_options: { include_usage: true },
    };
    const res = await post("/v1/chat/completions", body);
    const events = sse(await res.text());
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.data) as Record<string, unknown>);
    const withUsage = chunks.filter((c) => c["usage"] !== undefined && c["usage"] !== null);
    expect(withUsage).toHaveLength(1);
    const x = chunks.at(-1)!["x_gateway"] as Record<string, Record<string, string> | string>;
    expect(withUsage[0]!["usage"]).toMatchObject({
      prompt_tokens: Number(x["input_tokens"]),
      completion_tokens: Number(x["output_tokens"]),
    });
    expect(x["usage_claimed"]).toMatchObject({ output_tokens: String(limit) });
  });

  it("a completed answer with no visible output is not void: its input is charged", async () => {
    fake.setOptions({
      rawStream: rawStream([delta(0, { role: "assistant", content: "" }), delta(0, {}, "stop")]),
    });
    const body = { model: "demo-chat", messages, max_tokens: limit, stream: true };
    const res = await post("/v1/chat/completions", body);
    const events = sse(await res.text());
    const x = (JSON.parse(events.at(-2)!.data) as { x_gateway: Record<string, string> }).x_gateway;
    const input = await promptTokens(counter, body);
    expect(await record(x["request_id"]!)).toMatchObject({
      status: "completed",
      billing: "billed",
      input_tokens: input.toString(),
      output_tokens: "0",
      credits_charged: charge(input, 0n),
    });
  });
});
