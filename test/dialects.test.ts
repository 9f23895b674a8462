import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Clients in their own dialects (issue 20, DESIGN.md section 9): the official `openai` SDK's
 * Responses calls and `@anthropic-ai/sdk`'s Messages calls against the gateway and the fake
 * provider, unmodified. Each answer is
 * complete, charged once, its record and `x_gateway` agree, and the SDK's parsers raise nothing.
 */

interface XGateway {
  request_id: string;
  quote_id: string;
  credits_charged: string;
  billing: string;
  input_tokens: string;
  output_tokens: string;
  usage_claimed: Record<string, string> | null;
  usage_counted: Record<string, string> | null;
  usage_source: string;
}

describe("POST /v1/responses (OpenAI Responses API, stateless)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let client: OpenAI;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({}, { chunks: 2 }));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    client = new OpenAI({
      apiKey: stack.apiKey,
      baseURL: `${stack.gateway.url}/v1`,
      defaultHeaders: { "X-Gateway-Permit": permitId },
      maxRetries: 0,
    });
  }, 90_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /** The request's record, which must agree with the answer's x_gateway. */
  async function recordOf(x: XGateway) {
    const record = await json(await authed(stack, `/v1/requests/${x.request_id}`));
    expect(record.status).toBe("completed");
    expect(record.credits_charged).toBe(x.credits_charged);
    expect(record.input_tokens).toBe(x.input_tokens);
    expect(record.output_tokens).toBe(x.output_tokens);
    // Both numbers, and whose was charged, alike in the answer and the record.
    expect(record.usage_source).toBe(x.usage_source);
    expect(record.usage_claimed).toEqual(x.usage_claimed);
    expect(record.usage_counted).toEqual(x.usage_counted);
    return record;
  }

  it("JSON: responses.create answers output_text, usage and x_gateway; the record agrees", async () => {
    const calls = fake.calls("/v1/chat/completions");
    const response = await client.responses.create({
      model: "demo-chat",
      input: "hello",
      instructions: "be brief",
      max_output_tokens: 64,
    });
    expect(response.status).toBe("completed");
    expect(response.output_text).toBe("word0 word1");
    expect(response.usage?.output_tokens).toBe(2);
    const x = (response as unknown as { x_gateway: XGateway }).x_gateway;
    expect(x.billing).toBe("billed");
    await recordOf(x);
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 1);
    // The provider got a chat completion: instructions as the system message.
    const sent = fake.requests.at(-1)!.body as {
      messages: unknown[];
      max_completion_tokens?: number;
    };
    expect(sent.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "hello" },
    ]);
  });

  it("stream: responses.stream's events end in response.completed carrying x_gateway", async () => {
    const stream = client.responses.stream({
      model: "demo-chat",
      input: "hello",
      max_output_tokens: 64,
    });
    const deltas: string[] = [];
    let last: unknown;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") deltas.push(event.delta);
      last = event;
    }
    const final = await stream.finalResponse();
    expect(deltas.join("")).toBe("word0 word1");
    expect(final.output_text).toBe("word0 word1");
    expect((last as { type: string }).type).toBe("response.completed");
    const x = (last as { x_gateway: XGateway }).x_gateway;
    expect(x.billing).toBe("billed");
    await recordOf(x);
  });

  it("a function tool round trip, streamed and as JSON", async () => {
    fake.setOptions({ toolCalls: true });
    try {
      const tools = [
        {
          type: "function" as const,
          name: "weather",
          description: "the weather in a city",
          parameters: {
            type: "object",
            properties: { city: { type: "string" } },
            required: ["city"],
            additionalProperties: false,
          },
          strict: true,
        },
      ];
      const stream = client.responses.stream({ model: "demo-chat", input: "weather?", tools });
      const first = await stream.finalResponse();
      const call = first.output.find((item) => item.type === "function_call");
      expect(call).toMatchObject({ name: "weather", arguments: '{"city":"Paris"}' });
      const callId = (call as { call_id: string }).call_id;
      const second = await client.responses.create({
        model: "demo-chat",
        tools,
        input: [
          { role: "user", content: "weather?" },
          {
            type: "function_call",
            call_id: callId,
            name: "weather",
            arguments: '{"city":"Paris"}',
          },
          { type: "function_call_output", call_id: callId, output: "sunny" },
        ],
      });
      expect(second.output_text).toBe("tool said sunny");
      const sent = fake.requests.at(-1)!.body as { messages: { role: string }[] };
      expect(sent.messages.map((m) => m.role)).toEqual(["user", "assistant", "tool"]);
    } finally {
      fake.setOptions({ toolCalls: false });
    }
  });

  it("a JSON-schema output: text.format reaches the provider as response_format", async () => {
    const response = await client.responses.create({
      model: "demo-chat",
      input: "answer",
      text: {
        format: {
          type: "json_schema",
          name: "answer",
          schema: {
            type: "object",
            properties: { answer: { type: "string" } },
            required: ["answer"],
            additionalProperties: false,
          },
          strict: true,
        },
      },
    });
    expect(JSON.parse(response.output_text)).toEqual({ answer: "word0" });
    const sent = fake.requests.at(-1)!.body as { response_format: { type: string } };
    expect(sent.response_format.type).toBe("json_schema");
  });

  it("a quote made for a Responses request binds it; a changed request is quote_mismatch", async () => {
    const body = { model: "demo-chat", input: "quoted", max_output_tokens: 32 };
    const quote = await json(
      await authed(stack, "/v1/quotes?dialect=responses", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
    const same = await client.responses.create(body, {
      headers: { "X-Gateway-Quote": quote.quote_id },
    });
    expect((same as unknown as { x_gateway: XGateway }).x_gateway.billing).toBe("billed");
    const quote2 = await json(
      await authed(stack, "/v1/quotes?dialect=responses", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
    const changed = await client.responses
      .create({ ...body, input: "changed" }, { headers: { "X-Gateway-Quote": quote2.quote_id } })
      .catch((error: unknown) => error);
    expect(changed).toBeInstanceOf(OpenAI.APIError);
    expect((changed as InstanceType<typeof OpenAI.APIError>).status).toBe(409);
    expect((changed as InstanceType<typeof OpenAI.APIError>).code).toBe("quote_mismatch");
  });

  it("an invalid body and previous_response_id get OpenAI's error shape with the gateway's code", async () => {
    const bad = await authed(stack, "/v1/responses", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "demo-chat", input: 42 }),
    });
    expect(bad.status).toBe(400);
    const body = await json(bad);
    expect(body.error.code).toBe("invalid_request");
    expect(typeof body.error.message).toBe("string");
    const stateful = await client.responses
      .create({ model: "demo-chat", input: "again", previous_response_id: "resp_1" })
      .catch((error: unknown) => error);
    expect((stateful as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((stateful as InstanceType<typeof OpenAI.APIError>).message).toContain(
      "previous_response_id",
    );
  });
});

describe("POST /v1/messages (Anthropic Messages API)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let client: Anthropic;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({}, { chunks: 2 }));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    // The SDK sends the key as x-api-key, as Claude Code does.
    client = new Anthropic({
      apiKey: stack.apiKey,
      baseURL: stack.gateway.url,
      defaultHeaders: { "X-Gateway-Permit": permitId },
      maxRetries: 0,
    });
  }, 90_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  async function recordOf(x: XGateway) {
    const record = await json(await authed(stack, `/v1/requests/${x.request_id}`));
    expect(record.status).toBe("completed");
    expect(record.credits_charged).toBe(x.credits_charged);
    expect(record.output_tokens).toBe(x.output_tokens);
    return record;
  }

  it("messages.create: text, stop reason, usage and x_gateway; the record agrees", async () => {
    const message = await client.messages.create({
      model: "demo-chat",
      max_tokens: 64,
      system: "be brief",
      messages: [{ role: "user", content: "hello" }],
    });
    expect(message.content.map((b) => (b.type === "text" ? b.text : b.type))).toEqual([
      "word0 word1",
    ]);
    expect(message.stop_reason).toBe("end_turn");
    expect(message.usage.output_tokens).toBe(2);
    const x = (message as unknown as { x_gateway: XGateway }).x_gateway;
    expect(x.billing).toBe("billed");
    await recordOf(x);
    const sent = fake.requests.at(-1)!.body as { messages: unknown[] };
    expect(sent.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "hello" },
    ]);
  });

  it("messages.stream: the SDK assembles the message; the last event, message_stop, carries x_gateway", async () => {
    const stream = client.messages.stream({
      model: "demo-chat",
      max_tokens: 64,
      messages: [{ role: "user", content: "hello" }],
    });
    const types: string[] = [];
    let last: unknown;
    for await (const event of stream) {
      types.push(event.type);
      last = event;
    }
    const final = await stream.finalMessage();
    expect(final.content.map((b) => (b.type === "text" ? b.text : b.type))).toEqual([
      "word0 word1",
    ]);
    expect(types[0]).toBe("message_start");
    expect(types.at(-1)).toBe("message_stop");
    const x = (last as { x_gateway: XGateway }).x_gateway;
    await recordOf(x);
  });

  it("a tool_use / tool_result round trip, streamed", async () => {
    fake.setOptions({ toolCalls: true });
    try {
      const tools = [
        {
          name: "weather",
          description: "the weather in a city",
          input_schema: {
            type: "object" as const,
            properties: { city: { type: "string" } },
            required: ["city"],
          },
        },
      ];
      const first = await client.messages
        .stream({
          model: "demo-chat",
          max_tokens: 64,
          tools,
          messages: [{ role: "user", content: "weather?" }],
        })
        .finalMessage();
      expect(first.stop_reason).toBe("tool_use");
      const use = first.content.find((block) => block.type === "tool_use");
      expect(use).toMatchObject({ type: "tool_use", name: "weather", input: { city: "Paris" } });
      const id = (use as { id: string }).id;
      const second = await client.messages.create({
        model: "demo-chat",
        max_tokens: 64,
        tools,
        messages: [
          { role: "user", content: "weather?" },
          { role: "assistant", content: [use as Anthropic.ToolUseBlockParam] },
          { role: "user", content: [{ type: "tool_result", tool_use_id: id, content: "sunny" }] },
        ],
      });
      expect(second.content.map((b) => (b.type === "text" ? b.text : b.type))).toEqual([
        "tool said sunny",
      ]);
      const sent = fake.requests.at(-1)!.body as { messages: { role: string }[] };
      expect(sent.messages.map((m) => m.role)).toEqual(["user", "assistant", "tool"]);
    } finally {
      fake.setOptions({ toolCalls: false });
    }
  });

  it("errors come in Anthropic's shape with the gateway's code: an invalid body, a missing permit", async () => {
    const bad = await client.messages
      .create({ model: "demo-chat", messages: [{ role: "user", content: "x" }] } as never)
      .catch((error: unknown) => error);
    expect(bad).toBeInstanceOf(Anthropic.BadRequestError);
    const badBody = (bad as InstanceType<typeof Anthropic.APIError>).error as {
      type: string;
      error: { type: string; code: string };
    };
    expect(badBody.type).toBe("error");
    expect(badBody.error.type).toBe("invalid_request_error");
    expect(badBody.error.code).toBe("invalid_request");
    const unpaid = await fetch(`${stack.gateway.url}/v1/messages`, {
      method: "POST",
      headers: {
        "x-api-key": stack.apiKey,
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
      },
      body: JSON.stringify({
        model: "demo-chat",
        max_tokens: 8,
        messages: [{ role: "user", content: "x" }],
      }),
    });
    expect(unpaid.status).toBe(402);
    const body = await json(unpaid);
    expect(body.type).toBe("error");
    expect(body.error.code).toBe("permit_missing");
    const keyless = await fetch(`${stack.gateway.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(keyless.status).toBe(401);
    expect((await json(keyless)).error.code).toBe("missing_api_key");
  });

  it("a quote made for a Messages request binds it; a changed request is quote_mismatch", async () => {
    const body = {
      model: "demo-chat",
      max_tokens: 32,
      messages: [{ role: "user" as const, content: "quoted" }],
    };
    const quote = async () =>
      json(
        await authed(stack, "/v1/quotes?dialect=messages", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        }),
      );
    const first = await quote();
    const same = await client.messages.create(body, {
      headers: { "X-Gateway-Quote": first.quote_id },
    });
    expect((same as unknown as { x_gateway: XGateway }).x_gateway.quote_id).toBe(first.quote_id);
    const second = await quote();
    const changed = await client.messages
      .create(
        { ...body, messages: [{ role: "user", content: "changed" }] },
        { headers: { "X-Gateway-Quote": second.quote_id } },
      )
      .catch((error: unknown) => error);
    expect((changed as InstanceType<typeof Anthropic.APIError>).status).toBe(409);
    expect(
      ((changed as InstanceType<typeof Anthropic.APIError>).error as { error: { code: string } })
        .error.code,
    ).toBe("quote_mismatch");
  });
});
