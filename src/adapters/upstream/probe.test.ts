import { createServer, type RequestListener, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "../../../test/helpers/fake-upstream.js";
import type { EndpointVerification } from "../../domain/health.js";
import { createUpstreamClient, type UpstreamClient } from "./http.js";
import { createEndpointProber, probeLiveness, verifyEndpoint } from "./probe.js";

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
      { model: "acme/llama", tool_choice: { type: "function", function: { name: "get_weather" } } },
      { model: "acme/llama", response_format: { type: "json_schema" } },
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
