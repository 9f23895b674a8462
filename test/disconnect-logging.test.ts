import { request, type ClientRequest } from "node:http";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { eventually, startChatStack, type TestStack } from "./helpers/stack.js";

interface LogLine {
  level: number;
  msg: string;
  reqId?: string;
  code?: string;
  err?: unknown;
}

/**
 * A client that leaves mid-request is an ordinary outcome: one info line saying so, with the
 * request id, and nothing at error level (it used to be two `internal_error` lines with the
 * stack of an AbortError, one from the RPC layer and one from the REST facade).
 */
describe("a client that disconnects", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ LOG_LEVEL: "debug" }, { chunks: 50 }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => fake.setOptions({ delayMs: 0 }));

  const parsed = (): LogLine[] => stack.logs.lines.map((l) => JSON.parse(l) as LogLine);

  /** Sends a chat request on its own connection; the caller destroys its socket. */
  function send(reqId: string, body: object): ClientRequest {
    const payload = JSON.stringify(body);
    const req = request(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      agent: false,
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "content-length": Buffer.byteLength(payload),
        "x-gateway-permit": stack.demo.permitId,
        "x-request-id": reqId,
      },
    });
    req.on("error", () => undefined); // the socket is destroyed on purpose
    req.end(payload);
    return req;
  }

  /** Waits until the gateway has dealt with the disconnect, then returns the request's lines. */
  async function outcome(reqId: string, logsBefore: number): Promise<LogLine[]> {
    const upstreamCall = fake.requests.at(-1)!;
    expect(await upstreamCall.finished).toBe("aborted");
    const mine = () => parsed().filter((l) => l.reqId === reqId && l.level >= 30);
    await eventually(async () => mine().length > 0, 5000, 20);
    // Time for a second line, were anything to write one.
    await new Promise((r) => setTimeout(r, 500));
    expect(
      parsed()
        .slice(logsBefore)
        .filter((l) => l.level >= 50),
    ).toEqual([]);
    return mine();
  }

  it("mid-stream is logged once, at info, as cancelled", async () => {
    fake.setOptions({ delayMs: 50 });
    const reqId = "disconnect-sse-1";
    const before = stack.logs.lines.length;
    const req = send(reqId, {
      model: "demo-chat",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
    });
    await new Promise<void>((resolve, reject) => {
      req.on("response", (res) => {
        let text = "";
        res.on("data", (chunk: Buffer) => {
          text += chunk.toString("utf8");
          if (text.includes("word1")) {
            req.destroy();
            resolve();
          }
        });
      });
      req.on("error", reject);
    });
    const lines = await outcome(reqId, before);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 30, msg: "client disconnected", code: "cancelled" });
    expect(lines[0]!.err).toBeUndefined();
  });

  it("while a JSON answer is awaited is logged once, at info, as cancelled", async () => {
    fake.setOptions({ delayMs: 2000 });
    const reqId = "disconnect-json-1";
    const before = stack.logs.lines.length;
    const upstreamCalls = fake.requests.length;
    const req = send(reqId, { model: "demo-chat", messages: [{ role: "user", content: "hi" }] });
    await eventually(async () => fake.requests.length > upstreamCalls, 5000, 10);
    req.destroy();
    const lines = await outcome(reqId, before);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 30, msg: "client disconnected", code: "cancelled" });
    expect(lines[0]!.err).toBeUndefined();
  });
});
