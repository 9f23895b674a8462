import { createServer, type RequestListener, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "../../../test/helpers/fake-upstream.js";
import { inputTokenUpperBound, parseChatRequest } from "../../domain/chat/request/index.js";
import type { EndpointVerification } from "../../domain/health-types.js";
import { boundCounter, type TokenCounter, type TokenCounters } from "../../domain/tokens.js";
import { createUpstreamClient, type UpstreamClient } from "./http.js";
import { countingMaxTokens, createEndpointProber, probeLiveness, verifyEndpoint } from "./probe.js";

const modelId = `0x${"ab".repeat(32)}`;
const names = ["acme/llama", modelId];
const token = "tok-verify-secret";

let upstream: UpstreamClient;
const fakes: FakeUpstream[] = [];
const servers: Server[] = [];

beforeAll(() => {
  upstream = createUpstreamClient({ allowPrivate: true });
});

afterAll(async () => {
  await upstream.close();
});

afterEach(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.stop()));
  await Promise.all(
    servers.splice(0).map((s) => {
      s.closeAllConnections();
      return new Promise((r) => s.close(r));
    }),
  );
});

async function fake(opts: Parameters<typeof startFakeUpstream>[0] = {}): Promise<FakeUpstream> {
  const f = await startFakeUpstream({ models: ["acme/llama"], token, ...opts });
  fakes.push(f);
  return f;
}

async function listen(handler: RequestListener): Promise<string> {
  const server = createServer(handler);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function expectSafe(result: EndpointVerification, url: string): void {
  if (result.ok) return;
  expect(result.message).not.toContain(url);
  expect(result.message).not.toContain(new URL(url).port);
  expect(result.message).not.toContain(token);
}

describe("probeLiveness", () => {
  it("is true while the provider answers and false once it stopped", async () => {
    const f = await fake();
    expect(await probeLiveness(upstream, { url: f.url, token })).toBe(true);
    expect(await probeLiveness(upstream, { url: f.url, token: "wrong" })).toBe(false);
    await f.stop();
    expect(await probeLiveness(upstream, { url: f.url, token })).toBe(false);
  });

  it("is false when the provider does not answer in time", async () => {
    const url = await listen(() => {
      // never answers
    });
    const started = Date.now();
    expect(await probeLiveness(upstream, { url }, { livenessTimeoutMs: 150 })).toBe(false);
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it("is false for a refused endpoint", async () => {
    const strict = createUpstreamClient({ allowPrivate: false });
    try {
      const f = await fake();
      expect(await probeLiveness(strict, { url: f.url, token })).toBe(false);
      expect(f.requests).toHaveLength(0);
    } finally {
      await strict.close();
    }
  });
});

describe("verifyEndpoint", () => {
  it("passes a conforming provider, asking for one token with usage", async () => {
    const f = await fake();
    const prober = createEndpointProber(upstream);
    expect(await prober.verifyEndpoint({ url: f.url, token }, names)).toEqual({
      ok: true,
      features: ["stream_usage", "json_schema"],
      unanswered: [],
    });
    const chats = f.requests.filter((r) => r.path === "/v1/chat/completions");
    expect(chats.map((r) => r.body)).toMatchObject([
      { model: "acme/llama", max_tokens: 1, stream: false },
      { model: "acme/llama", max_tokens: 1, stream: true, stream_options: { include_usage: true } },
      { model: "acme/llama", max_tokens: countingMaxTokens, stream: false },
      {
        model: "acme/llama",
        max_tokens: countingMaxTokens,
        stream: true,
        stream_options: { include_usage: true },
      },
      { model: "acme/llama", tool_choice: { type: "function", function: { name: "get_weather" } } },
      { model: "acme/llama", response_format: { type: "json_schema" } },
      { model: "acme/llama", logprobs: true, top_logprobs: 5, temperature: 0, stream: false },
    ]);
    expect(f.requests.every((r) => r.headers.authorization === `Bearer ${token}`)).toBe(true);
  });

  it("matches the model by ModelID in any hex case", async () => {
    const f = await fake({ models: ["other", modelId.toUpperCase().replace("0X", "0x")] });
    expect(await verifyEndpoint(upstream, { url: f.url, token }, names)).toMatchObject({
      ok: true,
    });
    expect(f.requests.at(-1)?.body).toMatchObject({
      model: modelId.toUpperCase().replace("0X", "0x"),
    });
  });

  it("proves tools and JSON-schema output only where the provider answers them, without failing the run", async () => {
    const verify = async (opts: Parameters<typeof startFakeUpstream>[0]) =>
      verifyEndpoint(upstream, { url: (await fake(opts)).url, token }, names);
    expect(await verify({ toolCalls: true })).toEqual({
      ok: true,
      features: ["stream_usage", "tools", "json_schema"],
      unanswered: [],
    });
    expect(await verify({ toolCalls: true, jsonSchema: false })).toEqual({
      ok: true,
      features: ["stream_usage", "tools"],
      unanswered: [],
    });
    // A tool call whose arguments are not JSON proves nothing.
    expect(await verify({ toolCalls: true, toolArguments: "{city" })).toMatchObject({
      features: ["stream_usage", "json_schema"],
    });
  });

  it.each<[string, Parameters<typeof startFakeUpstream>[0], EndpointVerification["ok"] | string]>([
    ["a provider that does not list the model", { models: ["someone/else"] }, "model_not_listed"],
    ["a provider without a model list", { listModels: false }, "model_not_listed"],
    ["a provider that omits usage", { omitUsage: true }, "usage_missing"],
    ["a provider that answers completions with garbage", { garbage: true }, "completion_failed"],
  ])("fails %s as a wrong answer", async (_name, opts, check) => {
    const f = await fake(opts);
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    expect(result).toMatchObject({ ok: false, check, transport: false });
    expectSafe(result, f.url);
  });

  // DESIGN.md section 8: no answer is not a wrong answer, whatever step it happens at.
  it.each<[string, Parameters<typeof startFakeUpstream>[0], string]>([
    ["a 429 on completions", { failStatus: 429 }, "a one-token chat completion answered HTTP 429"],
    ["a 500 on completions", { failStatus: 500 }, "a one-token chat completion answered HTTP 500"],
    ["a 503 on completions", { failStatus: 503 }, "a one-token chat completion answered HTTP 503"],
    ["a 408 on completions", { failStatus: 408 }, "a one-token chat completion answered HTTP 408"],
    [
      "a reset before the answer",
      { resetBeforeHeaders: true },
      "a one-token chat completion failed: upstream request failed",
    ],
  ])("fails %s as a transport failure", async (_name, opts, message) => {
    const f = await fake(opts);
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    expect(result).toEqual({ ok: false, check: "endpoint_unreachable", message, transport: true });
    expectSafe(result, f.url);
  });

  it("fails a stream cut mid-way as a transport failure", async () => {
    const f = await fake({ failMidStream: true });
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    expect(result).toMatchObject({ ok: false, check: "endpoint_unreachable", transport: true });
    if (!result.ok)
      expect(result.message).toMatch(/^a streamed one-token chat completion broke off/);
    expectSafe(result, f.url);
  });

  it("fails a 429 or 503 on the model list as a transport failure", async () => {
    for (const status of [429, 503]) {
      const url = await listen((_req, res) => {
        res.writeHead(status);
        res.end();
      });
      expect(await verifyEndpoint(upstream, { url }, names)).toEqual({
        ok: false,
        check: "endpoint_unreachable",
        message: `GET /v1/models answered HTTP ${status}`,
        transport: true,
      });
    }
  });

  it("fails a provider that rejects the token as a wrong answer", async () => {
    const f = await fake();
    const result = await verifyEndpoint(upstream, { url: f.url, token: "wrong" }, names);
    expect(result).toEqual({
      ok: false,
      check: "model_not_listed",
      message: "GET /v1/models answered HTTP 401",
      transport: false,
    });
  });

  it("fails a stopped provider as unreachable without naming it", async () => {
    const f = await fake();
    await f.stop();
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    expect(result).toMatchObject({ ok: false, check: "endpoint_unreachable", transport: true });
    expectSafe(result, f.url);
  });

  it("fails a stream without usage, without [DONE], or with a non-SSE answer", async () => {
    const cases: [string, (body: Record<string, unknown>) => [string, string], string][] = [
      [
        "no usage chunk",
        () => ["text/event-stream", 'data: {"choices":[]}\n\ndata: [DONE]\n\n'],
        "usage_missing",
      ],
      [
        "no [DONE]",
        () => ["text/event-stream", `data: {"choices":[],"usage":${usageJson}}\n\n`],
        "stream_failed",
      ],
      ["JSON instead of SSE", () => ["application/json", completionJson], "stream_failed"],
      [
        "an event that is not JSON",
        () => ["text/event-stream", "data: hello\n\ndata: [DONE]\n\n"],
        "stream_failed",
      ],
    ];
    for (const [name, streamAnswer, check] of cases) {
      const url = await listen(openAiLike(streamAnswer));
      const result = await verifyEndpoint(upstream, { url }, ["m"]);
      expect(result, name).toMatchObject({ ok: false, check, transport: false });
    }
  });

  it("fails a completion without choices, or with fractional token counts", async () => {
    const noChoices = await listen(
      openAiLike(() => ["text/event-stream", ""], JSON.stringify({ usage: JSON.parse(usageJson) })),
    );
    expect(await verifyEndpoint(upstream, { url: noChoices }, ["m"])).toMatchObject({
      ok: false,
      check: "completion_failed",
    });
    const fractional = await listen(
      openAiLike(
        () => ["text/event-stream", ""],
        JSON.stringify({ choices: [], usage: { prompt_tokens: 1.5, completion_tokens: 1 } }),
      ),
    );
    expect(await verifyEndpoint(upstream, { url: fractional }, ["m"])).toMatchObject({
      ok: false,
      check: "usage_missing",
    });
  });

  it("does not follow a redirect to a conforming provider", async () => {
    const f = await fake();
    const url = await listen((req, res) => {
      res.writeHead(307, { location: `${f.url}${req.url ?? ""}` });
      res.end();
    });
    const result = await verifyEndpoint(upstream, { url, token }, names);
    expect(result).toEqual({
      ok: false,
      check: "model_not_listed",
      message: "GET /v1/models answered HTTP 307",
      transport: false,
    });
    expect(f.requests).toHaveLength(0);
  });

  it("times out a step that never answers", async () => {
    const url = await listen((req, res) => {
      if (req.url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ object: "list", data: [{ id: "m" }] }));
      }
      // chat completions never answer
    });
    const result = await verifyEndpoint(upstream, { url }, ["m"], { verifyTimeoutMs: 200 });
    expect(result).toEqual({
      ok: false,
      check: "endpoint_unreachable",
      message: "a one-token chat completion failed: no complete answer within 200 ms",
      transport: true,
    });
  });
});

const usageJson = JSON.stringify({ prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 });
const completionJson = JSON.stringify({
  object: "chat.completion",
  choices: [{ index: 0, message: { role: "assistant", content: "OK" }, finish_reason: "length" }],
  usage: JSON.parse(usageJson) as unknown,
});

/** A provider that lists `m`, answers JSON completions with `completion`, and streams as told. */
function openAiLike(
  stream: (body: Record<string, unknown>) => [string, string],
  completion = completionJson,
): RequestListener {
  return (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ object: "list", data: [{ id: "m", object: "model" }] }));
        return;
      }
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>;
      if (body.stream === true) {
        const [type, text] = stream(body);
        res.setHeader("content-type", type);
        res.end(text);
        return;
      }
      res.setHeader("content-type", "application/json");
      res.end(completion);
    });
  };
}

describe("verifyEndpoint: honest counting (issue 27, item 9)", () => {
  const counted = "a chat completion whose usage the gateway counts";
  /** The byte bound's count of a probe's prompt, as the gateway makes it. */
  const inputBound = (body: object) =>
    inputTokenUpperBound(
      parseChatRequest(new TextEncoder().encode(JSON.stringify(body)), { maxBytes: 1 << 20 }),
    );
  /**
   * An exact counter of the fake's own tokens (a word is a token: what the fake claims when
   * honest), as a model's tokenizer would be; it records the models it was asked for.
   */
  const wordCounters = () => {
    const asked: { repository: string; revision: string }[] = [];
    const words = (text: string) => BigInt(text.split(/\s+/).filter(Boolean).length);
    const counter: TokenCounter = {
      exact: true,
      name: "words",
      countInput: (req) =>
        Promise.resolve(
          req.messages.reduce(
            (n, m) => n + (typeof m.content === "string" ? words(m.content) : 0n),
            0n,
          ),
        ),
      countOutput: words,
      // The probes count whole answers (countOutput), never a stream's output.
      output: () => boundCounter.output(),
    };
    const counters: TokenCounters = {
      forModel: (model) => {
        asked.push({ repository: model.repository, revision: model.revision });
        return counter;
      },
      meteringOf: () => ({ kind: "exact", tokenizer: "words" }),
      preload: () => Promise.resolve(),
    };
    return { asked, counters };
  };
  const subject = {
    model: { repository: "acme/llama", revision: "main" },
    reasoning: { hiddenReasoningRatio: 0n },
  };

  it("fails a provider that claims its output limit, naming the figures", async () => {
    const f = await fake({ inflateUsage: { outputLimit: true } });
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    // The one-token steps claim 1 for one token (true); the counting step claims its limit for
    // "word0 word1 word2", 17 bytes by the byte bound (no tolerance on a bound).
    expect(result).toEqual({
      ok: false,
      check: "usage_diverged",
      message: `${counted}: usage claim ${countingMaxTokens} output tokens for an answer the gateway counts 17 with the byte bound (tolerance 0)`,
      transport: false,
    });
    expectSafe(result, f.url);
    // It stopped there: the optional feature checks were not asked.
    expect(f.calls("/v1/chat/completions")).toBe(3);
  });

  it("fails a provider that claims fifty times the characters of its prompt", async () => {
    const f = await fake({ inflateUsage: { promptTimesCharacters: 50 } });
    const result = await verifyEndpoint(upstream, { url: f.url, token }, names);
    const body = f.requests.find((r) => r.path === "/v1/chat/completions")!.body as object;
    // "Reply with OK.": 14 characters, claimed 700.
    expect(result).toEqual({
      ok: false,
      check: "usage_diverged",
      message: `a one-token chat completion: usage claim 700 input tokens for a prompt the gateway counts ${inputBound(body)} with the byte bound (tolerance 0)`,
      transport: false,
    });
    expect(inputBound(body)).toBeLessThan(700n);
  });

  it("counts with the model's own counter, its tolerance shown; an honest provider passes", async () => {
    const { asked, counters } = wordCounters();
    const prober = createEndpointProber(upstream, { counters });
    const honest = await fake();
    expect(await prober.verifyEndpoint({ url: honest.url, token }, names, subject)).toMatchObject({
      ok: true,
    });
    expect(asked).toEqual([{ repository: "acme/llama", revision: "main" }]);

    // 3 words counted: tolerance 8 per choice + 2 % of 3 (rounded up, 1) = 9; 200 is beyond.
    const liar = await fake({ inflateUsage: { outputLimit: true } });
    expect(await prober.verifyEndpoint({ url: liar.url, token }, names, subject)).toEqual({
      ok: false,
      check: "usage_diverged",
      message: `${counted}: usage claim ${countingMaxTokens} output tokens for an answer the gateway counts 3 with the model's tokenizer (words) (tolerance 9)`,
      transport: false,
    });
    // Within tolerance is honest: a claim of 10 for every probe is within the one-token
    // answer's 1 + 9 (and the counting answer's 3 + 9); 11 is not.
    const close = await fake({ usage: { prompt_tokens: 1, completion_tokens: 10 } });
    expect(await prober.verifyEndpoint({ url: close.url, token }, names, subject)).toMatchObject({
      ok: true,
    });
    const over = await fake({ usage: { prompt_tokens: 1, completion_tokens: 11 } });
    expect(await prober.verifyEndpoint({ url: over.url, token }, names, subject)).toEqual({
      ok: false,
      check: "usage_diverged",
      message:
        "a one-token chat completion: usage claim 11 output tokens for an answer the gateway counts 1 with the model's tokenizer (words) (tolerance 9)",
      transport: false,
    });
  });

  it("allows the hidden reasoning the offer declares, and no more", async () => {
    const { counters } = wordCounters();
    const prober = createEndpointProber(upstream, { counters });
    const reasoner = await fake({ usage: { prompt_tokens: 1, completion_tokens: 100 } });
    const declared = (ratio: bigint) => ({
      ...subject,
      reasoning: { hiddenReasoningRatio: ratio },
    });
    // "word0" (1 token, the one-token steps): 100 claimed; allowed 1 + 9 + 1 * ratio.
    expect(
      await prober.verifyEndpoint({ url: reasoner.url, token }, names, declared(0n)),
    ).toMatchObject({ ok: false, check: "usage_diverged" });
    expect(
      await prober.verifyEndpoint({ url: reasoner.url, token }, names, declared(64n)),
    ).toMatchObject({ ok: false, check: "usage_diverged" });
    const modest = await fake({
      usage: {
        prompt_tokens: 1,
        completion_tokens: 40,
        completion_tokens_details: { reasoning_tokens: 30 },
      },
    });
    expect(
      await prober.verifyEndpoint({ url: modest.url, token }, names, declared(30n)),
    ).toMatchObject({ ok: true });
    // The same output with no reasoning claimed: a ratio alone earns nothing.
    const bare = await fake({ usage: { prompt_tokens: 1, completion_tokens: 40 } });
    expect(
      await prober.verifyEndpoint({ url: bare.url, token }, names, declared(30n)),
    ).toMatchObject({ ok: false, check: "usage_diverged" });
  });

  it("passes an honest provider answering varied text in every shape, streamed or not", async () => {
    // Unicode and a tool call: counted by the byte bound, never below an honest word count.
    const f = await fake({ toolCalls: true, toolArguments: '{"city":"Zürich 🌧"}' });
    expect(await verifyEndpoint(upstream, { url: f.url, token }, names)).toMatchObject({
      ok: true,
      features: ["stream_usage", "tools", "json_schema"],
    });
  });
});
