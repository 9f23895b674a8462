import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  canonicalJson,
  defaultOutputLimit,
  fixedTokenAllowance,
  inputTokenUpperBound,
  maxChoices,
  maxJsonDepth,
  mediaPartTokenAllowance,
  outputBound,
  outputLimit,
  parseChatRequest,
  perMessageTokenAllowance,
  upstreamBody,
  type ChatRequest,
} from "./index.js";
import { exactInteger } from "./request.js";
import {
  ChatRequest as ChatRequestSchema,
  countingControls,
  forwardedMembers,
  maxStopLength,
  maxStopStrings,
} from "../../../schema/chat.js";
import { GatewayError, type ErrorCode } from "../../errors.js";

const maxBytes = 1 << 20;
const enc = new TextEncoder();
const dec = new TextDecoder();
const bytes = (text: string): Uint8Array => enc.encode(text);
const parseText = (text: string): ChatRequest => parseChatRequest(bytes(text), { maxBytes });
const parseBody = (body: unknown): ChatRequest => parseText(JSON.stringify(body));
const hello = [{ role: "user", content: "hello" }];
const minimal = { model: "demo-chat", messages: hello };
const offer = `0x${"ab".repeat(32)}`;

function rejects(input: string | Uint8Array, code: ErrorCode, field?: string): void {
  const raw = typeof input === "string" ? bytes(input) : input;
  let error: unknown;
  try {
    parseChatRequest(raw, { maxBytes });
  } catch (err) {
    error = err;
  }
  expect(error).toBeInstanceOf(GatewayError);
  const gatewayError = error as GatewayError;
  expect(gatewayError.code).toBe(code);
  if (field !== undefined) expect(gatewayError.message).toContain(field);
}

const withBody = (extra: Record<string, unknown>): string =>
  JSON.stringify({ ...minimal, ...extra });

describe("parseChatRequest", () => {
  it("accepts the minimal request and exposes typed fields", () => {
    const req = parseBody(minimal);
    expect(req).toMatchObject({
      model: "demo-chat",
      messages: hello,
      stream: false,
      includeUsage: false,
      offer: undefined,
      maxTokens: undefined,
      maxCompletionTokens: undefined,
      tools: undefined,
      toolChoice: undefined,
      responseFormat: undefined,
    });
    expect(dec.decode(req.raw)).toBe(JSON.stringify(minimal));
  });

  it("exposes every typed field and keeps unknown properties", () => {
    const tools = [{ type: "function", function: { name: "f", parameters: {} } }];
    const req = parseBody({
      ...minimal,
      offer: offer.toUpperCase().replace("0X", "0x"),
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 10,
      max_completion_tokens: 20,
      tools,
      tool_choice: "auto",
      response_format: { type: "json_object" },
      temperature: 0.5,
      top_p: 1,
      stop: ["x", "y"],
      seed: -3,
      user: "u",
      logit_bias: { "1": 2 },
    });
    expect(req).toMatchObject({
      offer,
      stream: true,
      includeUsage: true,
      maxTokens: 10n,
      maxCompletionTokens: 20n,
      tools,
      toolChoice: "auto",
      responseFormat: { type: "json_object" },
    });
    expect(req.body["logit_bias"]).toEqual({ "1": 2 });
  });

  it("accepts every role, any content (null included) and extra message properties", () => {
    const messages = [
      { role: "system", content: "s" },
      { role: "developer", content: [{ type: "text", text: "d" }] },
      { role: "user", content: "u", name: "bob" },
      { role: "assistant", content: null, tool_calls: [] },
      { role: "tool", content: "t", tool_call_id: "1" },
      { role: "function", content: { any: 1 }, name: "f" },
    ];
    expect(parseBody({ model: "m", messages }).messages).toEqual(messages);
  });

  it("treats optional fields set to null as absent", () => {
    const req = parseBody({
      ...minimal,
      offer: null,
      max_tokens: null,
      max_completion_tokens: null,
      stream: null,
      stream_options: null,
      tools: null,
      tool_choice: null,
      response_format: null,
      temperature: null,
      stop: null,
      seed: null,
      user: null,
    });
    expect(req).toMatchObject({ stream: false, offer: undefined, maxTokens: undefined });
    expect(req.fingerprint).toBe(parseBody(minimal).fingerprint);
  });

  it("reads integer limits exactly, also beyond 2^53 and in exponent form", () => {
    expect(parseText(withBody({})).maxTokens).toBeUndefined();
    expect(
      parseText(
        `{"model":"m","messages":[],"max_tokens":9007199254740993}`.replace(
          "[]",
          JSON.stringify(hello),
        ),
      ).maxTokens,
    ).toBe(9007199254740993n);
    const text = `{"model":"m","messages":${JSON.stringify(hello)},"max_completion_tokens":1e3,"max_tokens":5.0}`;
    expect(parseText(text)).toMatchObject({ maxCompletionTokens: 1000n, maxTokens: 5n });
  });

  it("rejects a body over the limit with request_too_large", () => {
    const raw = bytes(JSON.stringify(minimal));
    expect(() => parseChatRequest(raw, { maxBytes: raw.byteLength })).not.toThrow();
    let error: unknown;
    try {
      parseChatRequest(raw, { maxBytes: raw.byteLength - 1 });
    } catch (err) {
      error = err;
    }
    expect(error).toMatchObject({ code: "request_too_large" });
  });

  it("rejects what is not UTF-8 JSON with invalid_json", () => {
    rejects("", "invalid_json");
    rejects("{", "invalid_json");
    rejects("{'model': 'm'}", "invalid_json");
    rejects(new Uint8Array([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]), "invalid_json", "UTF-8");
    rejects(new Uint8Array([0xef, 0xbb, 0xbf, ...bytes(JSON.stringify(minimal))]), "invalid_json");
  });

  it("rejects a body that is not an object", () => {
    for (const body of ["[]", "null", "1", '"x"', "true"])
      rejects(body, "invalid_request", "object");
  });

  it("requires a non-empty string model", () => {
    rejects(JSON.stringify({ messages: hello }), "invalid_request", "'model'");
    rejects(withBody({ model: "" }), "invalid_request", "'model'");
    rejects(withBody({ model: 7 }), "invalid_request", "'model'");
    rejects(withBody({ model: null }), "invalid_request", "'model'");
  });

  it("requires at least one well-formed message", () => {
    rejects(JSON.stringify({ model: "m" }), "invalid_request", "'messages'");
    rejects(withBody({ messages: [] }), "invalid_request", "'messages'");
    rejects(withBody({ messages: {} }), "invalid_request", "'messages'");
    rejects(withBody({ messages: [...hello, "hi"] }), "invalid_request", "'messages[1]'");
    rejects(withBody({ messages: [null] }), "invalid_request", "'messages[0]'");
    rejects(withBody({ messages: [{ content: "x" }] }), "invalid_request", "'messages[0].role'");
    rejects(
      withBody({ messages: [{ role: "robot", content: "x" }] }),
      "invalid_request",
      "'messages[0].role'",
    );
    rejects(withBody({ messages: [{ role: "user" }] }), "invalid_request", "'messages[0].content'");
  });

  it("requires offer to be Hex32 (invalid_hex)", () => {
    rejects(withBody({ offer: "0x1234" }), "invalid_hex", "'offer'");
    rejects(withBody({ offer: `0x${"g".repeat(64)}` }), "invalid_hex", "'offer'");
    rejects(withBody({ offer: 5 }), "invalid_hex", "'offer'");
  });

  it("requires max_tokens and max_completion_tokens to be integers of at least 1", () => {
    for (const key of ["max_tokens", "max_completion_tokens"]) {
      for (const value of [0, -1, 1.5, "5", true, []]) {
        rejects(withBody({ [key]: value }), "invalid_request", `'${key}'`);
      }
      rejects(withBody({}).replace(/}$/, `,"${key}":1.0000000000000001}`), "invalid_request", key);
      rejects(withBody({}).replace(/}$/, `,"${key}":1e400}`), "invalid_request", key);
      rejects(withBody({}).replace(/}$/, `,"${key}":0e999999999}`), "invalid_request", key);
    }
  });

  it("refuses every body the schema refuses, with the code and the field named", () => {
    const ids = (n: number) => Array.from({ length: n }, () => offer);
    // [the body's extra members, or its whole text; the code; what the message names]
    const cases: [Record<string, unknown> | string, ErrorCode, string][] = [
      ["[]", "invalid_request", "the request body"],
      ['"x"', "invalid_request", "the request body"],
      [JSON.stringify({ messages: hello }), "invalid_request", "'model'"],
      [{ model: "" }, "invalid_request", "'model'"],
      [{ model: 7 }, "invalid_request", "'model'"],
      [{ model: null }, "invalid_request", "'model'"],
      [JSON.stringify({ model: "m" }), "invalid_request", "'messages'"],
      [{ messages: [] }, "invalid_request", "'messages'"],
      [{ messages: null }, "invalid_request", "'messages'"],
      [{ messages: "hi" }, "invalid_request", "'messages'"],
      [{ messages: [...hello, "hi"] }, "invalid_request", "'messages[1]'"],
      [{ messages: [{ content: "x" }] }, "invalid_request", "'messages[0].role'"],
      [{ messages: [{ role: "robot", content: "x" }] }, "invalid_request", "'messages[0].role'"],
      [{ messages: [{ role: null, content: "x" }] }, "invalid_request", "'messages[0].role'"],
      [{ messages: [...hello, { role: "user" }] }, "invalid_request", "'messages[1].content'"],
      [{ offer: "0x1234" }, "invalid_hex", "'offer'"],
      [{ offer: `0x${"g".repeat(64)}` }, "invalid_hex", "'offer'"],
      [{ offer: `${offer}00` }, "invalid_hex", "'offer'"],
      [{ offer: ["x"] }, "invalid_hex", "'offer'"],
      [{ provider: "fast" }, "invalid_request", "'provider'"],
      [{ provider: [] }, "invalid_request", "'provider'"],
      [{ provider: { quantizations: ["int8"] } }, "invalid_request", "'provider.quantizations'"],
      [{ provider: { data_collection: "deny" } }, "invalid_request", "'provider.data_collection'"],
      [{ provider: { order: offer } }, "invalid_request", "'provider.order'"],
      [{ provider: { order: ids(65) } }, "invalid_request", "'provider.order'"],
      [{ provider: { order: ["chat-eu"] } }, "invalid_request", "'provider.order[0]'"],
      [{ provider: { only: [offer, 5] } }, "invalid_request", "'provider.only[1]'"],
      [{ provider: { only: ids(65) } }, "invalid_request", "'provider.only'"],
      [{ provider: { ignore: [offer, null] } }, "invalid_request", "'provider.ignore[1]'"],
      [{ provider: { ignore: ids(65) } }, "invalid_request", "'provider.ignore'"],
      [{ provider: { allow_fallbacks: "no" } }, "invalid_request", "'provider.allow_fallbacks'"],
      [{ provider: { require_parameters: 1 } }, "invalid_request", "'provider.require_parameters'"],
      [{ provider: { sort: "cheapest" } }, "invalid_request", "'provider.sort'"],
      [{ provider: { sort: ["price"] } }, "invalid_request", "'provider.sort'"],
      [{ provider: { max_price: "1" } }, "invalid_request", "'provider.max_price'"],
      [
        { provider: { max_price: { request: "1" } } },
        "invalid_request",
        "'provider.max_price.request'",
      ],
      [
        { provider: { max_price: { prompt: 1 } } },
        "invalid_request",
        "'provider.max_price.prompt'",
      ],
      [
        { provider: { max_price: { prompt: "01" } } },
        "invalid_request",
        "'provider.max_price.prompt'",
      ],
      [
        { provider: { max_price: { completion: "-1" } } },
        "invalid_request",
        "'provider.max_price.completion'",
      ],
      [
        { provider: { max_price: { completion: "1.5" } } },
        "invalid_request",
        "'provider.max_price.completion'",
      ],
      [
        { provider: { max_price: { prompt: "1".repeat(79) } } },
        "invalid_request",
        "'provider.max_price.prompt'",
      ],
      [{ max_tokens: 0 }, "invalid_request", "'max_tokens'"],
      [{ max_tokens: "5" }, "invalid_request", "'max_tokens'"],
      [{ max_completion_tokens: -1 }, "invalid_request", "'max_completion_tokens'"],
      [{ max_completion_tokens: 1.5 }, "invalid_request", "'max_completion_tokens'"],
      [{ n: 0 }, "invalid_request", "'n' must be an integer from 1 to 128"],
      [{ n: 129 }, "invalid_request", "'n' must be an integer from 1 to 128"],
      [{ n: "2" }, "invalid_request", "'n' must be an integer from 1 to 128"],
      [{ best_of: 1.5 }, "invalid_request", "'best_of'"],
      [{ best_of: "1" }, "invalid_request", "'best_of'"],
      [{ temperature: "0.5" }, "invalid_request", "'temperature'"],
      [withBody({}).replace(/}$/, `,"temperature":1e400}`), "invalid_request", "'temperature'"],
      [{ top_p: true }, "invalid_request", "'top_p'"],
      [{ stop: 5 }, "invalid_request", "'stop'"],
      [{ stop: { x: "y" } }, "invalid_request", "'stop'"],
      [{ stop: ["a", 1] }, "invalid_request", "'stop[1]'"],
      [{ stream: "true" }, "invalid_request", "'stream'"],
      [{ stream: 1 }, "invalid_request", "'stream'"],
      [{ stream_options: "x" }, "invalid_request", "'stream_options'"],
      [{ stream_options: [] }, "invalid_request", "'stream_options'"],
      [
        { stream_options: { include_usage: "yes" } },
        "invalid_request",
        "'stream_options.include_usage'",
      ],
      [{ tools: {} }, "invalid_request", "'tools'"],
      [{ tools: "f" }, "invalid_request", "'tools'"],
      [{ seed: 1.5 }, "invalid_request", "'seed'"],
      [{ seed: "1" }, "invalid_request", "'seed'"],
      [{ user: 5 }, "invalid_request", "'user'"],
      [{ user: ["u"] }, "invalid_request", "'user'"],
    ];
    for (const [body, code, field] of cases) {
      rejects(typeof body === "string" ? body : withBody(body), code, field);
    }
  });

  it("refuses integers whose literal is not the integer the parse saw", () => {
    for (const key of ["max_tokens", "max_completion_tokens", "n", "seed"]) {
      rejects(
        withBody({}).replace(/}$/, `,"${key}":1.00000000000000001}`),
        "invalid_request",
        `'${key}'`,
      );
    }
    expect(parseText(withBody({}).replace(/}$/, `,"seed":12345678901234567890}`))).toBeDefined();
    expect(parseText(withBody({}).replace(/}$/, `,"seed":-4.0e1}`))).toBeDefined();
  });

  it("accepts what the schema allows around the typed members", () => {
    const req = parseBody({
      ...minimal,
      stop: "x",
      tool_choice: 5,
      response_format: "x",
      temperature: -1e300,
      stream: true,
      stream_options: { include_usage: null, continuous_usage_stats: true },
      provider: {},
    });
    expect(req).toMatchObject({ stream: true, includeUsage: false, toolChoice: 5 });
    expect(req.provider).toEqual({
      allowFallbacks: true,
      requireParameters: false,
      requireExactMetering: false,
      requireAudited: false,
    });
  });

  it("reads the provider object in routing's terms: lower-case ids, bigint prices, defaults", () => {
    const upper = offer.replace("ab", "AB");
    const ids = Array.from({ length: 64 }, () => upper);
    const top = "9".repeat(78);
    expect(
      parseBody({
        ...minimal,
        provider: {
          order: ids,
          only: [upper],
          ignore: [],
          allow_fallbacks: false,
          sort: "latency",
          max_price: { prompt: "0", completion: top },
          require_parameters: true,
          require_exact_metering: true,
        },
      }).provider,
    ).toEqual({
      order: ids.map(() => offer),
      only: [offer],
      ignore: [],
      allowFallbacks: false,
      sort: "latency",
      maxPrice: { prompt: 0n, completion: BigInt(top) },
      requireParameters: true,
      requireExactMetering: true,
      requireAudited: false,
    });
    // Null members are absent, as everywhere in the chat body.
    const nulls = { order: null, only: null, ignore: null, allow_fallbacks: null, sort: null };
    expect(
      parseBody({
        ...minimal,
        provider: {
          ...nulls,
          max_price: { prompt: null },
          require_parameters: null,
          require_exact_metering: null,
        },
      }).provider,
    ).toEqual({
      allowFallbacks: true,
      requireParameters: false,
      requireExactMetering: false,
      requireAudited: false,
      maxPrice: {},
    });
    expect(parseBody({ ...minimal, provider: null }).provider).toBeUndefined();
  });

  it("rejects a property given twice at the top level", () => {
    rejects(
      `{"model":"m","messages":${JSON.stringify(hello)},"stream":false,"stream":true}`,
      "invalid_request",
      "'stream'",
    );
    rejects(
      `{"model":"m","mod\\u0065l":"n","messages":${JSON.stringify(hello)}}`,
      "invalid_request",
      "'model'",
    );
    // Before the schema, which sees only the value JSON.parse kept (the last).
    rejects(
      `{"model":"m","messages":${JSON.stringify(hello)},"messages":[]}`,
      "invalid_request",
      "'messages' occurs more than once",
    );
  });

  it(`rejects nesting deeper than ${maxJsonDepth} levels`, () => {
    const nested = (depth: number) => "[".repeat(depth) + "]".repeat(depth);
    // The top-level object is one level; messages[0].content another two.
    expect(() =>
      parseText(withBody({}).replace(/}$/, `,"x":${nested(maxJsonDepth - 1)}}`)),
    ).not.toThrow();
    rejects(
      withBody({}).replace(/}$/, `,"x":${nested(maxJsonDepth)}}`),
      "invalid_request",
      "nested",
    );
    rejects(withBody({}).replace(/}$/, `,"x":${nested(100_000)}}`), "invalid_request", "nested");
  });

  it("bounds arrays and depth as configured, counting only JSON structure (not text in strings)", () => {
    const items = (n: number) => JSON.stringify(Array.from({ length: n }, () => 1));
    const parse = (text: string) =>
      parseChatRequest(bytes(text), { maxBytes, maxDepth: 4, maxArrayItems: 3 });
    expect(() => parse(withBody({}).replace(/}$/, `,"x":${items(3)}}`))).not.toThrow();
    expect(() => parse(withBody({}).replace(/}$/, `,"x":${items(4)}}`))).toThrow(
      /more than 3 items/,
    );
    // Objects' members are not array items; brackets and commas inside strings are text.
    expect(() =>
      parse(withBody({}).replace(/}$/, `,"o":{"a":1,"b":2,"c":3,"d":4},"s":"[[[[[,,,,\\"[,,"}`)),
    ).not.toThrow();
    expect(() => parse(withBody({}).replace(/}$/, `,"x":[[[[]]]]}`))).toThrow(/nested more than 4/);
  });
});

describe("exactInteger", () => {
  it("reads integer literals exactly and refuses fractions", () => {
    expect(exactInteger("12")).toBe(12n);
    expect(exactInteger("-4")).toBe(-4n);
    expect(exactInteger("0")).toBe(0n);
    expect(exactInteger("0.0")).toBe(0n);
    expect(exactInteger("1.50e1")).toBe(15n);
    expect(exactInteger("12345678901234567890")).toBe(12345678901234567890n);
    expect(exactInteger("1E+2")).toBe(100n);
    expect(exactInteger("100e-2")).toBe(1n);
    expect(exactInteger("1.5")).toBeUndefined();
    expect(exactInteger("15e-1")).toBeUndefined();
    expect(exactInteger("x")).toBeUndefined();
    expect(exactInteger("0e999999999")).toBe(0n);
    expect(exactInteger("-0.000e99999")).toBe(0n);
    expect(exactInteger("1e999999999")).toBeUndefined();
    expect(exactInteger("1e308")).toBe(10n ** 308n);
  });
});

describe("n (choices)", () => {
  it("is 1 when absent or null, else the integer given, up to the documented bound of 128", () => {
    expect(maxChoices).toBe(128n);
    expect(parseBody(minimal).choices).toBe(1n);
    expect(parseBody({ ...minimal, n: null }).choices).toBe(1n);
    expect(parseBody({ ...minimal, n: 8 }).choices).toBe(8n);
    expect(parseText(withBody({}).replace("{", '{"n":8.0,')).choices).toBe(8n);
    expect(parseBody({ ...minimal, n: 128 }).choices).toBe(128n);
  });

  it("refuses 0, negatives, fractions, non-numbers and anything above 128 with invalid_request", () => {
    for (const n of [0, -1, 1.5, 129, 1e9, "8", true, [8], { n: 8 }]) {
      rejects(withBody({ n }), "invalid_request", "'n' must be an integer from 1 to 128");
    }
    rejects(withBody({}).replace("{", '{"n":1e400,'), "invalid_request", "'n'");
  });

  it("refuses best_of unless it asks for exactly the n choices returned", () => {
    for (const body of [{ best_of: 2 }, { n: 2, best_of: 4 }, { best_of: 1.5 }, { best_of: "1" }]) {
      rejects(withBody(body), "invalid_request", "'best_of'");
    }
    expect(parseBody({ ...minimal, best_of: 1 }).choices).toBe(1n);
    expect(parseBody({ ...minimal, n: 3, best_of: 3 }).choices).toBe(3n);
    expect(parseBody({ ...minimal, best_of: null }).choices).toBe(1n);
  });
});

describe("outputBound", () => {
  it("is the output limit once per choice", () => {
    const caps = { max_output_tokens: 2048 };
    expect(outputBound(parseBody({ ...minimal, max_tokens: 5 }), caps)).toBe(5n);
    expect(outputBound(parseBody({ ...minimal, max_tokens: 5, n: 8 }), caps)).toBe(40n);
    expect(outputBound(parseBody({ ...minimal, n: 3 }), caps)).toBe(6144n);
    expect(outputBound(parseBody({ ...minimal, n: 2 }), {})).toBe(2n * defaultOutputLimit);
  });
});

describe("outputLimit", () => {
  const caps = { max_output_tokens: 2048 };
  it("prefers max_completion_tokens, then max_tokens, then the offer's capability", () => {
    expect(
      outputLimit(parseBody({ ...minimal, max_tokens: 5, max_completion_tokens: 7 }), caps),
    ).toBe(7n);
    expect(outputLimit(parseBody({ ...minimal, max_tokens: 5 }), caps)).toBe(5n);
    expect(outputLimit(parseBody(minimal), caps)).toBe(2048n);
  });

  it("falls back to the default when the capability is missing or not a positive integer", () => {
    for (const value of [undefined, 0, -5, 1.5, "2048", null]) {
      expect(outputLimit(parseBody(minimal), { max_output_tokens: value })).toBe(
        defaultOutputLimit,
      );
    }
    expect(defaultOutputLimit).toBe(4096n);
  });
});

describe("inputTokenUpperBound", () => {
  const length = (value: unknown) => BigInt(enc.encode(JSON.stringify(value)).byteLength);

  it("follows the documented formula", () => {
    const messages = [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Grüße, 世界! 🌍" },
    ];
    expect(inputTokenUpperBound(parseBody({ model: "m", messages }))).toBe(
      length(messages) + 2n * perMessageTokenAllowance + fixedTokenAllowance,
    );
    const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];
    const schema = { type: "json_schema", json_schema: { name: "x" } };
    const req = parseBody({
      model: "m",
      messages,
      tools,
      tool_choice: "auto",
      response_format: schema,
    });
    expect(inputTokenUpperBound(req)).toBe(
      length(messages) +
        2n * (length(tools) + length("auto") + length(schema)) +
        2n * perMessageTokenAllowance +
        fixedTokenAllowance,
    );
  });

  it("adds the media allowance per non-text content part", () => {
    const messages = [
      {
        role: "user",
        content: [
          { type: "text", text: "what is this?" },
          { type: "image_url", image_url: { url: "https://x/y.png" } },
          { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } },
        ],
      },
    ];
    expect(inputTokenUpperBound(parseBody({ model: "m", messages }))).toBe(
      length(messages) +
        perMessageTokenAllowance +
        2n * mediaPartTokenAllowance +
        fixedTokenAllowance,
    );
  });

  it("is at least the UTF-8 bytes of all message text (each token covers at least one byte)", () => {
    fc.assert(
      fc.property(
        fc.array(fc.string({ unit: "binary", maxLength: 64 }), { minLength: 1, maxLength: 5 }),
        (texts) => {
          const req = parseBody({
            model: "m",
            messages: texts.map((content) => ({ role: "user", content })),
          });
          const textBytes = texts.reduce((n, t) => n + BigInt(enc.encode(t).byteLength), 0n);
          expect(
            inputTokenUpperBound(req) >=
              textBytes + perMessageTokenAllowance * BigInt(texts.length),
          ).toBe(true);
        },
      ),
    );
  });
});

describe("the request's fingerprint", () => {
  const base = {
    model: "demo-chat",
    messages: [
      { role: "system", content: "s" },
      { role: "user", content: [{ type: "text", text: "hi" }], name: "n" },
    ],
    max_tokens: 100,
    tools: [{ type: "function", function: { name: "f", parameters: { a: 1, b: [1, 2] } } }],
    tool_choice: { type: "function", function: { name: "f" } },
    response_format: { type: "json_object" },
  };
  const fp = (body: unknown) => parseBody(body).fingerprint;

  it("is a sha256 hex digest", () => {
    expect(fp(base)).toMatch(/^[0-9a-f]{64}$/);
  });

  it("does not depend on key order or whitespace, at any depth", () => {
    const reordered = `{
      "response_format": {"type": "json_object"},
      "tool_choice": {"function": {"name": "f"}, "type": "function"},
      "tools": [{"function": {"parameters": {"b": [1, 2], "a": 1}, "name": "f"}, "type": "function"}],
      "max_tokens": 100,
      "messages": [{"content": "s", "role": "system"}, {"name": "n", "content": [{"text": "hi", "type": "text"}], "role": "user"}],
      "model": "demo-chat"
    }`;
    expect(parseText(reordered).fingerprint).toBe(fp(base));
  });

  it("changes when any of the seven fields changes", () => {
    const variants: Record<string, unknown>[] = [
      { model: "demo-coder" },
      { n: 2 },
      { n: 8 },
      { messages: [...base.messages, { role: "user", content: "more" }] },
      { messages: [{ role: "system", content: "S" }, base.messages[1]] },
      { messages: [{ role: "developer", content: "s" }, base.messages[1]] },
      { max_tokens: 101 },
      { max_tokens: undefined },
      { max_completion_tokens: 50 },
      { tools: [] },
      { tools: undefined },
      { tools: [{ type: "function", function: { name: "f", parameters: { a: 2, b: [1, 2] } } }] },
      { tool_choice: "auto" },
      { tool_choice: undefined },
      { response_format: { type: "text" } },
      { response_format: undefined },
    ];
    const seen = new Set([fp(base)]);
    for (const change of variants) {
      const value = fp({ ...base, ...change });
      expect(seen.has(value), JSON.stringify(change)).toBe(false);
      seen.add(value);
    }
  });

  it("binds the output limit, not how it was spelled", () => {
    const { max_tokens: _, ...rest } = base;
    expect(fp({ ...rest, max_completion_tokens: 100 })).toBe(fp(base));
    expect(fp({ ...base, max_completion_tokens: 100 })).toBe(fp(base));
  });

  it("binds n, not how it was spelled: absent, null and 1 are the same one choice", () => {
    expect(fp({ ...base, n: 1 })).toBe(fp(base));
    expect(fp({ ...base, n: null })).toBe(fp(base));
    expect(fp({ ...base, n: 8 })).not.toBe(fp(base));
  });

  it("ignores fields outside the seven", () => {
    expect(
      fp({ ...base, temperature: 1, stream: true, user: "u", offer, seed: 1, extra: { x: 1 } }),
    ).toBe(fp(base));
  });

  it("distinguishes output limits beyond 2^53", () => {
    const text = (n: string) =>
      `{"model":"m","messages":${JSON.stringify(hello)},"max_tokens":${n}}`;
    expect(parseText(text("9007199254740993")).fingerprint).not.toBe(
      parseText(text("9007199254740992")).fingerprint,
    );
  });
});

describe("canonicalJson", () => {
  it("writes strings as JSON.stringify does", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary", maxLength: 40 }), (text) => {
        expect(canonicalJson(text)).toBe(JSON.stringify(text));
      }),
    );
  });

  it("is a compact serialisation of the same value", () => {
    fc.assert(
      fc.property(fc.jsonValue({ noUnicodeString: false }), (value) => {
        const canonical = canonicalJson(value);
        expect(canonical.length).toBe(JSON.stringify(value).length);
        expect(JSON.parse(canonical)).toEqual(JSON.parse(JSON.stringify(value)));
      }),
    );
  });

  it("sorts keys recursively and writes no whitespace", () => {
    expect(canonicalJson({ b: [{ d: 1, c: "é" }], a: null, n: 10n })).toBe(
      '{"a":null,"b":[{"c":"é","d":1}],"n":10}',
    );
  });
});

/** The body sent for a request, with the limit priced for an offer without capabilities. */
const upstreamBytes = (req: ChatRequest): Uint8Array => upstreamBody(req, outputLimit(req, {}));
/** The members the schema types (a random value would fail it). */
const typedKeys = Object.keys(ChatRequestSchema.properties);
/** A body's members as the provider receives them: the allowlist's. */
const onlyForwarded = (body: Record<string, unknown>): Record<string, unknown> =>
  Object.fromEntries(Object.entries(body).filter(([key]) => forwardedMembers.includes(key)));

describe("upstreamBody", () => {
  // Carries its limit: these tests are about the other edits.
  const bigSeed = `{"model":"m","seed":12345678901234567890,"messages":${JSON.stringify(hello)},"max_tokens":7,"logit_bias":{"k":[1,2.50,1e2]}`;

  it("returns the raw bytes unchanged when not streaming", () => {
    const req = parseText(`${bigSeed}}`);
    expect(upstreamBytes(req)).toBe(req.raw);
  });

  it("returns the raw bytes unchanged when the client already asks for usage", () => {
    const req = parseText(`${bigSeed},"stream":true,"stream_options":{"include_usage":true}}`);
    expect(upstreamBytes(req)).toBe(req.raw);
  });

  it("inserts stream_options after the opening brace, keeping every other byte", () => {
    const text = `  \n${bigSeed},"stream":true}`;
    const out = dec.decode(upstreamBytes(parseText(text)));
    expect(out).toBe(
      `  \n{"stream_options":{"include_usage":true},${bigSeed.slice(1)},"stream":true}`,
    );
    expect(out).toContain('"seed":12345678901234567890');
    expect(out).toContain('"logit_bias":{"k":[1,2.50,1e2]}');
  });

  it("replaces stream_options: null", () => {
    const text = `${bigSeed},"stream":true,"stream_options" : null }`;
    expect(dec.decode(upstreamBytes(parseText(text)))).toBe(
      `${bigSeed},"stream":true,"stream_options" : {"include_usage":true} }`,
    );
  });

  it("sets include_usage inside an existing stream_options, keeping its other members", () => {
    const cases: [string, string][] = [
      [`{}`, `{"include_usage":true}`],
      [`{ }`, `{"include_usage":true }`],
      [`{"include_usage":false}`, `{"include_usage":true}`],
      [
        `{"include_usage": null, "n": 98765432109876543210}`,
        `{"include_usage": true, "n": 98765432109876543210}`,
      ],
      [`{"continuous_usage_stats":true}`, `{"include_usage":true,"continuous_usage_stats":true}`],
    ];
    for (const [before, after] of cases) {
      const text = `${bigSeed},"stream":true,"stream_options":${before}}`;
      expect(dec.decode(upstreamBytes(parseText(text)))).toBe(
        `${bigSeed},"stream":true,"stream_options":${after}}`,
      );
    }
  });

  it("is not fooled by strings that look like stream_options", () => {
    const messages = [
      { role: "user", content: 'say "stream_options":{"include_usage":false} \\" {' },
    ];
    const text = `{"messages":${JSON.stringify(messages)},"model":"m","stream":true,"stre\\u0061m_options":{"x":"}\\\\"}}`;
    const out = JSON.parse(dec.decode(upstreamBytes(parseText(text)))) as Record<string, unknown>;
    expect(out).toEqual({
      max_tokens: 4096,
      messages,
      model: "m",
      stream: true,
      stream_options: { include_usage: true, x: "}\\" },
    });
  });

  it("changes nothing but stream_options.include_usage, for any body", () => {
    const knownKeys = [
      ...["model", "messages", "offer", "max_tokens", "max_completion_tokens", "temperature"],
      ...["top_p", "stop", "stream", "tools", "tool_choice", "response_format", "seed", "user"],
      ...["stream_options", "n", "best_of", "provider", "__proto__"],
    ];
    const extra = fc.dictionary(
      fc.string().filter((k) => !knownKeys.includes(k) && !typedKeys.includes(k)),
      fc.jsonValue(),
    );
    const streamOptions = fc.option(
      fc.record(
        { include_usage: fc.option(fc.boolean()), other: fc.jsonValue() },
        { requiredKeys: [] },
      ),
    );
    fc.assert(
      fc.property(extra, streamOptions, fc.boolean(), (rest, so, pretty) => {
        const body: Record<string, unknown> = {
          ...rest,
          model: "m",
          messages: hello,
          max_tokens: 3,
          stream: true,
        };
        if (so !== null) body["stream_options"] = so;
        const text = JSON.stringify(body, null, pretty ? 2 : undefined);
        const out = JSON.parse(dec.decode(upstreamBytes(parseText(text)))) as Record<
          string,
          unknown
        >;
        const soOut = out["stream_options"] as Record<string, unknown>;
        expect(soOut["include_usage"]).toBe(true);
        const { stream_options: _a, ...restOut } = out;
        const { stream_options: soIn, ...restIn } = JSON.parse(text) as Record<string, unknown>;
        expect(restOut).toEqual(onlyForwarded(restIn));
        const { include_usage: _c, ...soRest } = soOut;
        // Compared with the input as JSON reads it (fast-check's -0 is written as 0).
        const { include_usage: _d, ...soInRest } = (soIn ?? {}) as Record<string, unknown>;
        expect(soRest).toEqual(soInRest);
      }),
    );
  });
});

describe("upstreamBody: the gateway's own members stay with the gateway", () => {
  // The messages, then the limit: these tests are about the cuts.
  const msgs = `${JSON.stringify(hello)},"max_tokens":7`;
  const pin = `"offer":"${offer}"`;
  const prefs = `"provider":{"order":["${offer}"],"sort":"price","max_price":{"prompt":"1"}}`;
  const upstream = (text: string): string => dec.decode(upstreamBytes(parseText(text)));

  it("cuts offer and provider out, wherever they are, keeping every other byte", () => {
    const cases: [string, string][] = [
      // first, middle, last; alone and side by side; with white space around them
      [`{${pin},"model":"m","messages":${msgs}}`, `{"model":"m","messages":${msgs}}`],
      [`{"model":"m",${prefs},"messages":${msgs}}`, `{"model":"m","messages":${msgs}}`],
      [`{"model":"m","messages":${msgs},${pin}}`, `{"model":"m","messages":${msgs}}`],
      [`{${pin},${prefs},"model":"m","messages":${msgs}}`, `{"model":"m","messages":${msgs}}`],
      [`{"model":"m","messages":${msgs},${prefs},${pin}}`, `{"model":"m","messages":${msgs}}`],
      [`{${prefs},"model":"m","messages":${msgs},${pin}}`, `{"model":"m","messages":${msgs}}`],
      [
        `{\n  ${pin},\n  "model": "m",\n  ${prefs} ,\n  "messages": ${msgs}\n}`,
        `{\n  "model": "m",\n  "messages": ${msgs}\n}`,
      ],
      [
        `\t{ "model" : "m" , "messages" : ${msgs} , "offer" : null , "provider" : null }\n`,
        `\t{ "model" : "m" , "messages" : ${msgs} }\n`,
      ],
      // an escaped key is the same key to the provider's parser
      [
        `{"model":"m","offe\\u0072":"${offer}","messages":${msgs}}`,
        `{"model":"m","messages":${msgs}}`,
      ],
    ];
    for (const [before, after] of cases) {
      expect(upstream(before), before).toBe(after);
    }
  });

  it("keeps members named offer or provider below the top level", () => {
    const messages = [{ role: "user", content: "x", offer: 1, provider: { only: [] } }];
    const text = `{"model":"m","messages":${JSON.stringify(messages)},"logit_bias":{"offer":"${offer}"},"seed":12345678901234567890,"max_tokens":9,${pin}}`;
    expect(upstream(text)).toBe(
      `{"model":"m","messages":${JSON.stringify(messages)},"logit_bias":{"offer":"${offer}"},"seed":12345678901234567890,"max_tokens":9}`,
    );
  });

  it("also cuts them from a stream whose body gains stream_options", () => {
    expect(upstream(`{${pin},"model":"m","stream":true,"messages":${msgs}}`)).toBe(
      `{"stream_options":{"include_usage":true},"model":"m","stream":true,"messages":${msgs}}`,
    );
    expect(
      upstream(`{"model":"m",${prefs},"stream":true,"stream_options":null,"messages":${msgs}}`),
    ).toBe(
      `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":${msgs}}`,
    );
    expect(
      upstream(
        `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":${msgs},${pin}}`,
      ),
    ).toBe(
      `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":${msgs}}`,
    );
  });

  it("returns the very bytes when there is nothing to cut or add", () => {
    const req = parseText(`{"model":"m","messages":${msgs},"user":"${offer}"}`);
    expect(upstreamBytes(req)).toBe(req.raw);
  });

  it("is the body without offer and provider, byte for byte, for any body and any placement", () => {
    // Forwarded members the schema does not type, with any value.
    const extra = fc.dictionary(
      fc.constantFrom(...forwardedMembers.filter((k) => !typedKeys.includes(k))),
      fc.jsonValue(),
    );
    const gateway = fc.record(
      {
        offer: fc.constantFrom(offer, null),
        provider: fc.constantFrom(null, {}, { only: [offer], sort: "latency" }),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(
        extra,
        gateway,
        fc.tuple(fc.nat(), fc.nat()),
        fc.boolean(),
        fc.boolean(),
        (rest, ours, places, stream, pretty) => {
          const client: [string, unknown][] = [
            ...Object.entries(rest),
            ["model", "m"],
            ["messages", hello],
            ["max_tokens", 3],
          ];
          if (stream) client.push(["stream", true]);
          const all = [...client];
          Object.entries(ours).forEach((entry, i) =>
            all.splice(places[i]! % (all.length + 1), 0, entry),
          );
          const indent = pretty ? 2 : undefined;
          const text = JSON.stringify(Object.fromEntries(all), null, indent);
          const out = dec.decode(upstreamBytes(parseText(text)));
          const expected = Object.fromEntries(client);
          if (!stream) expect(out).toBe(JSON.stringify(expected, null, indent));
          else {
            expect(JSON.parse(out)).toEqual({
              ...(JSON.parse(JSON.stringify(expected)) as object),
              stream_options: { include_usage: true },
            });
          }
        },
      ),
    );
  });
});

describe("upstreamBody: the provider's limit is the priced limit", () => {
  const msgs = `"messages":${JSON.stringify(hello)}`;
  const send = (text: string, limit: bigint): string =>
    dec.decode(upstreamBody(parseText(text), limit));

  it("adds max_tokens right after the opening brace when the body sets no limit", () => {
    expect(send(` {"model":"m",${msgs}}`, 4096n)).toBe(` {"max_tokens":4096,"model":"m",${msgs}}`);
    // with the stream's usage, in one insertion
    expect(send(`{"model":"m",${msgs},"stream":true}`, 300n)).toBe(
      `{"max_tokens":300,"stream_options":{"include_usage":true},"model":"m",${msgs},"stream":true}`,
    );
    // beyond 2^53, exactly
    expect(send(`{"model":"m",${msgs}}`, 2n ** 70n)).toBe(
      `{"max_tokens":1180591620717411303424,"model":"m",${msgs}}`,
    );
  });

  it("keeps a limit at or below the priced one byte for byte, and lowers one above it", () => {
    for (const key of ["max_tokens", "max_completion_tokens"]) {
      const at = parseText(`{"model":"m",${msgs},"${key}" : 1e1 }`);
      expect(upstreamBody(at, 10n)).toBe(at.raw);
      expect(upstreamBody(at, 11n)).toBe(at.raw);
      expect(send(`{"model":"m",${msgs},"${key}" : 1e1 }`, 9n)).toBe(
        `{"model":"m",${msgs},"${key}" : 9 }`,
      );
      expect(send(`{"model":"m","${key}":null,${msgs}}`, 64n)).toBe(
        `{"model":"m","${key}":64,${msgs}}`,
      );
    }
    // both given: each is held to the limit (max_completion_tokens is the priced one)
    expect(send(`{"model":"m",${msgs},"max_tokens":900,"max_completion_tokens":20}`, 20n)).toBe(
      `{"model":"m",${msgs},"max_tokens":20,"max_completion_tokens":20}`,
    );
    expect(send(`{"model":"m",${msgs},"max_tokens":5,"max_completion_tokens":20}`, 20n)).toBe(
      `{"model":"m",${msgs},"max_tokens":5,"max_completion_tokens":20}`,
    );
    // an escaped key is the same key to the provider's parser
    expect(send(`{"model":"m",${msgs},"max_toke\\u006es":500}`, 50n)).toBe(
      `{"model":"m",${msgs},"max_toke\\u006es":50}`,
    );
  });

  it("sends the priced limit for any body: the limits it has, else max_tokens", () => {
    const extra = fc.dictionary(
      fc.constantFrom(...forwardedMembers.filter((k) => !typedKeys.includes(k))),
      fc.jsonValue(),
    );
    const limits = fc.record(
      {
        max_tokens: fc.option(fc.integer({ min: 1, max: 1000 })),
        max_completion_tokens: fc.option(fc.integer({ min: 1, max: 1000 })),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(extra, limits, fc.boolean(), fc.boolean(), (rest, given, stream, pretty) => {
        const body = { ...rest, model: "m", messages: hello, ...given, stream };
        const req = parseText(JSON.stringify(body, null, pretty ? 2 : undefined));
        const limit = outputLimit(req, { max_output_tokens: 77 });
        const out = JSON.parse(dec.decode(upstreamBody(req, limit))) as Record<string, unknown>;
        const expected: Record<string, unknown> = JSON.parse(JSON.stringify(body)) as Record<
          string,
          unknown
        >;
        const keys = Object.keys(given);
        if (keys.length === 0) expected["max_tokens"] = 77;
        for (const key of keys) {
          const value = given[key as keyof typeof given];
          expected[key] = value === null || value! > limit ? Number(limit) : value;
        }
        if (stream) expected["stream_options"] = { include_usage: true };
        expect(out).toEqual(expected);
        const sent = (out["max_completion_tokens"] ?? out["max_tokens"]) as number;
        expect(BigInt(sent)).toBe(limit);
      }),
    );
  });
});

describe("servers' own length controls", () => {
  const controls = [
    "n_predict",
    "num_predict",
    "min_tokens",
    "ignore_eos",
    "min_new_tokens",
    "max_new_tokens",
    "max_length",
    "min_length",
  ];

  it("are refused, naming the field, whatever their value", () => {
    for (const key of controls) {
      for (const value of [1, 100000, -1, 0, true, "5", { n: 1 }]) {
        rejects(withBody({ max_tokens: 8, [key]: value }), "invalid_request", `'${key}'`);
      }
    }
    let error: unknown;
    try {
      parseBody({ ...minimal, n_predict: 5000 });
    } catch (err) {
      error = err;
    }
    expect((error as GatewayError).message).toBe(
      "'n_predict' is llama.cpp's output length control, which would let the provider generate beyond the priced output limit: leave it out and set max_tokens or max_completion_tokens",
    );
  });

  it("are accepted as null or false, and never reach the provider", () => {
    const msgs = `"messages":${JSON.stringify(hello)}`;
    for (const key of controls) {
      for (const value of ["null", "false"]) {
        const req = parseText(`{"${key}":${value},"model":"m",${msgs},"max_tokens":3}`);
        expect(dec.decode(upstreamBody(req, 3n))).toBe(`{"model":"m",${msgs},"max_tokens":3}`);
      }
    }
    const all = controls
      .filter((key) => key !== "ignore_eos")
      .map((key) => `"${key}" : null`)
      .join(" , ");
    const req = parseText(`{"model":"m", ${all} ,${msgs}, "ignore_eos": false}`);
    expect(dec.decode(upstreamBody(req, 4n))).toBe(`{"max_tokens":4,"model":"m", ${msgs}}`);
  });
});

describe("the request's fingerprint and canonicalJson agree", () => {
  it("hashes the canonical JSON of the seven fields", async () => {
    const { createHash } = await import("node:crypto");
    const body = {
      model: "m",
      messages: [{ role: "user", content: "hi", z: 1, a: [{ y: 2, b: null }] }],
      max_completion_tokens: 9,
      n: 3,
      tools: [{ b: 1, a: 2 }],
      tool_choice: "auto",
    };
    const req = parseBody(body);
    const canonical = canonicalJson({
      model: body.model,
      messages: body.messages,
      n: 3n,
      output_limit: 9n,
      tools: body.tools,
      tool_choice: body.tool_choice,
      response_format: null,
    });
    expect(req.fingerprint).toBe(createHash("sha256").update(canonical).digest("hex"));
  });
});

describe("what reaches the provider: an allowlist (issue 35, item 8)", () => {
  const msgs = `"messages":${JSON.stringify(hello)}`;
  const send = (text: string): string => dec.decode(upstreamBody(parseText(text), 5n));

  it("cuts every member outside the allowlist, unknown ones included, keeping the rest's bytes", () => {
    const text = `{"model":"m",${msgs},"max_tokens":5,"stop_token_ids":[7],"reasoning":{"exclude":true},"skip_special_tokens":false,"top_k":40,"x":1e2}`;
    expect(send(text)).toBe(`{"model":"m",${msgs},"max_tokens":5,"top_k":40}`);
  });

  it("forwards the allowlist's members for any body, and nothing else", () => {
    const unknown = fc.dictionary(
      fc.string().filter((k) => !typedKeys.includes(k) && !forwardedMembers.includes(k)),
      fc.jsonValue(),
    );
    const allowed = fc.dictionary(
      fc.constantFrom(...forwardedMembers.filter((k) => !typedKeys.includes(k))),
      fc.jsonValue(),
    );
    fc.assert(
      fc.property(unknown, allowed, fc.boolean(), (rest, kept, pretty) => {
        const body = { ...rest, ...kept, model: "m", messages: hello, max_tokens: 5 };
        const text = JSON.stringify(body, null, pretty ? 2 : undefined);
        const out = JSON.parse(send(text)) as Record<string, unknown>;
        expect(out).toEqual(onlyForwarded(JSON.parse(text) as Record<string, unknown>));
        for (const key of Object.keys(out)) expect(forwardedMembers).toContain(key);
      }),
    );
  });

  it("refuses, naming it, a member that makes the provider count what the client never sees", () => {
    const cases: [string, unknown][] = [
      ["include_reasoning", false],
      ["chat_template", "{{ messages }}"],
      ["documents", [{ title: "t", text: "x" }]],
      ["documents", []],
      ["mm_processor_kwargs", { num_crops: 16 }],
      ["add_special_tokens", true],
      ["add_generation_prompt", false],
      ["continue_final_message", true],
      ["echo", true],
      ["return_tokens_as_token_ids", true],
      ["functions", [{ name: "f", parameters: {} }]],
      ["function_call", "auto"],
    ];
    for (const [key, value] of cases) {
      rejects(withBody({ [key]: value }), "invalid_request", `'${key}' is not forwarded`);
    }
  });

  it("accepts those members at the values that change nothing, and cuts them", () => {
    for (const [key, { accepted }] of Object.entries(countingControls)) {
      for (const value of accepted) {
        const text = `{"model":"m","${key}":${JSON.stringify(value)},${msgs},"max_tokens":5}`;
        expect(send(text), text).toBe(`{"model":"m",${msgs},"max_tokens":5}`);
      }
    }
  });

  it("forwards chat_template_kwargs, but not one that sets the server's own template variables", () => {
    const text = `{"model":"m",${msgs},"max_tokens":5,"chat_template_kwargs":{"enable_thinking":false}}`;
    expect(send(text)).toBe(text);
    for (const key of ["add_generation_prompt", "messages", "tools", "bos_token", "documents"]) {
      rejects(
        withBody({ chat_template_kwargs: { [key]: false } }),
        "invalid_request",
        `'chat_template_kwargs.${key}'`,
      );
    }
  });
});

describe("stop is bounded (issue 35, item 8)", () => {
  const long = "x".repeat(maxStopLength);

  it(`takes up to ${maxStopStrings} strings of up to ${maxStopLength} characters, as a list`, () => {
    expect(parseBody(minimal).stop).toEqual([]);
    expect(parseBody({ ...minimal, stop: null }).stop).toEqual([]);
    expect(parseBody({ ...minimal, stop: "END" }).stop).toEqual(["END"]);
    const four = Array.from({ length: maxStopStrings }, (_, i) => `${long.slice(1)}${i}`);
    expect(parseBody({ ...minimal, stop: four }).stop).toEqual(four);
    // characters, not UTF-16 units: 64 emoji are 64 characters
    expect(parseBody({ ...minimal, stop: "😀".repeat(maxStopLength) }).stop).toHaveLength(1);
  });

  it("refuses more strings, or a longer one, naming stop", () => {
    const five = Array.from({ length: maxStopStrings + 1 }, (_, i) => `s${i}`);
    for (const stop of [five, `${long}x`, ["a", `${long}x`], [1]]) {
      rejects(withBody({ stop }), "invalid_request", "'stop");
    }
    let error: unknown;
    try {
      parseBody({ ...minimal, stop: five });
    } catch (err) {
      error = err;
    }
    expect((error as GatewayError).message).toContain("the client never sees");
  });
});
