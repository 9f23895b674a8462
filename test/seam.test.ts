import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * The seam between the REST facade and the chat call (issue 36): one JSON body rule on every
 * chat route, and the gateway's own final chunk, whatever the provider put in its first.
 */
describe("the REST chat seam", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    permitId = stack.demo.permitId;
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => fake.setOptions({ rawStream: undefined, chunks: 2 }));

  const post = (path: string, body: Uint8Array | string) =>
    authed(stack, path, {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body,
    });
  const bom = Buffer.from([0xef, 0xbb, 0xbf]);
  const bodies: Record<string, object> = {
    "/v1/chat/completions": { model: "demo-chat", messages: [{ role: "user", content: "hi" }] },
    "/v1/responses": { model: "demo-chat", input: "hi" },
    "/v1/messages": {
      model: "demo-chat",
      max_tokens: 16,
      messages: [{ role: "user", content: "hi" }],
    },
  };

  it("one JSON body rule on the three chat routes: a byte order mark and malformed UTF-8 are 400 invalid_json, before any provider call", async () => {
    const calls = fake.calls("/v1/chat/completions");
    for (const [path, body] of Object.entries(bodies)) {
      const text = Buffer.from(JSON.stringify(body));
      // Without the mark, the route serves: the refusal below is the mark's.
      expect((await post(path, text)).status, path).toBe(200);
      const marked = await post(path, Buffer.concat([bom, text]));
      expect(marked.status, path).toBe(400);
      expect(JSON.stringify(await json(marked)), path).toMatch(/byte order mark/);
      const broken = Buffer.from(JSON.stringify({ ...body, model: "demo-chat\u00e9" }));
      // A lone continuation byte in place of the é's two bytes.
      const at = broken.indexOf(0xc3);
      const malformed = Buffer.concat([broken.subarray(0, at), broken.subarray(at + 1)]);
      const bad = await post(path, malformed);
      expect(bad.status, path).toBe(400);
      expect(JSON.stringify(await json(bad)), path).toMatch(
        /invalid_json.*UTF-8|UTF-8.*invalid_json/,
      );
    }
    expect(fake.calls("/v1/chat/completions")).toBe(calls + 3);
    // The bodies the facade validates follow the same rule.
    const challenge = await authed(stack, "/v1/provider-offers/challenge", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: Buffer.concat([bom, Buffer.from("{}")]),
    });
    expect(challenge.status).toBe(400);
    expect((await json(challenge)).error.code).toBe("invalid_json");
  });

  it("the final chunk's id, created and model are the provider's only when they are what a client expects, else the gateway's", async () => {
    const chunk = (fields: object, delta: object, finish: string | null) =>
      `data: ${JSON.stringify({ object: "chat.completion.chunk", ...fields, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const stream = async (fields: object) => {
      fake.setOptions({
        rawStream: [
          Buffer.from(chunk(fields, { role: "assistant", content: "hi" }, null)),
          Buffer.from(chunk(fields, {}, "stop")),
          Buffer.from("data: [DONE]\n\n"),
        ],
      });
      const res = await post(
        "/v1/chat/completions",
        JSON.stringify({ ...bodies["/v1/chat/completions"], stream: true }),
      );
      expect(res.status).toBe(200);
      const requestId = res.headers.get("x-gateway-request-id");
      const events = (await res.text())
        .split("\n\n")
        .filter((e) => e.startsWith("data: {"))
        .map((e) => JSON.parse(e.slice(6)) as Record<string, unknown>);
      const last = events.at(-1)!;
      expect(last["x_gateway"]).toBeDefined();
      return { last, requestId };
    };
    const now = Math.floor(Date.now() / 1000);

    const fine = await stream({ id: "chatcmpl-abc", created: 1_700_000_000, model: "demo-chat" });
    expect(fine.last).toMatchObject({
      id: "chatcmpl-abc",
      created: 1_700_000_000,
      model: "demo-chat",
    });

    for (const hostile of [
      { id: { $ne: 1 }, created: "soon", model: ["demo-chat"] },
      { id: "x\ny", created: -5, model: "a\u0000b" },
      { id: "i".repeat(500), created: 1e300, model: "m".repeat(5000) },
      { id: "has space", created: 1.5, model: "" },
    ]) {
      const { last, requestId } = await stream(hostile);
      expect(last["id"]).toBe(requestId);
      expect(typeof last["created"]).toBe("number");
      expect(Math.abs((last["created"] as number) - now)).toBeLessThan(120);
      expect(last["model"]).toBe("");
      expect(Object.keys(last)).toEqual([
        "id",
        "object",
        "created",
        "model",
        "choices",
        "x_gateway",
      ]);
    }
  });
});
