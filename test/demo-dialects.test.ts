import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startDemoProvider, type DemoProvider } from "../src/dev/demo-provider.js";
import { demoChatOffer, onboard, openPermit } from "./helpers/market.js";
import { startTestStack, type TestStack } from "./helpers/stack.js";

/**
 * `npm start`'s demo provider (a chat completion server) answers what the Responses and
 * Messages translators send it (issue 20, item 6): a plain answer, a tool call and the tool's
 * result, a JSON-schema answer, through the official SDKs as the README shows them.
 */
describe("the demo provider behind the dialect routes", () => {
  let stack: TestStack;
  let demo: DemoProvider;
  let permitId: Hex;
  let openai: OpenAI;
  let anthropic: Anthropic;

  beforeAll(async () => {
    stack = await startTestStack({ ALLOW_PRIVATE_ENDPOINTS: "true", PROBE_INTERVAL_MS: "600000" });
    demo = await startDemoProvider(["demo-chat"]);
    await onboard(stack, demoChatOffer(stack), demo.url, demo.token);
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    const headers = { "X-Gateway-Permit": permitId };
    openai = new OpenAI({
      apiKey: stack.apiKey,
      baseURL: `${stack.gateway.url}/v1`,
      defaultHeaders: headers,
      maxRetries: 0,
    });
    anthropic = new Anthropic({
      apiKey: stack.apiKey,
      baseURL: stack.gateway.url,
      defaultHeaders: headers,
      maxRetries: 0,
    });
  }, 90_000);
  afterAll(async () => {
    await demo?.close();
    await stack?.close();
  });

  it("Responses: text, a JSON-schema answer, and a function call with its result", async () => {
    const plain = await openai.responses.create({ model: "demo-chat", input: "hi there" });
    expect(plain.output_text).toBe("You said: hi there");

    const structured = await openai.responses.create({
      model: "demo-chat",
      input: "hi",
      text: { format: { type: "json_schema", name: "echo", schema: { type: "object" } } },
    });
    expect(JSON.parse(structured.output_text)).toEqual({ echo: "hi" });

    const tools = [
      { type: "function" as const, name: "shout", parameters: { type: "object" }, strict: false },
    ];
    const first = await openai.responses
      .stream({ model: "demo-chat", input: "loud", tools })
      .finalResponse();
    const call = first.output.find((item) => item.type === "function_call");
    expect(call).toMatchObject({
      name: "shout",
      arguments: JSON.stringify({ text: "You said: loud" }),
    });
    const callId = (call as { call_id: string }).call_id;
    const second = await openai.responses.create({
      model: "demo-chat",
      tools,
      input: [
        { role: "user", content: "loud" },
        { type: "function_call", call_id: callId, name: "shout", arguments: "{}" },
        { type: "function_call_output", call_id: callId, output: "LOUD" },
      ],
    });
    expect(second.output_text).toBe("The tool said: LOUD");
  });

  it("Messages: text streamed, and a tool_use with its tool_result", async () => {
    const streamed = await anthropic.messages
      .stream({
        model: "demo-chat",
        max_tokens: 32,
        messages: [{ role: "user", content: "hi there" }],
      })
      .finalMessage();
    expect(streamed.content.map((b) => (b.type === "text" ? b.text : b.type))).toEqual([
      "You said: hi there",
    ]);

    const tools = [{ name: "shout", input_schema: { type: "object" as const } }];
    const first = await anthropic.messages.create({
      model: "demo-chat",
      max_tokens: 32,
      tools,
      messages: [{ role: "user", content: "loud" }],
    });
    expect(first.stop_reason).toBe("tool_use");
    const use = first.content.find((b) => b.type === "tool_use")!;
    expect(use).toMatchObject({ name: "shout", input: { text: "You said: loud" } });
    const second = await anthropic.messages.create({
      model: "demo-chat",
      max_tokens: 32,
      tools,
      messages: [
        { role: "user", content: "loud" },
        { role: "assistant", content: [use as Anthropic.ToolUseBlockParam] },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: (use as { id: string }).id, content: "LOUD" },
          ],
        },
      ],
    });
    expect(second.content.map((b) => (b.type === "text" ? b.text : b.type))).toEqual([
      "The tool said: LOUD",
    ]);
  });
});
