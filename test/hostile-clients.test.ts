import http2 from "node:http2";
import net from "node:net";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Slow and hostile clients (issue 12): slowloris headers and bodies, silent sockets, oversized
 * headers, JSON bombs, and headers that must not cross the gateway in either direction.
 */
describe("slow and hostile clients", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;
  let rowsOverCalls = 0;
  const headersTimeoutMs = 400;
  const bodyTimeoutMs = 600;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({
      HEADERS_TIMEOUT_MS: String(headersTimeoutMs),
      BODY_TIMEOUT_MS: String(bodyTimeoutMs),
      IDLE_TIMEOUT_MS: "800",
      MAX_HEADER_BYTES: "4096",
      MAX_JSON_ARRAY_ITEMS: "100",
    }));
    permitId = stack.demo.permitId;
    // Rows and upstream calls before any test (verification probes call the upstream, no row).
    rowsOverCalls = (await requestRows()) - chatCalls();
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(async () => {
    fake.setOptions({ delayMs: 0, chunks: 2, responseHeaders: undefined });
    // A previous test's charge commits after its response, and a leased close writes its row only
    // then: start from a settled ledger, where every upstream call since the start has its row.
    await eventually(
      async () => (await openRows()) === 0 && (await requestRows()) - chatCalls() === rowsOverCalls,
      5000,
      20,
    );
  });

  const port = () => new URL(stack.gateway.url).port;
  const chatCalls = () => fake.calls("/v1/chat/completions");
  const requestRows = async () =>
    Number(
      (
        await stack.database.db.pool.query<{ n: string }>(
          "SELECT count(*) AS n FROM inference_requests",
        )
      ).rows[0]!.n,
    );
  async function openRows(): Promise<number> {
    return Number(
      (
        await stack.database.db.pool.query<{ n: string }>(
          "SELECT count(*) AS n FROM inference_requests WHERE status IN ('pending', 'streaming')",
        )
      ).rows[0]!.n,
    );
  }
  const reserved = async (): Promise<string> =>
    (await json(await authed(stack, `/v1/permits/${permitId}`))).reserved;

  /** A raw TCP connection: what it received, and whether the server closed it. */
  function rawSocket() {
    const socket = net.connect(Number(port()), "127.0.0.1");
    const state = { received: "", closed: false };
    socket.on("data", (chunk: Buffer) => (state.received += chunk.toString("latin1")));
    socket.on("close", () => (state.closed = true));
    socket.on("error", () => undefined);
    const ready = new Promise<void>((resolve) => socket.once("connect", () => resolve()));
    return { socket, state, ready };
  }

  /** Writes `pieces` one by one, `everyMs` apart, until the server closes the socket (bounded). */
  async function trickle(
    socket: net.Socket,
    state: { closed: boolean },
    pieces: () => string,
    everyMs: number,
    maxWrites: number,
  ): Promise<number> {
    let writes = 0;
    while (!state.closed && writes < maxWrites) {
      if (!socket.destroyed) socket.write(pieces());
      writes++;
      await new Promise((r) => setTimeout(r, everyMs));
    }
    return writes;
  }

  it("cuts off a client that trickles its headers (slowloris), without an answer or any work", async () => {
    const before = { calls: chatCalls(), rows: await requestRows(), reserved: await reserved() };
    const { socket, state, ready } = rawSocket();
    await ready;
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${stack.apiKey}\r\n`,
    );
    // A header line every 100 ms would keep an inactivity timer alive for ever (bounded: 8 s).
    const started = Date.now();
    await trickle(socket, state, () => "X-Slow: 1\r\n", 100, 80);
    expect(state.closed).toBe(true);
    expect(Date.now() - started).toBeLessThan(5000);
    expect(state.received).toBe(""); // simply closed
    expect(chatCalls()).toBe(before.calls);
    expect(await requestRows()).toBe(before.rows);
    expect(await reserved()).toBe(before.reserved);
  });

  it("closes a socket that sends nothing, and one that trickles the HTTP/2 preface", async () => {
    const silent = rawSocket();
    await silent.ready;
    await eventually(async () => silent.state.closed, 5000, 50);
    expect(silent.state.received).toBe("");

    const preface = rawSocket();
    await preface.ready;
    const bytes = "PRI * HTTP/2.0\r\n";
    let at = 0;
    await trickle(preface.socket, preface.state, () => bytes[at++ % bytes.length]!, 100, 80);
    expect(preface.state.closed).toBe(true);
  });

  it("answers 408 request_timeout to a chat whose body trickles after valid headers, reserving nothing", async () => {
    const before = { calls: chatCalls(), rows: await requestRows(), reserved: await reserved() };
    const body = JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "hi" }],
    });
    const { socket, state, ready } = rawSocket();
    await ready;
    socket.write(
      [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: gw",
        `Authorization: Bearer ${stack.apiKey}`,
        `X-Gateway-Permit: ${permitId}`,
        "Content-Type: application/json",
        `Content-Length: ${body.length}`,
        "",
        "",
      ].join("\r\n"),
    );
    let at = 0;
    // One byte every 100 ms: the whole body would take seconds (bounded: 8 s).
    await trickle(socket, state, () => body[at++] ?? " ", 100, 80);
    expect(state.closed).toBe(true);
    expect(at).toBeLessThan(body.length);
    const [head, payload] = state.received.split("\r\n\r\n");
    expect(head).toMatch(/^HTTP\/1\.1 408 /);
    expect(head).toMatch(/connection: close/i);
    expect(JSON.parse(payload!)).toEqual({
      error: {
        code: "request_timeout",
        type: "invalid_request_error",
        message: expect.any(String),
      },
    });
    expect(chatCalls()).toBe(before.calls);
    expect(await requestRows()).toBe(before.rows);
    expect(await reserved()).toBe(before.reserved);
  });

  it("answers 408 on HTTP/2 too when a request body does not arrive", async () => {
    const session = http2.connect(stack.gateway.url);
    try {
      const stream = session.request({
        ":method": "POST",
        ":path": "/v1/chat/completions",
        authorization: `Bearer ${stack.apiKey}`,
        "x-gateway-permit": permitId,
        "content-type": "application/json",
      });
      stream.write("{"); // and then nothing, the stream left open
      const status = await new Promise<number>((resolve) =>
        stream.once("response", (headers) => resolve(Number(headers[":status"]))),
      );
      expect(status).toBe(408);
      let text = "";
      stream.setEncoding("utf8");
      stream.on("data", (chunk: string) => (text += chunk));
      await new Promise((resolve) => stream.once("close", resolve));
      expect(JSON.parse(text).error.code).toBe("request_timeout");
    } finally {
      session.destroy();
    }
  });

  it("never times out a response being streamed, only the request phase", async () => {
    // The answer takes longer than the header and body deadlines together.
    fake.setOptions({ delayMs: 200, chunks: 6 });
    const started = Date.now();
    const res = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      }),
    });
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(Date.now() - started).toBeGreaterThan(headersTimeoutMs + bodyTimeoutMs);
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
  });

  it("closes an idle kept-alive connection after IDLE_TIMEOUT_MS", async () => {
    const { socket, state, ready } = rawSocket();
    await ready;
    socket.write("GET /health HTTP/1.1\r\nHost: gw\r\n\r\n");
    await eventually(async () => state.received.includes('{"status":"ok"}'), 2000, 20);
    expect(state.closed).toBe(false);
    await eventually(async () => state.closed, 5000, 50);
  });

  it("closes an HTTP/2 session with no open stream after IDLE_TIMEOUT_MS", async () => {
    const session = http2.connect(stack.gateway.url);
    let closed = false;
    session.on("close", () => (closed = true));
    session.on("error", () => undefined);
    try {
      const stream = session.request({ ":path": "/health" });
      stream.resume();
      await new Promise((resolve) => stream.once("close", resolve));
      expect(closed).toBe(false);
      await eventually(async () => closed, 5000, 50);
    } finally {
      session.destroy();
    }
  });

  it("refuses headers larger than MAX_HEADER_BYTES with 431", async () => {
    const res = await fetch(`${stack.gateway.url}/health`, {
      headers: { "x-big": "a".repeat(8000) },
    });
    expect(res.status).toBe(431);
  });

  it("refuses too deep JSON and too long arrays with 400 before anything is reserved", async () => {
    const before = { calls: chatCalls(), rows: await requestRows(), reserved: await reserved() };
    const send = (body: string) =>
      authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body,
      });
    const deep = (depth: number) =>
      `{"model":"demo-chat","messages":[{"role":"user","content":"hi"}],"x":${"[".repeat(depth)}${"]".repeat(depth)}}`;
    // The top-level object is depth 1: 63 more levels are fine, 64 are one too many.
    expect((await send(deep(63))).status).toBe(200);
    // Its charge commits after the response (a leased close, in a batch): its row is written then,
    // so wait for the row itself (no open row is also true before it is written).
    await eventually(
      async () => (await requestRows()) === before.rows + 1 && (await openRows()) === 0,
      5000,
      20,
    );
    const before2 = { calls: chatCalls(), rows: await requestRows(), reserved: await reserved() };
    for (const body of [
      deep(64),
      deep(1_000_000), // linear, no recursion to blow
      JSON.stringify({
        model: "demo-chat",
        messages: Array.from({ length: 101 }, () => ({ role: "user", content: "hi" })),
      }),
      JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        stop: Array.from({ length: 101 }, () => "x"),
      }),
    ]) {
      const res = await send(body);
      expect(res.status).toBe(400);
      const error = (await json(res)).error;
      expect(error.code).toBe("invalid_request");
      expect(error.message).toMatch(/MAX_JSON_(DEPTH|ARRAY_ITEMS)/);
    }
    expect(chatCalls()).toBe(before2.calls);
    expect(await requestRows()).toBe(before2.rows);
    expect(await reserved()).toBe(before2.reserved);
    expect(before.calls + 1).toBe(before2.calls);
    // Quotes and the other JSON bodies are bounded too.
    const quote = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: deep(64),
    });
    expect(quote.status).toBe(400);
    const challenge = await authed(stack, "/v1/provider-offers/challenge", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: `{"offerId":${"[".repeat(100)}${"]".repeat(100)}}`,
    });
    expect(challenge.status).toBe(400);
    expect((await json(challenge)).error.message).toMatch(/MAX_JSON_DEPTH/);
    // ...by the configured bounds, not only the defaults (MAX_JSON_ARRAY_ITEMS is 100 here).
    const wide = await authed(stack, "/v1/provider-offers/challenge", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ offerId: Array.from({ length: 101 }, () => 0) }),
    });
    expect(wide.status).toBe(400);
    expect((await json(wide)).error.message).toMatch(/MAX_JSON_ARRAY_ITEMS/);
  });

  describe("header allowlists", () => {
    const hostile = {
      "set-cookie": "session=provider; Path=/",
      "x-gateway-credits-charged": "999999999",
      "x-gateway-request-id": `0x${"de".repeat(32)}`,
      "x-provider-secret": "internal",
    };
    const clientHeaders = {
      "content-type": "application/json",
      "x-gateway-permit": permitId,
      cookie: "session=client",
      "x-forwarded-for": "10.1.2.3",
      "x-api-key": "client-secret",
    };

    it("passes no provider response header to the client (JSON and SSE)", async () => {
      fake.setOptions({ responseHeaders: hostile });
      const plain = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { ...clientHeaders, "x-gateway-permit": permitId },
        body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(plain.status).toBe(200);
      const body = await plain.text();
      expect(plain.headers.get("set-cookie")).toBeNull();
      expect(plain.headers.get("x-provider-secret")).toBeNull();
      expect(plain.headers.get("x-gateway-credits-charged")).not.toBe("999999999");
      expect(plain.headers.get("x-gateway-request-id")).not.toBe(hostile["x-gateway-request-id"]);
      expect(plain.headers.get("content-length")).toBe(String(Buffer.byteLength(body)));

      const streamed = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { ...clientHeaders, "x-gateway-permit": permitId },
        body: JSON.stringify({
          model: "demo-chat",
          messages: [{ role: "user", content: "hi" }],
          stream: true,
        }),
      });
      expect(streamed.status).toBe(200);
      await streamed.text();
      expect(streamed.headers.get("set-cookie")).toBeNull();
      expect(streamed.headers.get("x-provider-secret")).toBeNull();
      expect(streamed.headers.get("content-length")).toBeNull();
      expect(streamed.headers.get("x-gateway-credits-charged")).toBeNull(); // a trailer here
      expect(streamed.headers.get("x-gateway-request-id")).not.toBe(
        hostile["x-gateway-request-id"],
      );
    });

    it("passes no client credential or cookie to the provider", async () => {
      const res = await authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { ...clientHeaders, "x-gateway-permit": permitId },
        body: JSON.stringify({ model: "demo-chat", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status).toBe(200);
      await res.text();
      const seen = fake.requests.at(-1)!;
      expect(seen.path).toBe("/v1/chat/completions");
      for (const name of ["cookie", "x-gateway-permit", "x-forwarded-for", "x-api-key"])
        expect(seen.headers[name]).toBeUndefined();
      // The endpoint was registered without a token: no authorization at all, never the API key.
      expect(seen.headers.authorization).toBeUndefined();
      expect(JSON.stringify(seen.headers)).not.toContain(stack.apiKey);
    });
  });
});
