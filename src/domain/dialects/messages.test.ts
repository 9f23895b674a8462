import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { httpStatusOf } from "../../connect/error-codes.js";
import type { AddressInfo } from "node:net";
import Anthropic from "@anthropic-ai/sdk";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseChatRequest } from "../chat/request/index.js";
import {
  recording,
  testEmittedConforms,
  type Emitted,
} from "../../../test/helpers/dialect-conformance.js";
import { MessagesAnswer, MessagesStreamEvent } from "../../rest/views/messages.js";
import { MessagesRequest } from "../../schema/messages.js";
import { GatewayError, type ErrorCode } from "../errors.js";
import { messagesDialect } from "./messages.js";
import { heldBy, maxPendingChars, maxToolCalls } from "./messages-stream.js";
import type { DialectEvent, GatewayCharge } from "./types.js";

const requestId = `0x${"ab".repeat(32)}`;
const charge: GatewayCharge = {
  request_id: requestId,
  quote_id: `0x${"cd".repeat(32)}`,
  offer_id: `0x${"ef".repeat(32)}`,
  tariff_version: "3",
  input_tokens: "21",
  output_tokens: "9",
  cached_input_tokens: "0",
  reasoning_tokens: "0",
  credits_charged: "123456789012345678901234567890",
  billing: "billed",
  // The provider reported no usage: the gateway's count was charged.
  usage_claimed: null,
  usage_counted: {
    input_tokens: "21",
    output_tokens: "9",
    cached_input_tokens: "0",
    reasoning_tokens: "0",
  },
  usage_source: "gateway",
};

/** Every answer and event the tests below make, checked against the schemas at the end. */
const emitted: Emitted = { requests: [], answers: [], events: [] };
const dialect = recording(messagesDialect, emitted);
const msgId = `msg_${"ab".repeat(32)}`;

function canonical(body: unknown) {
  return dialect.toCanonical(body);
}

function refusal(body: unknown): GatewayError {
  try {
    canonical(body);
  } catch (error) {
    if (error instanceof GatewayError) return error;
    throw error;
  }
  throw new Error("accepted");
}

/** The canonical request must itself be a valid chat request. */
function assertValidChat(chat: Record<string, unknown>): void {
  expect(() =>
    parseChatRequest(Buffer.from(JSON.stringify(chat)), { maxBytes: 1 << 20 }),
  ).not.toThrow();
}

const base = { model: "m", max_tokens: 100, messages: [{ role: "user", content: "Hi" }] };

describe("toCanonical", () => {
  const cases: { name: string; body: unknown; chat: Record<string, unknown>; stream?: boolean }[] =
    [
      {
        name: "minimal",
        body: base,
        chat: { model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 100 },
      },
      {
        name: "system string, sampling, stop, metadata; top_k, service_tier dropped",
        body: {
          ...base,
          system: "Be brief.",
          temperature: 0.5,
          top_p: 0.9,
          top_k: 40,
          stop_sequences: ["END", "\n\n"],
          metadata: { user_id: "u-1" },
          service_tier: "auto",
          thinking: { type: "disabled" },
        },
        chat: {
          model: "m",
          messages: [
            { role: "system", content: "Be brief." },
            { role: "user", content: "Hi" },
          ],
          max_tokens: 100,
          stop: ["END", "\n\n"],
          temperature: 0.5,
          top_p: 0.9,
          user: "u-1",
        },
      },
      {
        name: "system blocks, stream",
        body: {
          ...base,
          stream: true,
          system: [
            { type: "text", text: "One.", cache_control: { type: "ephemeral" } },
            { type: "text", text: "Two." },
          ],
        },
        chat: {
          model: "m",
          messages: [
            { role: "system", content: "One.\nTwo." },
            { role: "user", content: "Hi" },
          ],
          max_tokens: 100,
          stream: true,
          stream_options: { include_usage: true },
        },
        stream: true,
      },
      {
        name: "tool_use / tool_result round trip",
        body: {
          model: "m",
          max_tokens: 50,
          tools: [
            {
              name: "get_weather",
              description: "Weather of a city",
              input_schema: { type: "object", properties: { city: { type: "string" } } },
            },
            { name: "get_time", input_schema: { type: "object" }, strict: true },
          ],
          tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
          messages: [
            { role: "user", content: [{ type: "text", text: "Weather and time in Paris?" }] },
            {
              role: "assistant",
              content: [
                { type: "text", text: "Let me check." },
                { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
                { type: "tool_use", id: "toolu_2", name: "get_time", input: {} },
              ],
            },
            {
              role: "user",
              content: [
                { type: "text", text: "Thanks, and be quick." },
                { type: "tool_result", tool_use_id: "toolu_2", content: "12:00" },
                {
                  type: "tool_result",
                  tool_use_id: "toolu_1",
                  content: [
                    { type: "text", text: "Sunny" },
                    { type: "text", text: "21 C" },
                  ],
                },
              ],
            },
            {
              role: "assistant",
              content: [{ type: "tool_use", id: "toolu_3", name: "get_time", input: { tz: "x" } }],
            },
            {
              role: "user",
              content: [
                { type: "tool_result", tool_use_id: "toolu_3", content: "bad tz", is_error: true },
              ],
            },
          ],
        },
        chat: {
          model: "m",
          messages: [
            { role: "user", content: "Weather and time in Paris?" },
            {
              role: "assistant",
              content: "Let me check.",
              tool_calls: [
                {
                  id: "toolu_1",
                  type: "function",
                  function: { name: "get_weather", arguments: '{"city":"Paris"}' },
                },
                {
                  id: "toolu_2",
                  type: "function",
                  function: { name: "get_time", arguments: "{}" },
                },
              ],
            },
            { role: "tool", tool_call_id: "toolu_2", content: "12:00" },
            { role: "tool", tool_call_id: "toolu_1", content: "Sunny\n21 C" },
            { role: "user", content: "Thanks, and be quick." },
            {
              role: "assistant",
              content: null,
              tool_calls: [
                {
                  id: "toolu_3",
                  type: "function",
                  function: { name: "get_time", arguments: '{"tz":"x"}' },
                },
              ],
            },
            { role: "tool", tool_call_id: "toolu_3", content: "Error: bad tz" },
          ],
          max_tokens: 50,
          tools: [
            {
              type: "function",
              function: {
                name: "get_weather",
                description: "Weather of a city",
                parameters: { type: "object", properties: { city: { type: "string" } } },
              },
            },
            {
              type: "function",
              function: { name: "get_time", parameters: { type: "object" }, strict: true },
            },
          ],
          tool_choice: { type: "function", function: { name: "get_weather" } },
          parallel_tool_calls: false,
        },
      },
      {
        name: "tool_choice any / auto / none",
        body: {
          ...base,
          tools: [{ name: "t", input_schema: { type: "object" } }],
          tool_choice: { type: "any" },
        },
        chat: {
          ...base,
          tools: [{ type: "function", function: { name: "t", parameters: { type: "object" } } }],
          tool_choice: "required",
        },
      },
      {
        name: "tool_choice none without tools is dropped",
        body: { ...base, tool_choice: { type: "none" } },
        chat: base,
      },
      {
        name: "images (base64 and url) with text",
        body: {
          ...base,
          messages: [
            {
              role: "user",
              content: [
                {
                  type: "image",
                  source: { type: "base64", media_type: "image/png", data: "iVBO" },
                },
                { type: "image", source: { type: "url", url: "https://x.test/a.jpg" } },
                { type: "text", text: "What is this?" },
              ],
            },
          ],
        },
        chat: {
          ...base,
          messages: [
            {
              role: "user",
              content: [
                { type: "image_url", image_url: { url: "data:image/png;base64,iVBO" } },
                { type: "image_url", image_url: { url: "https://x.test/a.jpg" } },
                { type: "text", text: "What is this?" },
              ],
            },
          ],
        },
      },
      {
        name: "gateway fields pass through; assistant prefill stays last",
        body: {
          ...base,
          offer: `0x${"11".repeat(32)}`,
          provider: { sort: "price" },
          messages: [...base.messages, { role: "assistant", content: "Sure:" }],
        },
        chat: {
          ...base,
          messages: [...base.messages, { role: "assistant", content: "Sure:" }],
          offer: `0x${"11".repeat(32)}`,
          provider: { sort: "price" },
        },
      },
    ];
  it.each(cases)("$name", ({ body, chat, stream }) => {
    const out = canonical(body);
    expect(out.chat).toEqual(chat);
    expect(out.stream).toBe(stream ?? false);
    assertValidChat(out.chat);
  });

  const tool = { name: "t", input_schema: { type: "object" } };
  const afterToolUse = (user: unknown) => ({
    ...base,
    messages: [
      { role: "user", content: "x" },
      { role: "assistant", content: [{ type: "tool_use", id: "a", name: "t", input: {} }] },
      ...(user === undefined ? [] : [user]),
    ],
  });
  const refusals: [string, unknown, RegExp][] = [
    ["not an object", [], /the request body must be an object/],
    ["model missing", { messages: base.messages, max_tokens: 1 }, /'model' is required/],
    ["model empty", { ...base, model: "" }, /'model' must be a non-empty string/],
    ["max_tokens missing", { model: "m", messages: base.messages }, /'max_tokens' is required/],
    ["max_tokens zero", { ...base, max_tokens: 0 }, /'max_tokens' must be an integer/],
    ["max_tokens fraction", { ...base, max_tokens: 1.5 }, /'max_tokens' must be an integer/],
    ["messages empty", { ...base, messages: [] }, /'messages' must be a non-empty array/],
    ["unknown field", { ...base, output_config: {} }, /'output_config' is not supported/],
    ["mcp_servers", { ...base, mcp_servers: [] }, /'mcp_servers' is not supported/],
    [
      "thinking enabled",
      { ...base, thinking: { type: "enabled", budget_tokens: 1024 } },
      /'thinking\.type' must be "disabled": this gateway's providers answer without thinking blocks/,
    ],
    ["thinking malformed", { ...base, thinking: true }, /'thinking' must be an object/],
    [
      "temperature above 1",
      { ...base, temperature: 1.5 },
      /'temperature' must be a number from 0 to 1/,
    ],
    ["top_p string", { ...base, top_p: "1" }, /'top_p' must be a number/],
    ["top_k negative", { ...base, top_k: -1 }, /'top_k' must be a non-negative integer/],
    [
      "stop_sequences string",
      { ...base, stop_sequences: "x" },
      /'stop_sequences' must be an array/,
    ],
    [
      "stop_sequences beyond the bound",
      { ...base, stop_sequences: ["a", "b", "c", "d", "e"] },
      /'stop_sequences' must be an array of at most 4 items/,
    ],
    [
      "stop_sequences too long",
      { ...base, stop_sequences: ["x".repeat(65)] },
      /'stop_sequences\[0\]' must be a string of at most 64 characters/,
    ],
    ["stream string", { ...base, stream: "yes" }, /'stream' must be a boolean/],
    ["metadata.user_id number", { ...base, metadata: { user_id: 1 } }, /'metadata.user_id'/],
    [
      "system role message",
      { ...base, messages: [{ role: "system", content: "x" }] },
      /put system text in 'system'/,
    ],
    ["bad role", { ...base, messages: [{ role: "tool", content: "x" }] }, /'messages\[0\]\.role'/],
    ["content missing", { ...base, messages: [{ role: "user" }] }, /'messages\[0\]\.content'/],
    [
      "system block not text",
      { ...base, system: [{ type: "image" }] },
      /'system\[0\]\.type' must be "text"/,
    ],
    [
      "document block",
      { ...base, messages: [{ role: "user", content: [{ type: "document", source: {} }] }] },
      /'messages\[0\]\.content\[0\]\.type' must be one of text, image, tool_result/,
    ],
    [
      "thinking block",
      {
        ...base,
        messages: [
          { role: "user", content: "x" },
          { role: "assistant", content: [{ type: "thinking", thinking: "", signature: "" }] },
        ],
      },
      /thinking blocks are not supported/,
    ],
    [
      "image file source",
      {
        ...base,
        messages: [
          { role: "user", content: [{ type: "image", source: { type: "file", file_id: "f" } }] },
        ],
      },
      /'messages\[0\]\.content\[0\]\.source\.type' must be one of base64, url/,
    ],
    [
      "image bad media type",
      {
        ...base,
        messages: [
          {
            role: "user",
            content: [
              { type: "image", source: { type: "base64", media_type: "text/html", data: "" } },
            ],
          },
        ],
      },
      /media_type/,
    ],
    [
      "tool_use input not object",
      {
        ...base,
        messages: [
          { role: "user", content: "x" },
          { role: "assistant", content: [{ type: "tool_use", id: "a", name: "t", input: "{}" }] },
        ],
      },
      /'messages\[1\]\.content\[0\]\.input' must be an object/,
    ],
    [
      "tool_use without result (end)",
      afterToolUse(undefined),
      /tool_use 'a' in 'messages\[1\]' has no tool_result/,
    ],
    [
      "tool_use answered by plain text",
      afterToolUse({ role: "user", content: "hm" }),
      /tool_use 'a' in 'messages\[1\]' has no tool_result/,
    ],
    [
      "tool_result for an unknown id",
      afterToolUse({
        role: "user",
        content: [{ type: "tool_result", tool_use_id: "b", content: "x" }],
      }),
      /tool_result 'b' answers no tool_use/,
    ],
    [
      "tool_result twice",
      afterToolUse({
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "a" },
          { type: "tool_result", tool_use_id: "a" },
        ],
      }),
      /tool_result 'a' answers no tool_use/,
    ],
    [
      "tool_result without a call",
      {
        ...base,
        messages: [
          { role: "user", content: [{ type: "tool_result", tool_use_id: "a", content: "x" }] },
        ],
      },
      /answers no tool_use/,
    ],
    [
      "tool_result with an image",
      afterToolUse({
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "a", content: [{ type: "image", source: {} }] },
        ],
      }),
      /'messages\[2\]\.content\[0\]\.content\[0\]\.type' must be "text"/,
    ],
    [
      "tool_result is_error string",
      afterToolUse({
        role: "user",
        content: [{ type: "tool_result", tool_use_id: "a", is_error: "yes" }],
      }),
      /'messages\[2\]\.content\[0\]\.is_error' must be a boolean/,
    ],
    [
      "server tool",
      { ...base, tools: [{ type: "web_search_20250305", name: "web_search" }] },
      /'tools\[0\]\.type' must be "custom" or left out: this gateway runs no server tools/,
    ],
    ["tool without schema", { ...base, tools: [{ name: "t" }] }, /'tools\[0\]\.input_schema'/],
    ["tool defined twice", { ...base, tools: [tool, tool] }, /defined twice/],
    [
      "tool_choice unknown tool",
      { ...base, tools: [tool], tool_choice: { type: "tool", name: "u" } },
      /no tool named 'u'/,
    ],
    ["tool_choice any without tools", { ...base, tool_choice: { type: "any" } }, /needs 'tools'/],
    [
      "tool_choice bad type",
      { ...base, tools: [tool], tool_choice: { type: "some" } },
      /'tool_choice\.type' must be one of/,
    ],
    [
      "tool_choice string",
      { ...base, tools: [tool], tool_choice: "auto" },
      /'tool_choice' must be an object/,
    ],
  ];
  it.each(refusals)("refuses: %s", (_name, body, message) => {
    const error = refusal(body);
    expect(error.code).toBe("invalid_request");
    expect(error.message).toMatch(message);
  });
});

describe("toCanonical: the schema's rules (MessagesRequest), each naming the field", () => {
  const user = (content: unknown) => ({ ...base, messages: [{ role: "user", content }] });
  const assistant = (content: unknown) => ({
    ...base,
    messages: [
      { role: "user", content: "x" },
      { role: "assistant", content },
    ],
  });
  const image = (source: unknown) => user([{ type: "image", source }]);
  const tool = { name: "t", input_schema: { type: "object" } };
  const cases: [string, unknown, string, string?][] = [
    ["a message not an object", { ...base, messages: [5] }, "'messages[0]' must be an object"],
    [
      "a message without role",
      { ...base, messages: [{ content: "x" }] },
      "'messages[0].role' is required",
    ],
    [
      "user content empty",
      user([]),
      "'messages[0].content' must be a string or a non-empty array of content blocks",
    ],
    ["a block not an object", user(["x"]), "'messages[0].content[0]' must be an object"],
    [
      "a text block without text",
      user([{ type: "text" }]),
      "'messages[0].content[0].text' is required",
    ],
    [
      "a tool_use block in a user message",
      user([{ type: "tool_use", id: "a", name: "t", input: {} }]),
      "'messages[0].content[0].type' must be one of text, image, tool_result",
    ],
    [
      "a tool_result block in an assistant message",
      assistant([{ type: "tool_result", tool_use_id: "a" }]),
      "'messages[1].content[0].type' must be one of text, tool_use",
    ],
    [
      "base64 data that is not base64",
      image({ type: "base64", media_type: "image/png", data: "a b" }),
      "'messages[0].content[0].source.data' must be a base64 string",
    ],
    [
      "an image URL that is not http(s)",
      image({ type: "url", url: "ftp://x.test/a.png" }),
      "'messages[0].content[0].source.url' must be a string starting with http:// or https://",
    ],
    [
      "a tool_use with an empty id",
      assistant([{ type: "tool_use", id: "", name: "t", input: {} }]),
      "'messages[1].content[0].id' must be a non-empty string",
    ],
    [
      "a tool_use id used twice",
      assistant([
        { type: "tool_use", id: "a", name: "t", input: {} },
        { type: "tool_use", id: "a", name: "t", input: {} },
      ]),
      "'messages[1].content[1].id': tool_use id 'a' is used twice",
    ],
    [
      "a tool_result without tool_use_id",
      user([{ type: "tool_result" }]),
      "'messages[0].content[0].tool_use_id' is required",
    ],
    [
      "a tool_result's content a number",
      user([{ type: "tool_result", tool_use_id: "a", content: 5 }]),
      "'messages[0].content[0].content' must be a string or an array of text blocks",
    ],
    [
      "system a number",
      { ...base, system: 5 },
      "'system' must be a string or an array of text blocks",
    ],
    [
      "a tool without name",
      { ...base, tools: [{ input_schema: {} }] },
      "'tools[0].name' is required",
    ],
    [
      "a tool with an empty name",
      { ...base, tools: [{ ...tool, name: "" }] },
      "'tools[0].name' must be a non-empty string",
    ],
    [
      "input_schema an array",
      { ...base, tools: [{ ...tool, input_schema: [] }] },
      "'tools[0].input_schema' must be a JSON schema object",
    ],
    ["a tool not an object", { ...base, tools: ["t"] }, "'tools[0]' must be an object (a tool)"],
    [
      "tool_choice tool without name",
      { ...base, tools: [tool], tool_choice: { type: "tool" } },
      "'tool_choice.name' is required",
    ],
    [
      "disable_parallel_tool_use not a boolean",
      { ...base, tools: [tool], tool_choice: { type: "auto", disable_parallel_tool_use: "yes" } },
      "'tool_choice.disable_parallel_tool_use' must be a boolean",
    ],
    ["thinking without type", { ...base, thinking: {} }, "'thinking.type' is required"],
    ["metadata not an object", { ...base, metadata: [] }, "'metadata' must be an object"],
    ["service_tier not a string", { ...base, service_tier: 5 }, "'service_tier' must be a string"],
    ["top_k a fraction", { ...base, top_k: 1.5 }, "'top_k' must be a non-negative integer"],
    [
      "max_tokens beyond exact integers",
      { ...base, max_tokens: 2 ** 53 },
      "'max_tokens' must be an integer from 1 to 9007199254740991",
    ],
    [
      "an unknown member",
      { ...base, container: "c" },
      "'container' is not supported by this gateway's Messages API; leave it out",
    ],
    [
      "an offer that is not Hex32",
      { ...base, offer: "0x12" },
      "'offer' must be a Hex32 string (0x followed by 64 hex digits)",
      "invalid_hex",
    ],
  ];
  it.each(cases)("%s", (_name, body, message, code = "invalid_request") => {
    const error = refusal(body);
    expect(error.code).toBe(code);
    expect(error.message).toBe(message);
  });

  it("an unknown member that is null, a typeless or null-typed or custom tool, null members: accepted", () => {
    const tools = [
      tool,
      { ...tool, name: "u", type: null },
      { ...tool, name: "v", type: "custom" },
    ];
    const out = canonical({
      ...base,
      container: null,
      tools,
      system: null,
      metadata: { user_id: null },
      stream: null,
    });
    expect(out.chat).toEqual({
      ...base,
      tools: ["t", "u", "v"].map((name) => ({
        type: "function",
        function: { name, parameters: { type: "object" } },
      })),
    });
  });
});

// ---------------------------------------------------------------- answers

function completion(message: Record<string, unknown>, finish: string, extra: object = {}) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion",
    created: 1,
    model: "provider-model",
    choices: [
      { index: 0, message: { role: "assistant", ...message }, finish_reason: finish, ...extra },
    ],
    usage: { prompt_tokens: 21, completion_tokens: 9, total_tokens: 30 },
  };
}

const toolCall = (id: string, name: string, args: string) => ({
  id,
  type: "function",
  function: { name, arguments: args },
});

it("the usage shown is what was charged, never the provider's claim (its details neither)", () => {
  const answer = dialect.fromCompletion(completion({ content: "x" }, "stop", {}), charge) as {
    usage: unknown;
  };
  expect(answer.usage).toEqual({
    input_tokens: 21,
    output_tokens: 9,
    cache_read_input_tokens: 0,
    cache_creation_input_tokens: 0,
  });
  const hostile = {
    ...completion({ content: "x" }, "stop"),
    usage: {
      prompt_tokens: 21,
      completion_tokens: 9,
      prompt_tokens_details: { cached_tokens: 22 },
      completion_tokens_details: { reasoning_tokens: 10 },
    },
  };
  expect((dialect.fromCompletion(hostile, charge) as { usage: unknown }).usage).toEqual({
    input_tokens: 21,
    output_tokens: 9,
    cache_read_input_tokens: 0,
    cache_creation_input_tokens: 0,
  });
  // The charge's details: cached input apart from the rest, thinking tokens when any.
  const detailed = { ...charge, cached_input_tokens: "16", reasoning_tokens: "4" };
  expect((dialect.fromCompletion(hostile, detailed) as { usage: unknown }).usage).toEqual({
    input_tokens: 5,
    output_tokens: 9,
    cache_read_input_tokens: 16,
    cache_creation_input_tokens: 0,
    output_tokens_details: { thinking_tokens: 4 },
  });
});

describe("fromCompletion", () => {
  const usage = {
    input_tokens: 21,
    output_tokens: 9,
    cache_read_input_tokens: 0,
    cache_creation_input_tokens: 0,
  };
  const cases: { name: string; completion: unknown; expected: Record<string, unknown> }[] = [
    {
      name: "text, end_turn",
      completion: completion({ content: "Hello!" }, "stop"),
      expected: { content: [{ type: "text", text: "Hello!" }], stop_reason: "end_turn" },
    },
    {
      name: "length -> max_tokens",
      completion: completion({ content: "Hel" }, "length"),
      expected: { content: [{ type: "text", text: "Hel" }], stop_reason: "max_tokens" },
    },
    {
      name: "text and two tool calls",
      completion: completion(
        {
          content: "Checking.",
          tool_calls: [
            toolCall("call_1", "get_weather", '{"city":"Paris"}'),
            toolCall("", "get_time", ""),
          ],
        },
        "tool_calls",
      ),
      expected: {
        content: [
          { type: "text", text: "Checking." },
          { type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Paris" } },
          { type: "tool_use", id: `toolu_${"ab".repeat(12)}_1`, name: "get_time", input: {} },
        ],
        stop_reason: "tool_use",
      },
    },
    {
      name: "tool calls reported as stop",
      completion: completion({ content: null, tool_calls: [toolCall("c", "t", "{}")] }, "stop"),
      expected: {
        content: [{ type: "tool_use", id: "c", name: "t", input: {} }],
        stop_reason: "tool_use",
      },
    },
    {
      name: "stop string named by the provider",
      completion: completion({ content: "1, 2" }, "stop", { stop_reason: ", 3" }),
      expected: {
        content: [{ type: "text", text: "1, 2" }],
        stop_reason: "stop_sequence",
        stop_sequence: ", 3",
      },
    },
    {
      name: "content filter -> refusal, empty content",
      completion: completion({ content: "" }, "content_filter"),
      expected: { content: [], stop_reason: "refusal" },
    },
    {
      name: "cached tokens claimed: not shown (the charge is)",
      completion: {
        ...completion({ content: "ok" }, "stop"),
        usage: {
          prompt_tokens: 21,
          completion_tokens: 9,
          prompt_tokens_details: { cached_tokens: 16 },
        },
      },
      expected: {
        content: [{ type: "text", text: "ok" }],
        stop_reason: "end_turn",
      },
    },
    {
      name: "reasoning tokens claimed: not shown (the charge is)",
      completion: {
        ...completion({ content: "ok" }, "stop"),
        usage: {
          prompt_tokens: 21,
          completion_tokens: 9,
          completion_tokens_details: { reasoning_tokens: 4 },
        },
      },
      expected: {
        content: [{ type: "text", text: "ok" }],
        stop_reason: "end_turn",
      },
    },
    {
      name: "no usage: the charge's counts",
      completion: { ...completion({ content: "ok" }, "stop"), usage: undefined },
      expected: { content: [{ type: "text", text: "ok" }], stop_reason: "end_turn" },
    },
  ];
  it.each(cases)("$name", ({ completion: c, expected }) => {
    expect(dialect.fromCompletion(c, charge)).toEqual({
      id: msgId,
      type: "message",
      role: "assistant",
      model: "provider-model",
      stop_sequence: null,
      usage,
      x_gateway: charge,
      ...expected,
    });
  });
});

// ---------------------------------------------------------------- streams

function chunk(delta: Record<string, unknown>, finish: string | null = null, extra: object = {}) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1,
    model: "provider-model",
    choices: [{ index: 0, delta, finish_reason: finish, ...extra }],
  };
}
const usageChunk = (usage: Record<string, unknown>) => ({
  id: "chatcmpl-1",
  object: "chat.completion.chunk",
  created: 1,
  model: "provider-model",
  choices: [],
  usage,
});

function translate(chunks: unknown[], finishWith: GatewayCharge = charge): DialectEvent[] {
  const stream = dialect.createStream({ requestId, model: "asked-model" });
  return [...chunks.flatMap((c) => stream.chunk(c)), ...stream.finish(finishWith)];
}

const textChunks = [
  chunk({ role: "assistant", content: "" }),
  chunk({ content: "Hello" }),
  chunk({ content: ", world" }),
  chunk({}, "stop"),
  usageChunk({ prompt_tokens: 21, completion_tokens: 9, total_tokens: 30 }),
];

const toolChunks = [
  chunk({ role: "assistant", content: "Let me look." }),
  chunk({
    tool_calls: [
      {
        index: 0,
        id: "call_a",
        type: "function",
        function: { name: "get_weather", arguments: "" },
      },
    ],
  }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: '{"ci' } }] }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: 'ty":"Paris"}' } }] }),
  chunk({
    tool_calls: [
      {
        index: 1,
        id: "call_b",
        type: "function",
        function: { name: "get_time", arguments: '{"tz":' },
      },
    ],
  }),
  chunk({ tool_calls: [{ index: 1, function: { arguments: '"UTC"}' } }] }),
  chunk({}, "tool_calls"),
  usageChunk({
    prompt_tokens: 30,
    completion_tokens: 12,
    prompt_tokens_details: { cached_tokens: 10 },
  }),
];

const ev = <T extends { type: string }>(data: T) => ({ event: data.type, data });

describe("stream", () => {
  const start = ev({
    type: "message_start",
    message: {
      id: msgId,
      type: "message",
      role: "assistant",
      model: "provider-model",
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: {
        input_tokens: 0,
        output_tokens: 0,
        cache_read_input_tokens: 0,
        cache_creation_input_tokens: 0,
      },
    },
  });

  it("text", () => {
    expect(translate(textChunks)).toEqual([
      start,
      ev({ type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }),
      ev({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "Hello" } }),
      ev({ type: "content_block_delta", index: 0, delta: { type: "text_delta", text: ", world" } }),
      ev({ type: "content_block_stop", index: 0 }),
      ev({
        type: "message_delta",
        delta: { stop_reason: "end_turn", stop_sequence: null },
        usage: {
          input_tokens: 21,
          output_tokens: 9,
          cache_read_input_tokens: 0,
          cache_creation_input_tokens: 0,
        },
      }),
      ev({ type: "message_stop", x_gateway: charge }),
    ]);
  });

  it("text then two tool calls, arguments split over chunks", () => {
    const events = translate(toolChunks);
    expect(events.map((e) => e.event)).toEqual([
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(events[4]?.data).toEqual({
      type: "content_block_start",
      index: 1,
      content_block: { type: "tool_use", id: "call_a", name: "get_weather", input: {} },
    });
    expect(events[6]?.data).toEqual({
      type: "content_block_delta",
      index: 1,
      delta: { type: "input_json_delta", partial_json: 'ty":"Paris"}' },
    });
    expect(events[8]?.data).toEqual({
      type: "content_block_start",
      index: 2,
      content_block: { type: "tool_use", id: "call_b", name: "get_time", input: {} },
    });
    expect(events[12]?.data).toEqual({
      type: "message_delta",
      delta: { stop_reason: "tool_use", stop_sequence: null },
      // The charge, whatever the chunks claimed (20 in, 12 out, 10 cached).
      usage: {
        input_tokens: 21,
        output_tokens: 9,
        cache_read_input_tokens: 0,
        cache_creation_input_tokens: 0,
      },
    });
  });

  it("length -> max_tokens; the usage is the charge, with or without a claim on the finishing chunk", () => {
    const withUsage = translate([
      chunk({ content: "Hel" }),
      { ...chunk({}, "length"), usage: { prompt_tokens: 3, completion_tokens: 1 } },
    ]);
    expect(withUsage.at(-2)?.data).toEqual({
      type: "message_delta",
      delta: { stop_reason: "max_tokens", stop_sequence: null },
      usage: {
        input_tokens: 21,
        output_tokens: 9,
        cache_read_input_tokens: 0,
        cache_creation_input_tokens: 0,
      },
    });
    const noUsage = translate([chunk({ content: "Hel" }), chunk({}, "length")]);
    expect(noUsage.at(-2)?.data).toMatchObject({ usage: { input_tokens: 21, output_tokens: 9 } });
  });

  it("a name that comes after its arguments; an empty answer; nothing after finish", () => {
    const stream = dialect.createStream({ requestId, model: "asked-model" });
    const events = [
      ...stream.chunk(chunk({ tool_calls: [{ index: 0, function: { arguments: '{"a":1}' } }] })),
      ...stream.chunk(chunk({ tool_calls: [{ index: 0, id: "c", function: { name: "t" } }] })),
      ...stream.finish(charge),
    ];
    expect(events.slice(1, 4).map((e) => e.data)).toEqual([
      {
        type: "content_block_start",
        index: 0,
        content_block: { type: "tool_use", id: "c", name: "t", input: {} },
      },
      {
        type: "content_block_delta",
        index: 0,
        delta: { type: "input_json_delta", partial_json: '{"a":1}' },
      },
      { type: "content_block_stop", index: 0 },
    ]);
    expect(stream.chunk(chunk({ content: "late" }))).toEqual([]);
    expect(stream.finish(charge)).toEqual([]);

    const empty = dialect.createStream({ requestId, model: "asked-model" }).finish(charge);
    expect(empty.map((e) => e.event)).toEqual(["message_start", "message_delta", "message_stop"]);
    expect(empty[0]?.data).toMatchObject({ message: { model: "asked-model" } });
  });

  it("fail: an Anthropic error event with the gateway's code", () => {
    const stream = dialect.createStream({ requestId, model: "m" });
    stream.chunk(chunk({ content: "Hi" }));
    expect(stream.fail(new GatewayError("upstream_error", "the provider failed"))).toEqual([
      {
        event: "error",
        data: {
          type: "error",
          error: {
            type: "api_error",
            message: "the provider failed",
            code: "upstream_error",
            details: { error_code: "upstream_error" },
          },
        },
      },
    ]);
    expect(stream.finish(charge)).toEqual([]);
  });
});

describe("stream: what it holds", () => {
  // 10,000 deltas of 5,000 units: 50 million.
  const count = 10_000;
  const size = 5_000;

  type Stream = ReturnType<typeof messagesDialect.createStream>;

  /** Feeds `chunks` to `stream`; the most it held after any chunk, and its events. */
  function feed(stream: Stream, chunks: Iterable<unknown>) {
    const events: DialectEvent[] = [];
    let chars = 0;
    let toolCalls = 0;
    for (const c of chunks) {
      for (const e of stream.chunk(c)) events.push(e);
      const held = heldBy(stream);
      chars = Math.max(chars, held.chars);
      toolCalls = Math.max(toolCalls, held.toolCalls);
    }
    return { events, most: { chars, toolCalls } };
  }

  type Delta = { type: string; text?: string; partial_json?: string };
  const deltasOf = (events: readonly DialectEvent[]) =>
    events.flatMap((e) =>
      e.event === "content_block_delta" ? [e.data as { index: number; delta: Delta }] : [],
    );

  it("50 MB of text: nothing of it held, every delta relayed as it came", () => {
    const stream = messagesDialect.createStream({ requestId, model: "m" });
    function* chunks(): Generator<unknown> {
      for (let i = 0; i < count; i += 1) yield chunk({ content: String(i % 10).repeat(size) });
      yield chunk({}, "stop");
    }
    const { events, most } = feed(stream, chunks());
    expect(most).toEqual({ chars: 0, toolCalls: 0 });
    const deltas = deltasOf(events);
    expect(deltas.length).toBe(count);
    expect(deltas.every((d, i) => d.delta.text === String(i % 10).repeat(size))).toBe(true);
    const closing = stream.finish(charge);
    expect(closing.map((e) => e.event)).toEqual([
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(closing[1]?.data).toMatchObject({ delta: { stop_reason: "end_turn" } });
  });

  it("50 MB of tool-call arguments: none held once the call's block started", () => {
    const stream = messagesDialect.createStream({ requestId, model: "m" });
    function* chunks(): Generator<unknown> {
      yield chunk({ tool_calls: [{ index: 0, id: "c", function: { name: "t", arguments: "" } }] });
      for (let i = 0; i < count; i += 1) {
        yield chunk({ tool_calls: [{ index: 0, function: { arguments: "7".repeat(size) } }] });
      }
    }
    const { events, most } = feed(stream, chunks());
    expect(most).toEqual({ chars: 0, toolCalls: 1 });
    const deltas = deltasOf(events);
    expect(deltas.length).toBe(count);
    expect(deltas.every((d) => d.index === 0 && d.delta.partial_json?.length === size)).toBe(true);
  });

  it("arguments before the name: held up to their bound, then the block starts without a name", () => {
    const stream = messagesDialect.createStream({ requestId, model: "m" });
    const piece = "1".repeat(10_000);
    function* chunks(): Generator<unknown> {
      for (let i = 0; i < count; i += 1) {
        yield chunk({ tool_calls: [{ index: 0, id: "c", function: { arguments: piece } }] });
      }
      yield chunk({ tool_calls: [{ index: 0, function: { name: "late" } }] });
    }
    const { events, most } = feed(stream, chunks());
    // The call's id and the pieces within the bound; the one that passes it starts the block.
    const within = Math.floor(maxPendingChars / piece.length);
    expect(most).toEqual({ chars: 1 + within * piece.length, toolCalls: 1 });
    expect(heldBy(stream)).toEqual({ chars: 0, toolCalls: 1 });
    expect(events[1]?.data).toEqual({
      type: "content_block_start",
      index: 0,
      content_block: { type: "tool_use", id: "c", name: "", input: {} },
    });
    const deltas = deltasOf(events);
    expect(deltas[0]?.delta.partial_json).toBe(piece.repeat(within + 1));
    expect(deltas.length).toBe(count - within);
    expect(deltas.map((d) => d.delta.partial_json).join("").length).toBe(count * 10_000);
  });

  it("calls waiting for their names: held together within the bound, the one that passes it starts", () => {
    const stream = messagesDialect.createStream({ requestId, model: "m" });
    const piece = "2".repeat(10_000);
    const waiting = Array.from({ length: 20 }, (_, i) =>
      chunk({ tool_calls: [{ index: i, id: `c${i}`, function: { arguments: piece } }] }),
    );
    const { events, most } = feed(stream, [
      ...waiting,
      chunk({ tool_calls: [{ index: 0, function: { name: "t" } }] }),
    ]);
    // The first calls wait (10,002 units each, with their ids) while they fit in the bound
    // together (6 of them); each later one passes it and starts.
    const within = Math.floor(maxPendingChars / 10_002);
    expect(most).toEqual({ chars: within * 10_002, toolCalls: 20 });
    const started = () =>
      events.flatMap((e) =>
        e.event === "content_block_start"
          ? [(e.data as { content_block: { id: string; name: string } }).content_block]
          : [],
      );
    expect(started().map((b) => [b.id, b.name])).toEqual([
      ...Array.from({ length: 20 - within }, (_, i) => [`c${i + within}`, ""]),
      ["c0", "t"],
    ]);
    expect(heldBy(stream)).toEqual({ chars: (within - 1) * 10_002, toolCalls: 20 });
    events.push(...stream.finish(charge));
    expect(started().length).toBe(20);
    expect(heldBy(stream)).toEqual({ chars: 0, toolCalls: 20 });
  });
});

describe("errorBody", () => {
  const cases: [ErrorCode, string][] = [
    ["invalid_request", "invalid_request_error"],
    ["invalid_api_key", "authentication_error"],
    ["insufficient_credits", "billing_error"],
    ["permit_not_authorized", "permission_error"],
    ["model_not_found", "not_found_error"],
    ["quote_expired", "conflict_error"],
    ["request_too_large", "request_too_large"],
    ["idempotency_key_reused", "invalid_request_error"],
    ["rate_limited", "rate_limit_error"],
    ["internal_error", "api_error"],
    ["upstream_error", "api_error"],
    ["no_eligible_offer", "overloaded_error"],
  ];
  it.each(cases)("%s -> %s", (code, type) => {
    expect(messagesDialect.errorBody(new GatewayError(code, "why"))).toEqual({
      type: "error",
      error: { type, message: "why", code, details: { error_code: code } },
    });
  });
});

// ---------------------------------------------------------------- the official SDK

/** What the fixture server answers next: a status and JSON, or SSE events. */
type Answer = { status: number; json: unknown } | { events: DialectEvent[] };

describe("with the official @anthropic-ai/sdk", () => {
  let server: Server;
  let client: Anthropic;
  let answer: Answer;
  let received: unknown;

  beforeAll(async () => {
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const parts: Buffer[] = [];
      req.on("data", (part: Buffer) => parts.push(part));
      req.on("end", () => {
        received = JSON.parse(Buffer.concat(parts).toString("utf8"));
        if ("json" in answer) {
          res.writeHead(answer.status, { "content-type": "application/json" });
          res.end(JSON.stringify(answer.json));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        for (const e of answer.events) {
          res.write(`event: ${e.event ?? ""}\ndata: ${JSON.stringify(e.data)}\n\n`);
        }
        res.end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: "x", maxRetries: 0 });
  });
  afterAll(async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  const tools = [
    {
      name: "get_weather",
      input_schema: { type: "object" as const, properties: { city: { type: "string" } } },
    },
    { name: "get_time", input_schema: { type: "object" as const } },
  ];

  it("messages.create: the SDK's request translates; the JSON answer parses", async () => {
    answer = {
      status: 200,
      json: dialect.fromCompletion(
        completion(
          {
            content: "Checking.",
            tool_calls: [toolCall("call_1", "get_weather", '{"city":"Paris"}')],
          },
          "tool_calls",
        ),
        charge,
      ),
    };
    const message = await client.messages.create({
      model: "m",
      max_tokens: 64,
      system: "Be brief.",
      tools,
      messages: [{ role: "user", content: "Weather in Paris?" }],
    });
    expect(canonical(received).chat).toEqual({
      model: "m",
      max_tokens: 64,
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Weather in Paris?" },
      ],
      tools: [
        { type: "function", function: { name: "get_weather", parameters: tools[0]?.input_schema } },
        { type: "function", function: { name: "get_time", parameters: { type: "object" } } },
      ],
    });
    expect(message.id).toBe(msgId);
    expect(message.stop_reason).toBe("tool_use");
    expect(message.content).toEqual([
      { type: "text", text: "Checking." },
      { type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Paris" } },
    ]);
    expect(message.usage).toEqual({
      input_tokens: 21,
      output_tokens: 9,
      cache_read_input_tokens: 0,
      cache_creation_input_tokens: 0,
    });
    expect((message as unknown as { x_gateway: unknown }).x_gateway).toEqual(charge);
  });

  it("messages.create({stream: true}): raw events, text exact", async () => {
    answer = { events: translate(textChunks) };
    const stream = await client.messages.create({
      model: "m",
      max_tokens: 64,
      stream: true,
      messages: [{ role: "user", content: "Hi" }],
    });
    expect(canonical(received)).toMatchObject({
      chat: { stream: true, stream_options: { include_usage: true } },
      stream: true,
    });
    let text = "";
    const types: string[] = [];
    let last: unknown;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") {
        text += event.delta.text;
      }
      if (event.type === "message_delta") {
        expect(event.delta.stop_reason).toBe("end_turn");
        expect(event.usage.output_tokens).toBe(9);
      }
      last = event;
    }
    expect(text).toBe("Hello, world");
    expect(types.at(0)).toBe("message_start");
    expect(last).toEqual({ type: "message_stop", x_gateway: charge });
  });

  it("messages.stream + finalMessage: tool_use input assembled from the split arguments", async () => {
    answer = { events: translate(toolChunks) };
    const stream = client.messages.stream({
      model: "m",
      max_tokens: 64,
      tools,
      messages: [{ role: "user", content: "Weather and time in Paris?" }],
    });
    const texts: string[] = [];
    stream.on("text", (delta) => texts.push(delta));
    const message = await stream.finalMessage();
    expect(texts).toEqual(["Let me look."]);
    expect(message.id).toBe(msgId);
    expect(message.model).toBe("provider-model");
    expect(message.stop_reason).toBe("tool_use");
    expect(message.content).toEqual([
      { type: "text", text: "Let me look." },
      { type: "tool_use", id: "call_a", name: "get_weather", input: { city: "Paris" } },
      { type: "tool_use", id: "call_b", name: "get_time", input: { tz: "UTC" } },
    ]);
    expect(message.usage).toMatchObject({
      input_tokens: 21,
      output_tokens: 9,
      cache_read_input_tokens: 0,
      cache_creation_input_tokens: 0,
    });
  });

  it("messages.stream + finalMessage: length -> max_tokens, the charge's usage whatever a usage-only last chunk claims", async () => {
    answer = {
      events: translate([
        chunk({ role: "assistant", content: "" }),
        chunk({ content: "One two" }),
        chunk({}, "length"),
        usageChunk({
          prompt_tokens: 7,
          completion_tokens: 2,
          completion_tokens_details: { reasoning_tokens: 1 },
        }),
      ]),
    };
    const message = await client.messages
      .stream({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "Count" }] })
      .finalMessage();
    expect(message.content).toEqual([{ type: "text", text: "One two" }]);
    expect(message.stop_reason).toBe("max_tokens");
    expect(message.usage).toMatchObject({ input_tokens: 21, output_tokens: 9 });
  });

  it("parallel tool calls in one chunk, then interleaved argument deltas", async () => {
    answer = {
      events: translate([
        chunk({
          tool_calls: [
            {
              index: 0,
              id: "c0",
              type: "function",
              function: { name: "get_time", arguments: '{"tz":' },
            },
            {
              index: 1,
              id: "c1",
              type: "function",
              function: { name: "get_time", arguments: '{"tz":' },
            },
          ],
        }),
        chunk({ tool_calls: [{ index: 0, function: { arguments: '"UTC"}' } }] }),
        chunk({ tool_calls: [{ index: 1, function: { arguments: '"CET"}' } }] }),
        chunk({}, "tool_calls"),
      ]),
    };
    const message = await client.messages
      .stream({ model: "m", max_tokens: 64, tools, messages: [{ role: "user", content: "Time?" }] })
      .finalMessage();
    expect(message.content).toEqual([
      { type: "tool_use", id: "c0", name: "get_time", input: { tz: "UTC" } },
      { type: "tool_use", id: "c1", name: "get_time", input: { tz: "CET" } },
    ]);
    expect(message.stop_reason).toBe("tool_use");
    expect(message.usage).toMatchObject({ input_tokens: 21, output_tokens: 9 });
  });

  it("tool calls past their bound: the answer is cut there and stops with max_tokens", async () => {
    const calls = Array.from({ length: maxToolCalls + 10 }, (_, i) =>
      chunk({
        tool_calls: [{ index: i, id: `c${i}`, function: { name: "get_time", arguments: "{}" } }],
      }),
    );
    const raw = messagesDialect.createStream({ requestId, model: "m" });
    for (const c of calls) raw.chunk(c);
    expect(heldBy(raw)).toEqual({ chars: 0, toolCalls: maxToolCalls });

    answer = { events: translate([...calls, chunk({ content: "late" }, "tool_calls")]) };
    const message = await client.messages
      .stream({ model: "m", max_tokens: 64, tools, messages: [{ role: "user", content: "Time?" }] })
      .finalMessage();
    expect(message.content.length).toBe(maxToolCalls);
    expect(message.content.every((block) => block.type === "tool_use")).toBe(true);
    expect(message.content.at(-1)).toEqual({
      type: "tool_use",
      id: `c${maxToolCalls - 1}`,
      name: "get_time",
      input: {},
    });
    expect(message.stop_reason).toBe("max_tokens");
  });

  it("arguments past their bound before the name: the SDK's tool_use has them all, and no name", async () => {
    const piece = `"${"1".repeat(9_998)}",`;
    answer = {
      events: translate([
        chunk({ tool_calls: [{ index: 0, id: "c", function: { arguments: "[" } }] }),
        ...Array.from({ length: 8 }, () =>
          chunk({ tool_calls: [{ index: 0, function: { arguments: piece } }] }),
        ),
        chunk({ tool_calls: [{ index: 0, function: { name: "get_time", arguments: '""]' } }] }),
        chunk({}, "tool_calls"),
      ]),
    };
    const message = await client.messages
      .stream({ model: "m", max_tokens: 64, tools, messages: [{ role: "user", content: "Time?" }] })
      .finalMessage();
    expect(message.content).toEqual([
      {
        type: "tool_use",
        id: "c",
        name: "",
        input: [...Array.from({ length: 8 }, () => "1".repeat(9_998)), ""],
      },
    ]);
    expect(message.stop_reason).toBe("tool_use");
  });

  it("the SDK's tool_result turn translates back to tool messages", async () => {
    answer = {
      status: 200,
      json: dialect.fromCompletion(completion({ content: "Sunny." }, "stop"), charge),
    };
    const message = await client.messages.create({
      model: "m",
      max_tokens: 64,
      tools,
      tool_choice: { type: "auto", disable_parallel_tool_use: true },
      messages: [
        { role: "user", content: "Weather?" },
        {
          role: "assistant",
          content: [
            { type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Paris" } },
          ],
        },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: "call_1", content: "sunny" }],
        },
      ],
    });
    expect(message.content).toEqual([{ type: "text", text: "Sunny." }]);
    const { chat } = canonical(received);
    expect(chat["messages"]).toEqual([
      { role: "user", content: "Weather?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          {
            id: "call_1",
            type: "function",
            function: { name: "get_weather", arguments: '{"city":"Paris"}' },
          },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: "sunny" },
    ]);
    expect(chat).toMatchObject({ tool_choice: "auto", parallel_tool_calls: false });
  });

  it("an error body becomes the SDK's typed error, with the gateway's code", async () => {
    const error = new GatewayError("insufficient_credits", "the permit has too few credits");
    answer = { status: httpStatusOf(error.code), json: messagesDialect.errorBody(error) };
    const caught = await client.messages
      .create({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "x" }] })
      .catch((err: unknown) => err);
    expect(caught).toBeInstanceOf(Anthropic.APIError);
    const apiError = caught as InstanceType<typeof Anthropic.APIError>;
    expect(apiError.status).toBe(402);
    expect(apiError.type).toBe("billing_error");
    expect(apiError.apiMessage).toBe("the permit has too few credits");
    expect(apiError.errorCode).toBe("insufficient_credits");
  });

  it("a stream that fails after it began raises the SDK's error", async () => {
    const stream = dialect.createStream({ requestId, model: "m" });
    answer = {
      events: [
        ...stream.chunk(chunk({ content: "Hel" })),
        ...stream.fail(new GatewayError("upstream_error", "the provider failed")),
      ],
    };
    const texts: string[] = [];
    const caught = await client.messages
      .stream({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "x" }] })
      .on("text", (delta) => texts.push(delta))
      .finalMessage()
      .catch((err: unknown) => err);
    expect(texts).toEqual(["Hel"]);
    expect(caught).toBeInstanceOf(Anthropic.APIError);
    const apiError = caught as InstanceType<typeof Anthropic.APIError>;
    expect(apiError.type).toBe("api_error");
    expect(apiError.errorCode).toBe("upstream_error");
  });
});

testEmittedConforms(emitted, {
  request: MessagesRequest,
  answer: MessagesAnswer,
  event: MessagesStreamEvent,
});
