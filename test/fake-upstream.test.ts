import { request as httpRequest } from "node:http";
import { afterEach, describe, expect, it, vi } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "./helpers/fake-upstream.js";
import { sseData } from "./helpers/sse.js";

const fakes: FakeUpstream[] = [];

afterEach(async () => {
  await Promise.all(fakes.splice(0).map((f) => f.stop()));
});

async function fake(opts: Parameters<typeof startFakeUpstream>[0] = {}): Promise<FakeUpstream> {
  const f = await startFakeUpstream(opts);
  fakes.push(f);
  return f;
}

function chat(f: FakeUpstream, body: object, headers: Record<string, string> = {}) {
  return fetch(`${f.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({
      model: "fake-model",
      messages: [{ role: "user", content: "a b c" }],
      ...body,
    }),
  });
}

describe("fake upstream", () => {
  it("lists its models, or answers 404 when told not to", async () => {
    const f = await fake({ models: ["a", "b"] });
    const list = await fetch(`${f.url}/v1/models`);
    expect(await list.json()).toMatchObject({
      object: "list",
      data: [
        { id: "a", object: "model" },
        { id: "b", object: "model" },
      ],
    });
    f.setOptions({ listModels: false });
    expect((await fetch(`${f.url}/v1/models`)).status).toBe(404);
    expect(f.calls("/v1/models")).toBe(2);
  });

  it("answers a JSON chat completion with usage, limited by max_tokens", async () => {
    const f = await fake({ chunks: 4 });
    const full = (await (await chat(f, {})).json()) as Record<string, unknown>;
    expect(full).toMatchObject({
      object: "chat.completion",
      model: "fake-model",
      choices: [
        {
          message: { role: "assistant", content: "word0 word1 word2 word3" },
          finish_reason: "stop",
        },
      ],
      usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
    });
    const short = (await (await chat(f, { max_completion_tokens: 2 })).json()) as Record<
      string,
      unknown
    >;
    expect(short).toMatchObject({
      choices: [{ message: { content: "word0 word1" }, finish_reason: "length" }],
      usage: { completion_tokens: 2 },
    });
    f.setOptions({ omitUsage: true });
    const bare = (await (await chat(f, {})).json()) as Record<string, unknown>;
    expect(bare.usage).toBeUndefined();
    expect(f.requests.at(-1)?.body).toMatchObject({ model: "fake-model" });
  });

  it("streams chunks, a usage-only chunk when asked, and [DONE]", async () => {
    const f = await fake({ chunks: 3, usage: { prompt_tokens: 100, completion_tokens: 200 } });
    const response = await chat(f, {
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 2,
    });
    expect(response.headers.get("content-type")).toBe("text/event-stream");
    const data = sseData(await response.text());
    expect(data.at(-1)).toBe("[DONE]");
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d) as Record<string, unknown>);
    expect(chunks.every((c) => c.object === "chat.completion.chunk")).toBe(true);
    const content = chunks.flatMap((c) =>
      (c.choices as { delta?: { content?: string } }[]).map((ch) => ch.delta?.content ?? ""),
    );
    expect(content.join("")).toBe("word0 word1");
    expect(chunks.at(-1)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 100, completion_tokens: 200, total_tokens: 300 },
    });

    const withoutUsage = sseData(await (await chat(f, { stream: true })).text());
    expect(withoutUsage.some((d) => d.includes('"usage"'))).toBe(false);
    expect(withoutUsage.at(-1)).toBe("[DONE]");
  });

  it("checks the bearer token and the model", async () => {
    const f = await fake({ token: "t0k" });
    expect((await chat(f, {})).status).toBe(401);
    expect((await chat(f, {}, { authorization: "Bearer t0k" })).status).toBe(200);
    expect((await chat(f, { model: "other" }, { authorization: "Bearer t0k" })).status).toBe(404);
    expect(f.requests.map((r) => r.headers.authorization)).toEqual([
      undefined,
      "Bearer t0k",
      "Bearer t0k",
    ]);
  });

  it("fails with a status before any byte, or mid-stream", async () => {
    const f = await fake({ failStatus: 503 });
    expect((await chat(f, { stream: true })).status).toBe(503);
    f.setOptions({ failStatus: undefined, failMidStream: true, failAfterChunks: 2, chunks: 5 });
    const response = await chat(f, { stream: true });
    expect(response.status).toBe(200);
    await expect(response.text()).rejects.toThrow();
  });

  it("serves under a base path", async () => {
    const f = await fake({ basePath: "/base" });
    expect(f.url).toMatch(/:\d+\/base$/);
    expect((await fetch(`${f.url}/v1/models`)).status).toBe(200);
    expect(f.requests.at(-1)?.path).toBe("/v1/models");
  });

  it("sees a client disconnect mid-stream", async () => {
    const f = await fake({ chunks: 100, delayMs: 10 });
    const closed = f.closedConnections;
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest(
        `${f.url}/v1/chat/completions`,
        { method: "POST", headers: { "content-type": "application/json" } },
        (res) => {
          res.once("data", () => {
            req.destroy();
            resolve();
          });
        },
      );
      req.on("error", (err) => (req.destroyed ? undefined : reject(err)));
      req.end(
        JSON.stringify({
          model: "fake-model",
          messages: [{ role: "user", content: "x" }],
          stream: true,
        }),
      );
    });
    const seen = f.requests.at(-1);
    expect(await seen?.finished).toBe("aborted");
    expect(seen?.closedEarly).toBe(true);
    await vi.waitFor(() => expect(f.closedConnections).toBe(closed + 1));
  });

  it("reports a completed exchange as completed, and stop() closes kept-alive connections", async () => {
    const f = await fake();
    await (await fetch(`${f.url}/v1/models`)).text();
    expect(await f.requests.at(-1)?.finished).toBe("completed");
    expect(f.requests.at(-1)?.closedEarly).toBe(false);
    expect(f.connections).toBe(1);
    await f.stop();
    await f.stop();
    expect(f.closedConnections).toBe(1);
  });
});
