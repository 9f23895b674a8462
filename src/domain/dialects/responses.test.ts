import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { httpStatusOf } from "../../connect/error-codes.js";
import type { AddressInfo } from "node:net";
import OpenAI, { APIError } from "openai";
import type {
  Response as OpenAIResponse,
  ResponseStreamEvent,
} from "openai/resources/responses/responses";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseChatRequest } from "../chat/request/index.js";
import {
  recording,
  testEmittedConforms,
  type Emitted,
} from "../../../test/helpers/dialect-conformance.js";
import { ResponsesAnswer, ResponsesStreamEvent } from "../../rest/views/responses.js";
import { ResponsesRequest } from "../../schema/responses.js";
import { GatewayError } from "../errors.js";
import { responsesDialect } from "./responses.js";
import { responseId } from "./responses-answer.js";
import { heldBy, maxHeldChars, maxHeldParts } from "./responses-stream.js";
import type { DialectEvent, GatewayCharge } from "./types.js";

const requestId = `0x${"ab".repeat(32)}`;
const tail = "ab".repeat(32);

const charge: GatewayCharge = {
  request_id: requestId,
  quote_id: `0x${"cd".repeat(32)}`,
  offer_id: `0x${"ef".repeat(32)}`,
  tariff_version: "3",
  input_tokens: "12",
  output_tokens: "3",
  cached_input_tokens: "4",
  reasoning_tokens: "0",
  credits_charged: "1234",
  billing: "billed",
  usage_claimed: {
    input_tokens: "12",
    output_tokens: "3",
    cached_input_tokens: "0",
    reasoning_tokens: "0",
  },
  usage_counted: {
    input_tokens: "12",
    output_tokens: "4",
    cached_input_tokens: "0",
    reasoning_tokens: "0",
  },
  usage_source: "provider",
};

/** Every answer and event the tests below make, checked against the schemas at the end. */
const emitted: Emitted = { requests: [], answers: [], events: [] };
const dialect = recording(responsesDialect, emitted);

/** The canonical request must be one the chat route itself accepts. */
function chatParses(chat: Record<string, unknown>): void {
  const raw = new TextEncoder().encode(JSON.stringify(chat));
  expect(() => parseChatRequest(raw, { maxBytes: 1_000_000 })).not.toThrow();
}

function refusal(body: unknown): GatewayError {
  try {
    dialect.toCanonical(body);
  } catch (error) {
    if (error instanceof GatewayError) return error;
    throw error;
  }
  throw new Error("accepted");
}

describe("toCanonical: accepted requests", () => {
  const weather = {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  };
  const cases: [string, Record<string, unknown>, Record<string, unknown>, boolean][] = [
    [
      "a string input is one user message",
      { model: "m", input: "Hi" },
      { model: "m", messages: [{ role: "user", content: "Hi" }], stream: false },
      false,
    ],
    [
      "instructions first; developer becomes system; one text part is a string; images",
      {
        model: "m",
        instructions: "Be brief.",
        input: [
          { role: "developer", content: "Answer in French." },
          { type: "message", role: "user", content: [{ type: "input_text", text: "Hello" }] },
          {
            role: "user",
            content: [
              { type: "input_text", text: "What is this?" },
              { type: "input_image", image_url: "https://x.test/a.png", detail: "low" },
              { type: "input_image", image_url: "data:image/png;base64,AA==", detail: "original" },
            ],
          },
        ],
      },
      {
        model: "m",
        messages: [
          { role: "system", content: "Be brief." },
          { role: "system", content: "Answer in French." },
          { role: "user", content: "Hello" },
          {
            role: "user",
            content: [
              { type: "text", text: "What is this?" },
              { type: "image_url", image_url: { url: "https://x.test/a.png", detail: "low" } },
              { type: "image_url", image_url: { url: "data:image/png;base64,AA==" } },
            ],
          },
        ],
        stream: false,
      },
      false,
    ],
    [
      "function calls join the assistant message before them; outputs are tool messages; reasoning items drop",
      {
        model: "m",
        input: [
          { role: "user", content: "Weather in Paris and Rome?" },
          { type: "reasoning", id: "rs_1", summary: [], encrypted_content: "opaque" },
          {
            type: "message",
            role: "assistant",
            id: "msg_1",
            status: "completed",
            content: [{ type: "output_text", text: "Checking.", annotations: [] }],
          },
          {
            type: "function_call",
            call_id: "call_1",
            name: "weather",
            arguments: '{"city":"Paris"}',
          },
          {
            type: "function_call",
            call_id: "call_2",
            name: "weather",
            arguments: '{"city":"Rome"}',
          },
          { type: "function_call_output", call_id: "call_1", output: "18C" },
          {
            type: "function_call_output",
            call_id: "call_2",
            output: [{ type: "input_text", text: "21C" }],
          },
          { type: "function_call", call_id: "call_3", name: "clock", arguments: "{}" },
        ],
      },
      {
        model: "m",
        messages: [
          { role: "user", content: "Weather in Paris and Rome?" },
          {
            role: "assistant",
            content: "Checking.",
            tool_calls: [
              {
                id: "call_1",
                type: "function",
                function: { name: "weather", arguments: '{"city":"Paris"}' },
              },
              {
                id: "call_2",
                type: "function",
                function: { name: "weather", arguments: '{"city":"Rome"}' },
              },
            ],
          },
          { role: "tool", tool_call_id: "call_1", content: "18C" },
          { role: "tool", tool_call_id: "call_2", content: "21C" },
          {
            role: "assistant",
            content: null,
            tool_calls: [
              { id: "call_3", type: "function", function: { name: "clock", arguments: "{}" } },
            ],
          },
        ],
        stream: false,
      },
      false,
    ],
    [
      "tools, tool_choice, json_schema, limits and sampling; streaming asks for usage",
      {
        model: "m",
        input: "Weather?",
        tools: [
          {
            type: "function",
            name: "weather",
            description: "Current weather",
            parameters: weather,
            strict: true,
          },
        ],
        tool_choice: { type: "function", name: "weather" },
        parallel_tool_calls: false,
        max_output_tokens: 256,
        temperature: 0.2,
        top_p: 0.9,
        text: {
          format: { type: "json_schema", name: "answer", schema: weather, strict: true },
          verbosity: "low",
        },
        reasoning: { effort: "low", summary: "auto" },
        user: "u-1",
        stream: true,
      },
      {
        model: "m",
        messages: [{ role: "user", content: "Weather?" }],
        tools: [
          {
            type: "function",
            function: {
              name: "weather",
              description: "Current weather",
              parameters: weather,
              strict: true,
            },
          },
        ],
        tool_choice: { type: "function", function: { name: "weather" } },
        parallel_tool_calls: false,
        max_completion_tokens: 256,
        temperature: 0.2,
        top_p: 0.9,
        verbosity: "low",
        response_format: {
          type: "json_schema",
          json_schema: { name: "answer", schema: weather, strict: true },
        },
        reasoning_effort: "low",
        user: "u-1",
        stream: true,
        stream_options: { include_usage: true },
      },
      true,
    ],
    [
      "store false, nulls, hints and the gateway's own fields",
      {
        model: "m",
        input: [{ role: "user", content: "Hi" }],
        store: false,
        previous_response_id: null,
        conversation: null,
        background: false,
        truncation: "disabled",
        metadata: { app: "x" },
        include: ["reasoning.encrypted_content"],
        prompt_cache_key: "k",
        safety_identifier: "s",
        service_tier: "auto",
        stream_options: { include_obfuscation: false },
        tool_choice: "required",
        text: { format: { type: "json_object" } },
        offer: `0x${"ef".repeat(32)}`,
        provider: { sort: "price" },
      },
      {
        model: "m",
        messages: [{ role: "user", content: "Hi" }],
        tool_choice: "required",
        response_format: { type: "json_object" },
        offer: `0x${"ef".repeat(32)}`,
        provider: { sort: "price" },
        stream: false,
      },
      false,
    ],
    [
      "text format text adds nothing",
      { model: "m", input: "Hi", text: { format: { type: "text" } } },
      { model: "m", messages: [{ role: "user", content: "Hi" }], stream: false },
      false,
    ],
  ];
  it.each(cases)("%s", (_name, body, chat, stream) => {
    const result = dialect.toCanonical(body);
    expect(result).toEqual({ chat, stream });
    chatParses(result.chat);
  });
});

describe("toCanonical: refusals name the field", () => {
  const cases: [string, unknown, string][] = [
    ["not an object", [], "the request body must be an object"],
    ["no model", { input: "x" }, "'model' is required"],
    ["no input", { model: "m" }, "'input' is required"],
    [
      "previous_response_id",
      { model: "m", input: "x", previous_response_id: "resp_1" },
      "'previous_response_id' is not supported: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    ],
    [
      "conversation",
      { model: "m", input: "x", conversation: "conv_1" },
      "'conversation' is not supported: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    ],
    [
      "store true",
      { model: "m", input: "x", store: true },
      "'store' must be false or left out: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    ],
    [
      "background",
      { model: "m", input: "x", background: true },
      "'background' must be false or left out: answers are not stored",
    ],
    [
      "a stored prompt",
      { model: "m", input: "x", prompt: { id: "pmpt_1" } },
      "'prompt' (a stored prompt template) is not supported; send the text in 'input'",
    ],
    [
      "an unknown field",
      { model: "m", input: "x", context_management: [] },
      "'context_management' is not supported by this gateway's Responses API",
    ],
    [
      "a built-in tool",
      { model: "m", input: "x", tools: [{ type: "web_search" }] },
      "'tools[0].type' must be \"function\": this gateway runs no built-in tools; declare a function tool",
    ],
    [
      "a built-in tool choice",
      { model: "m", input: "x", tool_choice: { type: "file_search" } },
      "'tool_choice.type' must be \"function\": this gateway runs no built-in tools",
    ],
    [
      "truncation auto",
      { model: "m", input: "x", truncation: "auto" },
      "'truncation' must be \"disabled\" (the gateway does not truncate input)",
    ],
    [
      "an item reference",
      { model: "m", input: [{ type: "item_reference", id: "msg_1" }] },
      "'input[0].type' \"item_reference\" is not supported: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    ],
    [
      "a built-in tool's output item",
      { model: "m", input: [{ type: "computer_call_output", call_id: "c", output: {} }] },
      "'input[0].type' must be one of message, function_call, function_call_output, reasoning",
    ],
    [
      "a file input",
      {
        model: "m",
        input: [{ role: "user", content: [{ type: "input_file", file_id: "file_1" }] }],
      },
      "'input[0].content[0].type' must be one of input_text, output_text, input_image",
    ],
    [
      "an image by file id",
      {
        model: "m",
        input: [
          {
            role: "user",
            content: [
              { type: "input_image", image_url: "https://x.test/a.png", file_id: "file_1" },
            ],
          },
        ],
      },
      "'input[0].content[0].file_id' is not supported (no files are stored); send 'image_url'",
    ],
    [
      "a bad role",
      { model: "m", input: [{ role: "tool", content: "x" }] },
      "'input[0].role' must be one of user, assistant, system, developer",
    ],
    [
      "a function call without arguments",
      { model: "m", input: [{ type: "function_call", call_id: "c", name: "f" }] },
      "'input[0].arguments' is required",
    ],
    [
      "max_output_tokens 0",
      { model: "m", input: "x", max_output_tokens: 0 },
      "'max_output_tokens' must be an integer from 1 to 9007199254740991",
    ],
    [
      "a json_schema format without schema",
      { model: "m", input: "x", text: { format: { type: "json_schema", name: "a" } } },
      "'text.format.schema' is required",
    ],
    [
      "stream not a boolean",
      { model: "m", input: "x", stream: "yes" },
      "'stream' must be a boolean",
    ],
  ];
  it.each(cases)("%s", (_name, body, message) => {
    const error = refusal(body);
    expect(error.code).toBe("invalid_request");
    expect(error.message).toBe(message);
  });
});

describe("toCanonical: the schema's rules (ResponsesRequest), each naming the field", () => {
  const user = (content: unknown) => ({ model: "m", input: [{ role: "user", content }] });
  const call = (item: Record<string, unknown>) => ({
    model: "m",
    input: [{ type: "function_call", call_id: "c", name: "f", arguments: "{}", ...item }],
  });
  const cases: [string, unknown, string, string?][] = [
    [
      "input empty",
      { model: "m", input: [] },
      "'input' must be a string or a non-empty array of input items",
    ],
    [
      "input a number",
      { model: "m", input: 42 },
      "'input' must be a string or a non-empty array of input items",
    ],
    [
      "an item not an object",
      { model: "m", input: [5] },
      "'input[0]' must be an object (an input item)",
    ],
    [
      "an item type not a string",
      { model: "m", input: [{ type: 5 }] },
      "'input[0].type' must be a string",
    ],
    [
      "a message without role",
      { model: "m", input: [{ content: "x" }] },
      "'input[0].role' is required",
    ],
    [
      "content a number",
      user(5),
      "'input[0].content' must be a string or an array of content parts",
    ],
    [
      "a refusal part in a user message",
      user([{ type: "refusal", refusal: "no" }]),
      "'input[0].content[0].type' must be one of input_text, output_text, input_image",
    ],
    [
      "an image in an assistant message",
      {
        model: "m",
        input: [
          {
            role: "assistant",
            content: [{ type: "input_image", image_url: "https://x.test/a.png" }],
          },
        ],
      },
      "'input[0].content[0].type' must be one of input_text, output_text, refusal",
    ],
    [
      "an image in a developer message",
      {
        model: "m",
        input: [
          {
            role: "developer",
            content: [{ type: "input_image", image_url: "https://x.test/a.png" }],
          },
        ],
      },
      "'input[0].content[0].type' must be one of input_text, output_text",
    ],
    [
      "a text part without text",
      user([{ type: "input_text" }]),
      "'input[0].content[0].text' is required",
    ],
    [
      "an image by file id only",
      user([{ type: "input_image", file_id: "file_1" }]),
      "'input[0].content[0].image_url' is required",
    ],
    [
      "an empty image_url",
      user([{ type: "input_image", image_url: "" }]),
      "'input[0].content[0].image_url' must be a non-empty string (a URL or a data URL)",
    ],
    [
      "an image detail not a string",
      user([{ type: "input_image", image_url: "https://x.test/a.png", detail: 5 }]),
      "'input[0].content[0].detail' must be a string",
    ],
    ["an empty call_id", call({ call_id: "" }), "'input[0].call_id' must be a non-empty string"],
    [
      "a call without name",
      { model: "m", input: [{ type: "function_call", call_id: "c", arguments: "{}" }] },
      "'input[0].name' is required",
    ],
    [
      "a call output without output",
      { model: "m", input: [{ type: "function_call_output", call_id: "c" }] },
      "'input[0].output' is required",
    ],
    [
      "a call output with an image",
      {
        model: "m",
        input: [{ type: "function_call_output", call_id: "c", output: [{ type: "input_image" }] }],
      },
      "'input[0].output[0].type' must be \"input_text\" (other tool outputs are not supported)",
    ],
    [
      "only reasoning items",
      { model: "m", input: [{ type: "reasoning", summary: [] }] },
      "'input' holds no message",
    ],
    [
      "tools not an array",
      { model: "m", input: "x", tools: {} },
      "'tools' must be an array, each an object",
    ],
    [
      "a tool without name",
      { model: "m", input: "x", tools: [{ type: "function" }] },
      "'tools[0].name' is required",
    ],
    [
      "tool parameters not an object",
      { model: "m", input: "x", tools: [{ type: "function", name: "f", parameters: [] }] },
      "'tools[0].parameters' must be a JSON schema object",
    ],
    [
      "tool strict not a boolean",
      { model: "m", input: "x", tools: [{ type: "function", name: "f", strict: "yes" }] },
      "'tools[0].strict' must be a boolean",
    ],
    [
      "tool_choice an unknown string",
      { model: "m", input: "x", tool_choice: "always" },
      '\'tool_choice\' must be a string ("auto", "none" or "required") or a function choice ({"type": "function", "name": ...})',
    ],
    [
      "tool_choice function without name",
      { model: "m", input: "x", tool_choice: { type: "function" } },
      "'tool_choice.name' is required",
    ],
    ["text not an object", { model: "m", input: "x", text: "json" }, "'text' must be an object"],
    [
      "an unknown text member",
      { model: "m", input: "x", text: { style: "x" } },
      "'text.style' is not supported by this gateway's Responses API",
    ],
    [
      "an unknown format",
      { model: "m", input: "x", text: { format: { type: "xml" } } },
      "'text.format.type' must be one of text, json_object, json_schema",
    ],
    [
      "a json_schema format without name",
      { model: "m", input: "x", text: { format: { type: "json_schema", schema: {} } } },
      "'text.format.name' is required",
    ],
    [
      "a null json_schema schema",
      {
        model: "m",
        input: "x",
        text: { format: { type: "json_schema", name: "a", schema: null } },
      },
      "'text.format.schema' must be a JSON schema object",
    ],
    [
      "verbosity unknown",
      { model: "m", input: "x", text: { verbosity: "loud" } },
      "'text.verbosity' must be one of low, medium, high",
    ],
    [
      "an unknown reasoning member",
      { model: "m", input: "x", reasoning: { budget: 1 } },
      "'reasoning.budget' is not supported by this gateway's Responses API",
    ],
    [
      "reasoning effort not a string",
      { model: "m", input: "x", reasoning: { effort: 1 } },
      "'reasoning.effort' must be a string",
    ],
    [
      "top_logprobs",
      { model: "m", input: "x", top_logprobs: 2 },
      "'top_logprobs' is not supported by this gateway's Responses API",
    ],
    [
      "store not a boolean",
      { model: "m", input: "x", store: "no" },
      "'store' must be false or left out: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    ],
    [
      "an unknown member, null",
      { model: "m", input: "x", seed: null },
      "'seed' is not supported by this gateway's Responses API",
    ],
    [
      "stream_options not an object",
      { model: "m", input: "x", stream_options: [] },
      "'stream_options' must be an object",
    ],
    [
      "include not strings",
      { model: "m", input: "x", include: [1] },
      "'include[0]' must be a string",
    ],
    ["user not a string", { model: "m", input: "x", user: 5 }, "'user' must be a string"],
    [
      "parallel_tool_calls not a boolean",
      { model: "m", input: "x", parallel_tool_calls: "no" },
      "'parallel_tool_calls' must be a boolean",
    ],
    [
      "temperature not a number",
      { model: "m", input: "x", temperature: "hot" },
      "'temperature' must be a number",
    ],
    [
      "max_output_tokens beyond exact integers",
      { model: "m", input: "x", max_output_tokens: 2 ** 53 },
      "'max_output_tokens' must be an integer from 1 to 9007199254740991",
    ],
    [
      "instructions not a string",
      { model: "m", input: "x", instructions: ["a"] },
      "'instructions' must be a string",
    ],
    ["model empty", { model: "", input: "x" }, "'model' must be a non-empty string"],
    [
      "an offer that is not Hex32",
      { model: "m", input: "x", offer: "0x12" },
      "'offer' must be a Hex32 string (0x followed by 64 hex digits)",
      "invalid_hex",
    ],
  ];
  it.each(cases)("%s", (_name, body, message, code = "invalid_request") => {
    const error = refusal(body);
    expect(error.code).toBe(code);
    expect(error.message).toBe(message);
  });

  it("a typeless or null-typed item is a message; a member set to null is absent", () => {
    expect(
      dialect.toCanonical({
        model: "m",
        input: [{ type: null, role: "user", content: "Hi" }],
        instructions: null,
        tools: null,
        tool_choice: null,
        text: { format: null, verbosity: null },
        reasoning: { effort: null, summary: null },
        temperature: null,
        stream: null,
      }).chat,
    ).toEqual({ model: "m", messages: [{ role: "user", content: "Hi" }], stream: false });
  });
});

describe("fromCompletion", () => {
  it("the usage shown is what was charged, never the provider's claim (its details neither)", () => {
    const answer = dialect.fromCompletion(
      {
        id: "chatcmpl-1",
        object: "chat.completion",
        created: 1_700_000_000,
        model: "m",
        choices: [
          { index: 0, message: { role: "assistant", content: "x" }, finish_reason: "stop" },
        ],
        usage: {
          prompt_tokens: 4_096,
          completion_tokens: 4_096,
          prompt_tokens_details: { cached_tokens: 13 },
          completion_tokens_details: { reasoning_tokens: 4 },
        },
      },
      charge,
    ) as { usage: unknown };
    expect(answer.usage).toEqual({
      input_tokens: 12,
      input_tokens_details: { cached_tokens: 4 },
      output_tokens: 3,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 15,
    });
  });

  it("a text answer with usage details", () => {
    const answer = dialect.fromCompletion(
      {
        id: "chatcmpl-1",
        object: "chat.completion",
        created: 1_700_000_000,
        model: "m-2024",
        choices: [
          { index: 0, message: { role: "assistant", content: "Bonjour" }, finish_reason: "stop" },
        ],
        usage: {
          prompt_tokens: 12,
          completion_tokens: 3,
          total_tokens: 15,
          prompt_tokens_details: { cached_tokens: 4 },
          completion_tokens_details: { reasoning_tokens: 1 },
        },
      },
      { ...charge, reasoning_tokens: "1" },
    );
    expect(answer).toEqual({
      id: `resp_${tail}`,
      object: "response",
      created_at: 1_700_000_000,
      status: "completed",
      error: null,
      incomplete_details: null,
      instructions: null,
      metadata: null,
      model: "m-2024",
      output: [
        {
          type: "message",
          id: `msg_${tail}_0`,
          status: "completed",
          role: "assistant",
          content: [{ type: "output_text", text: "Bonjour", annotations: [] }],
        },
      ],
      parallel_tool_calls: true,
      store: false,
      temperature: null,
      tool_choice: "auto",
      tools: [],
      top_p: null,
      usage: {
        input_tokens: 12,
        input_tokens_details: { cached_tokens: 4 },
        output_tokens: 3,
        output_tokens_details: { reasoning_tokens: 1 },
        total_tokens: 15,
      },
      x_gateway: { ...charge, reasoning_tokens: "1" },
    });
  });

  it("tool calls without text, cut by the output limit, usage from the charge", () => {
    const answer = dialect.fromCompletion(
      {
        created: 1_700_000_000,
        model: "m",
        choices: [
          {
            index: 0,
            message: {
              role: "assistant",
              content: null,
              tool_calls: [
                {
                  id: "call_a",
                  type: "function",
                  function: { name: "weather", arguments: '{"city":"Paris"}' },
                },
                { id: "call_b", type: "function", function: { name: "clock", arguments: "{}" } },
              ],
            },
            finish_reason: "length",
          },
        ],
      },
      charge,
    ) as Record<string, unknown>;
    expect(answer["status"]).toBe("incomplete");
    expect(answer["incomplete_details"]).toEqual({ reason: "max_output_tokens" });
    expect(answer["output"]).toEqual([
      {
        type: "function_call",
        id: `fc_${tail}_0`,
        call_id: "call_a",
        name: "weather",
        arguments: '{"city":"Paris"}',
        status: "completed",
      },
      {
        type: "function_call",
        id: `fc_${tail}_1`,
        call_id: "call_b",
        name: "clock",
        arguments: "{}",
        status: "completed",
      },
    ]);
    expect(answer["usage"]).toEqual({
      input_tokens: 12,
      input_tokens_details: { cached_tokens: 4 },
      output_tokens: 3,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 15,
    });
  });
});

describe("errorBody", () => {
  it("OpenAI's shape with the gateway's code; an internal error's message stays in the logs", () => {
    expect(
      responsesDialect.errorBody(new GatewayError("insufficient_credits", "the permit is short")),
    ).toEqual({
      error: {
        message: "the permit is short",
        type: "payment_required",
        code: "insufficient_credits",
        param: null,
      },
    });
    expect(
      responsesDialect.errorBody(new GatewayError("internal_error", "db at 10.0.0.3")),
    ).toEqual({
      error: { message: "internal error", type: "api_error", code: "internal_error", param: null },
    });
  });
});

// ---------------------------------------------------------------- streams

function chunk(delta: Record<string, unknown>, finish: string | null = null) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1_700_000_000,
    model: "m",
    choices: [{ index: 0, delta, finish_reason: finish }],
  };
}

function usageChunk(usage: Record<string, unknown>) {
  return {
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created: 1_700_000_000,
    model: "m",
    choices: [],
    usage,
  };
}

const usage = {
  prompt_tokens: 12,
  completion_tokens: 3,
  total_tokens: 15,
  prompt_tokens_details: { cached_tokens: 4 },
};

const textChunks = [
  chunk({ role: "assistant", content: "" }),
  chunk({ content: "Hello" }),
  chunk({ content: ", world" }),
  chunk({}, "stop"),
  usageChunk(usage),
];

const callChunks = [
  chunk({ role: "assistant", content: "Let me check." }),
  chunk({
    tool_calls: [
      {
        index: 0,
        id: "call_a",
        type: "function",
        function: { name: "weather", arguments: "" },
      },
    ],
  }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: '{"ci' } }] }),
  chunk({ tool_calls: [{ index: 0, function: { arguments: 'ty":"Paris"}' } }] }),
  chunk({
    tool_calls: [
      { index: 1, id: "call_b", type: "function", function: { name: "clock", arguments: "{" } },
    ],
  }),
  chunk({ tool_calls: [{ index: 1, function: { arguments: "}" } }] }),
  chunk({}, "tool_calls"),
  usageChunk({ prompt_tokens: 20, completion_tokens: 9, total_tokens: 29 }),
];

const lengthChunks = [
  chunk({ role: "assistant", content: "One, two" }),
  chunk({}, "length"),
  usageChunk({ prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 }),
];

function translate(chunks: readonly unknown[], end: "finish" | GatewayError = "finish") {
  const stream = dialect.createStream({ requestId, model: "m" });
  const events: DialectEvent[] = chunks.flatMap((c) => stream.chunk(c));
  events.push(...(end === "finish" ? stream.finish(charge) : stream.fail(end)));
  return events;
}

type EventData = { type: string; sequence_number: number } & Record<string, unknown>;

describe("the stream translator", () => {
  it("a text stream: every event named by its type, numbered in order, the charge on the last", () => {
    const events = translate(textChunks);
    const data = events.map((e) => e.data as EventData);
    expect(events.map((e) => e.event)).toEqual(data.map((d) => d.type));
    expect(data.map((d) => d.sequence_number)).toEqual(data.map((_, i) => i));
    const message = `msg_${tail}_0`;
    const where = { item_id: message, output_index: 0, content_index: 0 };
    const done = {
      type: "message",
      id: message,
      status: "completed",
      role: "assistant",
      content: [{ type: "output_text", text: "Hello, world", annotations: [] }],
    };
    const strip = ({ sequence_number: _, ...rest }: EventData) => rest;
    expect(data.slice(2, -1).map(strip)).toEqual([
      {
        type: "response.output_item.added",
        output_index: 0,
        item: { ...done, status: "in_progress", content: [] },
      },
      {
        type: "response.content_part.added",
        ...where,
        part: { type: "output_text", text: "", annotations: [] },
      },
      { type: "response.output_text.delta", ...where, delta: "Hello", logprobs: [] },
      { type: "response.output_text.delta", ...where, delta: ", world", logprobs: [] },
      { type: "response.output_text.done", ...where, text: "Hello, world", logprobs: [] },
      { type: "response.content_part.done", ...where, part: done.content[0] },
      { type: "response.output_item.done", output_index: 0, item: done },
    ]);
    expect(
      data.slice(0, 2).map((d) => [d.type, (d["response"] as { status: string }).status]),
    ).toEqual([
      ["response.created", "in_progress"],
      ["response.in_progress", "in_progress"],
    ]);
    const last = data.at(-1)!;
    expect(last.type).toBe("response.completed");
    expect(last["x_gateway"]).toEqual(charge);
    expect(last["response"]).toMatchObject({
      id: responseId(requestId),
      created_at: 1_700_000_000,
      status: "completed",
      output: [done],
      usage: {
        input_tokens: 12,
        input_tokens_details: { cached_tokens: 4 },
        output_tokens: 3,
        output_tokens_details: { reasoning_tokens: 0 },
        total_tokens: 15,
      },
    });
  });

  it("nothing after the end; a failure before any chunk still opens the response", () => {
    const stream = dialect.createStream({ requestId, model: "m" });
    const failed = stream.fail(new GatewayError("upstream_error", "the provider went away"));
    expect(failed.map((e) => e.event)).toEqual([
      "response.created",
      "response.in_progress",
      "response.failed",
    ]);
    expect((failed[2]!.data as { response: unknown }).response).toMatchObject({
      status: "failed",
      error: { code: "upstream_error", message: "the provider went away" },
      output: [],
    });
    expect(stream.chunk(chunk({ content: "late" }))).toEqual([]);
    expect(stream.finish(charge)).toEqual([]);
  });
});

describe("the stream translator: calls", () => {
  it("a repeated name is kept once; text after a call is a new message after it", () => {
    const events = translate([
      chunk({
        tool_calls: [{ index: 0, id: "call_a", function: { name: "clock", arguments: "{" } }],
      }),
      chunk({ tool_calls: [{ index: 0, function: { name: "clock", arguments: "}" } }] }),
      chunk({ content: "Done." }, "stop"),
    ]);
    const last = events.at(-1)!.data as { response: { output: unknown[] } };
    expect(last.response.output).toEqual([
      {
        type: "function_call",
        id: `fc_${tail}_0`,
        call_id: "call_a",
        name: "clock",
        arguments: "{}",
        status: "completed",
      },
      {
        type: "message",
        id: `msg_${tail}_1`,
        status: "completed",
        role: "assistant",
        content: [{ type: "output_text", text: "Done.", annotations: [] }],
      },
    ]);
  });
});

// ---------------------------------------------------------------- what a stream holds

/** `count` chunks of text deltas of `size` code units each, each made when it is read. */
function* textDeltas(count: number, size: number, field = "content"): Generator<unknown> {
  for (let i = 0; i < count; i += 1) yield chunk({ [field]: String(i % 10).repeat(size) });
}

/** The first `units` code units of what {@link textDeltas} makes. */
function textPrefix(units: number, size: number): string {
  let text = "";
  for (let i = 0; text.length < units; i += 1) text += String(i % 10).repeat(size);
  return text.slice(0, units);
}

type Stream = ReturnType<typeof responsesDialect.createStream>;

/** Feeds `chunks` to `stream`; the most it held after any chunk, and its events. */
function feed(stream: Stream, chunks: Iterable<unknown>) {
  const events: DialectEvent[] = [];
  let chars = 0;
  let parts = 0;
  for (const c of chunks) {
    for (const e of stream.chunk(c)) events.push(e);
    const held = heldBy(stream);
    chars = Math.max(chars, held.chars);
    parts = Math.max(parts, held.parts);
  }
  return { events, most: { chars, parts } };
}

function dataOf(events: readonly DialectEvent[], type: string): EventData[] {
  return events.flatMap((e) => (e.event === type ? [e.data as EventData] : []));
}

describe("the stream translator: what it holds", () => {
  // 10,000 deltas of 5,000 units: 50 million, the bound (2^20) falls inside the 210th.
  const count = 10_000;
  const size = 5_000;

  it("50 MB of text: at most its bound held, the answer cut there, the done events carry what was relayed", () => {
    const stream = responsesDialect.createStream({ requestId, model: "m" });
    const { events, most } = feed(stream, textDeltas(count, size));
    expect(most).toEqual({ chars: maxHeldChars, parts: 2 });
    const deltas = dataOf(events, "response.output_text.delta").map((d) => d["delta"] as string);
    // 209 whole deltas and the start of the 210th; nothing after.
    expect(deltas.length).toBe(210);
    expect(deltas.at(-1)!.length).toBe(maxHeldChars - 209 * size);
    const relayed = deltas.join("");
    expect(relayed).toBe(textPrefix(maxHeldChars, size));

    const closing = stream.finish(charge);
    expect(closing.map((e) => e.event)).toEqual([
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.incomplete",
    ]);
    expect(dataOf(closing, "response.output_text.done")[0]!["text"]).toBe(relayed);
    const item = {
      type: "message",
      id: `msg_${tail}_0`,
      status: "incomplete",
      role: "assistant",
      content: [{ type: "output_text", text: relayed, annotations: [] }],
    };
    expect(dataOf(closing, "response.output_item.done")[0]!["item"]).toEqual(item);
    expect(dataOf(closing, "response.incomplete")[0]!["response"]).toMatchObject({
      status: "incomplete",
      incomplete_details: { reason: "max_output_tokens" },
      output: [item],
    });
  });

  it("tool-call arguments past the bound: the call is relayed up to it and ends incomplete; nothing after", () => {
    const stream = responsesDialect.createStream({ requestId, model: "m" });
    const start = chunk({
      content: "Let me check.",
      tool_calls: [{ index: 0, id: "call_a", function: { name: "weather", arguments: "" } }],
    });
    function* chunks(): Generator<unknown> {
      yield start;
      for (let i = 0; i < count; i += 1) {
        yield chunk({ tool_calls: [{ index: 0, function: { arguments: "7".repeat(size) } }] });
      }
      yield chunk({ tool_calls: [{ index: 1, id: "call_b", function: { name: "clock" } }] });
      yield chunk({ content: "late" }, "tool_calls");
    }
    const { events, most } = feed(stream, chunks());
    const kept = maxHeldChars - "Let me check.".length - "call_a".length - "weather".length;
    expect(most).toEqual({ chars: maxHeldChars, parts: 3 });
    const deltas = dataOf(events, "response.function_call_arguments.delta");
    expect(deltas.map((d) => d["delta"] as string).join("")).toBe("7".repeat(kept));
    expect(dataOf(events, "response.output_item.added").map((d) => d["output_index"])).toEqual([
      0, 1,
    ]);

    const closing = stream.finish(charge);
    expect(dataOf(closing, "response.function_call_arguments.done")[0]).toMatchObject({
      name: "weather",
      arguments: "7".repeat(kept),
    });
    const response = dataOf(closing, "response.incomplete")[0]!["response"] as {
      output: { type: string; status: string; arguments?: string }[];
    };
    expect(response.output.map((item) => [item.type, item.status])).toEqual([
      ["message", "completed"],
      ["function_call", "incomplete"],
    ]);
    expect(response.output[1]!.arguments!.length).toBe(kept);
  });

  it("items and parts past their bound: the answer is cut at the last that fits", () => {
    const calls = responsesDialect.createStream({ requestId, model: "m" });
    const many = Array.from({ length: 2 * maxHeldParts }, (_, i) =>
      chunk({ tool_calls: [{ index: i, id: `c${i}`, function: { name: "t", arguments: "{}" } }] }),
    );
    expect(feed(calls, many).most.parts).toBe(maxHeldParts);
    const output = (
      dataOf(calls.finish(charge), "response.incomplete")[0]!["response"] as {
        output: { call_id: string; status: string }[];
      }
    ).output;
    expect(output.length).toBe(maxHeldParts);
    // Each call that was relayed came whole.
    expect(output.at(-1)).toMatchObject({ call_id: `c${maxHeldParts - 1}`, status: "completed" });

    // Text and refusal by turns: each turn a part of the one message.
    const parts = responsesDialect.createStream({ requestId, model: "m" });
    const turns = Array.from({ length: 2 * maxHeldParts }, (_, i) =>
      chunk(i % 2 === 0 ? { content: "a" } : { refusal: "r" }),
    );
    const { events, most } = feed(parts, turns);
    expect(most.parts).toBe(maxHeldParts);
    expect(dataOf(events, "response.content_part.added").length).toBe(maxHeldParts - 1);
  });

  it("a surrogate pair at the bound is not split", () => {
    const stream = responsesDialect.createStream({ requestId, model: "m" });
    const { events, most } = feed(stream, [
      chunk({ content: "a".repeat(maxHeldChars - 1) + "\u{1F600}" }),
      chunk({ content: "b" }),
    ]);
    expect(most.chars).toBe(maxHeldChars - 1);
    expect(dataOf(events, "response.output_text.delta").map((d) => d["delta"])).toEqual([
      "a".repeat(maxHeldChars - 1),
    ]);
    const done = dataOf(stream.finish(charge), "response.output_text.done")[0]!;
    expect(done["text"]).toBe("a".repeat(maxHeldChars - 1));
  });
});

// ---------------------------------------------------------------- through the official SDK

/** What the fixture server answers next, and the request bodies it received. */
let next: (res: ServerResponse, body: unknown) => void = () => undefined;
const received: unknown[] = [];
let server: Server;
let client: OpenAI;

function sse(res: ServerResponse, events: readonly DialectEvent[]): void {
  res.writeHead(200, { "content-type": "text/event-stream" });
  for (const e of events) res.write(`event: ${e.event}\ndata: ${JSON.stringify(e.data)}\n\n`);
  res.end();
}

/** Serves the translation of `chunks` for whatever the SDK sent (checked to translate). */
function serveStream(chunks: readonly unknown[], end: "finish" | GatewayError = "finish") {
  next = (res, body) => {
    const { stream } = dialect.toCanonical(body);
    expect(stream).toBe(true);
    sse(res, translate(chunks, end));
  };
}

beforeAll(async () => {
  server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const parts: Buffer[] = [];
    req.on("data", (part: Buffer) => parts.push(part));
    req.on("end", () => {
      const body: unknown = JSON.parse(Buffer.concat(parts).toString("utf8"));
      received.push(body);
      try {
        next(res, body);
      } catch (error) {
        const gatewayError =
          error instanceof GatewayError ? error : new GatewayError("internal_error", String(error));
        res.writeHead(httpStatusOf(gatewayError.code), { "content-type": "application/json" });
        res.end(JSON.stringify(responsesDialect.errorBody(gatewayError)));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "x", maxRetries: 0 });
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe("through the official openai SDK", () => {
  it("responses.create streaming: the SDK reads every event, text and the charge", async () => {
    serveStream(textChunks);
    const stream = await client.responses.create({ model: "m", input: "Hi", stream: true });
    const events: ResponseStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    expect(
      events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : [])).join(""),
    ).toBe("Hello, world");
    const last = events.at(-1) as ResponseStreamEvent & { x_gateway?: unknown };
    expect(last.type).toBe("response.completed");
    expect(last.x_gateway).toEqual(charge);
    expect(received.at(-1)).toEqual({ model: "m", input: "Hi", stream: true });
  });

  it("responses.stream: finalResponse accumulates text, usage and the output", async () => {
    serveStream(textChunks);
    const final: OpenAIResponse = await client.responses
      .stream({ model: "m", input: "Hi", instructions: "Be brief." })
      .finalResponse();
    expect(final.output_text).toBe("Hello, world");
    expect(final.status).toBe("completed");
    expect(final.id).toBe(`resp_${tail}`);
    expect(final.usage).toEqual({
      input_tokens: 12,
      input_tokens_details: { cached_tokens: 4 },
      output_tokens: 3,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 15,
    });
  });

  it("text then two function calls, arguments split over chunks", async () => {
    serveStream(callChunks);
    const runner = client.responses.stream({
      model: "m",
      input: "Weather in Paris, and the time?",
      tools: [
        {
          type: "function",
          name: "weather",
          parameters: { type: "object", properties: { city: { type: "string" } } },
          strict: false,
        },
        { type: "function", name: "clock", parameters: null, strict: null },
      ],
    });
    const argumentSnapshots: string[] = [];
    runner.on("response.function_call_arguments.delta", (e) => argumentSnapshots.push(e.snapshot));
    const doneCalls: [string, string][] = [];
    runner.on("response.function_call_arguments.done", (e) =>
      doneCalls.push([e.name, e.arguments]),
    );
    const final = await runner.finalResponse();
    expect(final.output_text).toBe("Let me check.");
    expect(final.output.map((item) => item.type)).toEqual([
      "message",
      "function_call",
      "function_call",
    ]);
    const calls = final.output.flatMap((item) =>
      item.type === "function_call" ? [[item.call_id, item.name, item.arguments]] : [],
    );
    expect(calls).toEqual([
      ["call_a", "weather", '{"city":"Paris"}'],
      ["call_b", "clock", "{}"],
    ]);
    expect(argumentSnapshots).toEqual(['{"ci', '{"city":"Paris"}', "{", "{}"]);
    expect(doneCalls).toEqual([
      ["weather", '{"city":"Paris"}'],
      ["clock", "{}"],
    ]);
    // The charge's (12 + 3), not the claim's 29.
    expect(final.usage?.total_tokens).toBe(15);
    const canonical = dialect.toCanonical(received.at(-1)).chat;
    expect(canonical["tools"]).toEqual([
      {
        type: "function",
        function: {
          name: "weather",
          parameters: { type: "object", properties: { city: { type: "string" } } },
          strict: false,
        },
      },
      { type: "function", function: { name: "clock" } },
    ]);
  });

  it("cut by the output limit: the response is incomplete, with its reason", async () => {
    serveStream(lengthChunks);
    const runner = client.responses.stream({ model: "m", input: "Count", max_output_tokens: 2 });
    const types: string[] = [];
    runner.on("event", (e) => types.push(e.type));
    const final = await runner.finalResponse();
    expect(types.at(-1)).toBe("response.incomplete");
    expect(final.status).toBe("incomplete");
    expect(final.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(final.output_text).toBe("One, two");
    expect(final.output[0]).toMatchObject({ type: "message", status: "incomplete" });
    // The charge's, not the claim's 2.
    expect(final.usage?.output_tokens).toBe(3);
  });

  it("past the held bound: finalResponse is what the deltas gave, incomplete, with its reason", async () => {
    const size = 400_000;
    serveStream([
      chunk({ role: "assistant", content: "" }),
      ...textDeltas(3, size),
      chunk({ tool_calls: [{ index: 0, id: "call_a", function: { name: "t", arguments: "{}" } }] }),
      chunk({}, "stop"),
      usageChunk(usage),
    ]);
    const runner = client.responses.stream({ model: "m", input: "Count" });
    let snapshot = "";
    runner.on("response.output_text.delta", (e) => (snapshot = e.snapshot));
    const final = await runner.finalResponse();
    expect(snapshot).toBe(textPrefix(maxHeldChars, size));
    expect(final.output_text).toBe(snapshot);
    expect(final.status).toBe("incomplete");
    expect(final.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(final.output).toMatchObject([{ type: "message", status: "incomplete" }]);
  });

  it("tool-call arguments past the held bound: the SDK's call is what its deltas gave, incomplete", async () => {
    const piece = `"${"z".repeat(399_998)}",`;
    serveStream([
      chunk({ tool_calls: [{ index: 0, id: "call_a", function: { name: "t", arguments: "[" } }] }),
      ...[1, 2, 3].map(() => chunk({ tool_calls: [{ index: 0, function: { arguments: piece } }] })),
      chunk({ tool_calls: [{ index: 0, function: { arguments: '""]' } }] }, "tool_calls"),
    ]);
    const runner = client.responses.stream({ model: "m", input: "Go" });
    let snapshot = "";
    runner.on("response.function_call_arguments.delta", (e) => (snapshot = e.snapshot));
    const done: string[] = [];
    runner.on("response.function_call_arguments.done", (e) => done.push(e.arguments));
    const final = await runner.finalResponse();
    const kept = maxHeldChars - "call_a".length - "t".length;
    expect(snapshot.length).toBe(kept);
    expect(snapshot).toBe(`[${piece}${piece}${piece}`.slice(0, kept));
    expect(done).toEqual([snapshot]);
    expect(final.output).toEqual([
      {
        type: "function_call",
        id: `fc_${tail}_0`,
        call_id: "call_a",
        name: "t",
        arguments: snapshot,
        status: "incomplete",
        // The SDK's own (its structured-output parser), not on the wire.
        parsed_arguments: null,
      },
    ]);
    expect(final.status).toBe("incomplete");
  });

  it("a failure mid-stream: the response fails with the gateway's code, the text so far kept", async () => {
    serveStream(textChunks.slice(0, 2), new GatewayError("upstream_error", "the provider cut"));
    const final = await client.responses.stream({ model: "m", input: "Hi" }).finalResponse();
    expect(final.status).toBe("failed");
    expect(final.error).toEqual({ code: "upstream_error", message: "the provider cut" });
    expect(final.output_text).toBe("Hello");
  });

  it("a refusal streams as a refusal part, and an answer with nothing is one empty message", async () => {
    serveStream([
      chunk({ role: "assistant", refusal: "I can't" }),
      chunk({ refusal: " help with that." }, "stop"),
    ]);
    const refused = await client.responses.stream({ model: "m", input: "Hi" }).finalResponse();
    expect(refused.output).toEqual([
      {
        type: "message",
        id: `msg_${tail}_0`,
        status: "completed",
        role: "assistant",
        // `parsed` is the SDK's own (its structured-output parser), not on the wire.
        content: [{ type: "refusal", refusal: "I can't help with that.", parsed: null }],
      },
    ]);
    expect(refused.output_text).toBe("");
    // No usage on the stream: the gateway's metered counts.
    expect(refused.usage?.total_tokens).toBe(15);

    serveStream([chunk({}, "stop")]);
    const empty = await client.responses.stream({ model: "m", input: "Hi" }).finalResponse();
    expect(empty.output).toEqual([
      {
        type: "message",
        id: `msg_${tail}_0`,
        status: "completed",
        role: "assistant",
        content: [{ type: "output_text", text: "", annotations: [], parsed: null }],
      },
    ]);
  });

  it("responses.create JSON: output_text, usage and the charge", async () => {
    next = (res, body) => {
      const { chat, stream } = dialect.toCanonical(body);
      expect(stream).toBe(false);
      expect(chat["messages"]).toEqual([{ role: "user", content: "Hi" }]);
      const answer = dialect.fromCompletion(
        {
          id: "chatcmpl-1",
          object: "chat.completion",
          created: 1_700_000_000,
          model: "m",
          choices: [
            { index: 0, message: { role: "assistant", content: "Bonjour" }, finish_reason: "stop" },
          ],
          usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 },
        },
        charge,
      );
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(answer));
    };
    const response = await client.responses.create({ model: "m", input: "Hi", store: false });
    expect(response.output_text).toBe("Bonjour");
    expect(response.usage?.input_tokens).toBe(12);
    expect((response as OpenAIResponse & { x_gateway?: unknown }).x_gateway).toEqual(charge);
  });

  it("a refused request: the SDK's APIError carries the gateway's code, type and message", async () => {
    next = (_res, body) => {
      dialect.toCanonical(body);
      throw new Error("accepted");
    };
    const error = await client.responses
      .create({ model: "m", input: "Hi", previous_response_id: "resp_1" })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toBeInstanceOf(APIError);
    const apiError = error as APIError;
    expect(apiError.status).toBe(400);
    expect(apiError.code).toBe("invalid_request");
    expect(apiError.type).toBe("invalid_request_error");
    expect(apiError.message).toBe(
      "400 'previous_response_id' is not supported: this gateway's Responses API is stateless; send the whole conversation in 'input'",
    );
  });
});

testEmittedConforms(emitted, {
  request: ResponsesRequest,
  answer: ResponsesAnswer,
  event: ResponsesStreamEvent,
});
