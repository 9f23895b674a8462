import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { startFakeUpstream, type FakeUpstream } from "../../../test/helpers/fake-upstream.js";
import { GatewayError } from "../../domain/errors.js";
import type { LookupAll } from "./endpoint-guard.js";
import { answerDeadlineMs, createUpstreamChat, maxTimerMs } from "./chat.js";
import { readEventData, readEventStream } from "./event-stream.js";
import { createUpstreamClient, endpointTarget, type UpstreamClient } from "./http.js";

let fake: FakeUpstream;
let client: UpstreamClient;
const servers: Server[] = [];

beforeAll(async () => {
  fake = await startFakeUpstream({ token: "tok-secret", basePath: "/base" });
  client = createUpstreamClient({ allowPrivate: true });
});

afterAll(async () => {
  await client.close();
  await fake.stop();
});

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

async function listen(handler: Parameters<typeof createServer>[1]): Promise<string> {
  const server = createServer(handler);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  server.unref();
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => {
      throw new Error("expected a rejection");
    },
    (err: unknown) => err,
  );
}

describe("endpointTarget", () => {
  it.each([
    ["https://h.example/base", "/v1/models", "https://h.example/base/v1/models"],
    ["https://h.example/base/", "/v1/models", "https://h.example/base/v1/models"],
    ["https://h.example", "/v1/models", "https://h.example/v1/models"],
    ["https://h.example/?k=v", "/v1/models", "https://h.example/v1/models?k=v"],
    ["https://h.example/b?k=v", "/v1/models?x=1", "https://h.example/b/v1/models?k=v&x=1"],
  ])("%s + %s", (endpoint, path, expected) => {
    expect(endpointTarget(endpoint, path).href).toBe(expected);
  });
});

describe("upstream client", () => {
  it("joins the path onto the endpoint path and presents the endpoint token only", async () => {
    const response = await client.request({ url: fake.url, token: "tok-secret" }, "/v1/models", {
      method: "GET",
      headers: {
        Authorization: "Bearer client-api-key",
        Accept: "application/json",
        "x-extra": "1",
        cookie: "session=client",
        "x-gateway-permit": `0x${"33".repeat(32)}`,
        "x-forwarded-for": "10.0.0.1",
      },
    });
    expect(response.status).toBe(200);
    expect(await response.json()).toMatchObject({ object: "list", data: [{ id: "fake-model" }] });
    const seen = fake.requests.at(-1);
    expect(seen?.path).toBe("/v1/models");
    expect(seen?.headers.authorization).toBe("Bearer tok-secret");
    // Only the allowlisted headers go upstream.
    expect(seen?.headers.accept).toBe("application/json");
    for (const name of ["x-extra", "cookie", "x-gateway-permit", "x-forwarded-for"])
      expect(seen?.headers[name]).toBeUndefined();
    // And only the allowlisted ones come back (content-length, date, connection do not).
    expect(Object.keys(response.headers)).toEqual(["content-type"]);
    expect(seen?.headers.host).toBe(`127.0.0.1:${fake.port}`);
  });

  it("sends no authorization without a token", async () => {
    const response = await client.request({ url: fake.url }, "/v1/models", {
      method: "GET",
      headers: { authorization: "Bearer client-api-key" },
    });
    expect(response.status).toBe(401);
    await response.dump();
    expect(fake.requests.at(-1)?.headers.authorization).toBeUndefined();
  });

  it("reuses a kept-alive connection", async () => {
    const local = await startFakeUpstream();
    const reuse = createUpstreamClient({ allowPrivate: true });
    try {
      for (let i = 0; i < 3; i++) {
        const response = await reuse.request({ url: local.url }, "/v1/models", { method: "GET" });
        await response.text();
        await idle();
      }
      expect(local.calls("/v1/models")).toBe(3);
      expect(local.connections).toBe(1);
    } finally {
      await reuse.close();
      await local.stop();
    }
  });

  it("keeps the connection of a stream whose reader stops at [DONE] before the body ends", async () => {
    // The body's end comes a moment after `[DONE]`, as a provider that flushes each event
    // would send it: a reader that stops at `[DONE]` must not cost the connection.
    let connections = 0;
    // Each answer's end, as the server sent it (the wait below is on it, not on a fixed time:
    // on a loaded machine the 20 ms can stretch).
    let ended: Promise<void> = Promise.resolve();
    const url = await listen((req, res) => {
      req.resume();
      ended = new Promise((resolve) => res.once("finish", () => resolve()));
      req.on("end", () => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write('data: {"n":1}\n\ndata: [DONE]\n\n');
        setTimeout(() => res.end(), 20);
      });
    });
    servers.at(-1)?.on("connection", () => connections++);
    const reuse = createUpstreamClient({ allowPrivate: true });
    try {
      for (let i = 0; i < 3; i++) {
        const response = await reuse.request({ url }, "/v1/chat/completions", { method: "POST" });
        const seen: string[] = [];
        for await (const data of readEventData(response.body)) {
          if (data === "[DONE]") break;
          seen.push(data);
        }
        expect(seen).toEqual(['{"n":1}']);
        // The body's end sent, then a moment for the client to take it (and free the socket).
        await ended;
        await new Promise((r) => setTimeout(r, 60));
      }
      expect(connections).toBe(1);
    } finally {
      await reuse.close();
    }
  });

  it("cuts the connection of a body that goes on long after its reader stopped", async () => {
    const ends: string[] = [];
    const url = await listen((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write("data: [DONE]\n\n");
        // 4 MiB more after [DONE], far more than the gateway reads to keep a connection.
        const filler = Buffer.alloc(16 * 1024, 0x20);
        let sent = 0;
        const more = (): void => {
          if (res.destroyed) return;
          if (sent++ === 256) return void res.end();
          res.write(filler, () => setImmediate(more));
        };
        res.on("close", () => ends.push(res.writableFinished ? "finished" : `cut after ${sent}`));
        more();
      });
    });
    const reuse = createUpstreamClient({ allowPrivate: true });
    try {
      const response = await reuse.request({ url }, "/v1/chat/completions", { method: "POST" });
      for await (const data of readEventData(response.body)) if (data === "[DONE]") break;
      await vi.waitFor(() => expect(ends).toHaveLength(1), { timeout: 5_000 });
      // Read on for 64 KiB (4 of the 16 KiB writes, give or take what the sockets buffer).
      expect(ends[0]).toMatch(/^cut after \d+$/);
      expect(Number(ends[0]?.slice("cut after ".length))).toBeLessThan(64);
    } finally {
      await reuse.close();
    }
  });

  it("streams a body chunk by chunk and parses its events", async () => {
    const response = await client.request(
      { url: fake.url, token: "tok-secret" },
      "/v1/chat/completions",
      {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "fake-model",
          messages: [{ role: "user", content: "hi" }],
          stream: true,
          stream_options: { include_usage: true },
        }),
      },
    );
    expect(response.status).toBe(200);
    expect(response.headers["content-type"]).toBe("text/event-stream");
    const data: string[] = [];
    for await (const event of readEventStream(response.body)) data.push(event.data);
    expect(data.at(-1)).toBe("[DONE]");
    const usage = JSON.parse(data.at(-2) ?? "{}") as { usage?: unknown; choices?: unknown };
    expect(usage).toMatchObject({ choices: [], usage: { prompt_tokens: 1, completion_tokens: 3 } });
  });

  it("does not follow a redirect", async () => {
    let followed = 0;
    const target = await listen((_req, res) => {
      followed++;
      res.end("{}");
    });
    const origin = await listen((_req, res) => {
      res.writeHead(302, { location: `${target}/v1/models` });
      res.end();
    });
    const response = await client.request({ url: origin }, "/v1/models", { method: "GET" });
    expect(response.status).toBe(302);
    expect(response.headers.location).toBe(`${target}/v1/models`);
    await response.dump();
    expect(followed).toBe(0);
  });

  it("refuses a loopback endpoint at connect time when private addresses are not allowed", async () => {
    const strict = createUpstreamClient({ allowPrivate: false });
    try {
      const before = fake.requests.length;
      const err = await rejection(
        strict.request({ url: fake.url, token: "tok-secret" }, "/v1/models", { method: "GET" }),
      );
      expect(err).toBeInstanceOf(GatewayError);
      expect((err as GatewayError).code).toBe("endpoint_not_allowed");
      expect(fake.requests.length).toBe(before);
    } finally {
      await strict.close();
    }
  });

  it("connects to the address resolved at connect time, keeping the name as Host", async () => {
    const lookups: string[] = [];
    const lookup: LookupAll = async (host) => {
      lookups.push(host);
      return [{ address: "127.0.0.1", family: 4 }];
    };
    const local = await startFakeUpstream();
    const pinned = createUpstreamClient({ allowPrivate: true, lookup });
    try {
      const endpoint = { url: `http://provider.example:${local.port}` };
      for (let i = 0; i < 2; i++) {
        const response = await pinned.request(endpoint, "/v1/models", { method: "GET" });
        expect(response.status).toBe(200);
        await response.text();
        await idle();
      }
      expect(local.requests.at(-1)?.headers.host).toBe(`provider.example:${local.port}`);
      // One connection, one resolution: the kept-alive connection stays on its checked address.
      expect(lookups).toEqual(["provider.example"]);
    } finally {
      await pinned.close();
      await local.stop();
    }
  });

  it.skipIf(!hasOpenssl())(
    "over TLS, connects to the resolved address and verifies the certificate for the name",
    async () => {
      const { key, cert } = selfSignedCert("provider.example");
      const names: (string | false | null)[] = [];
      const server = createHttpsServer({ key, cert }, (_req, res) => {
        res.setHeader("content-type", "application/json");
        res.end('{"object":"list","data":[]}');
      });
      server.on("secureConnection", (socket) => names.push(socket.servername));
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      const port = (server.address() as AddressInfo).port;
      const lookup: LookupAll = async () => [{ address: "127.0.0.1", family: 4 }];
      const tls = createUpstreamClient({ allowPrivate: true, lookup, ca: cert });
      try {
        const response = await tls.request(
          { url: `https://provider.example:${port}` },
          "/v1/models",
          { method: "GET" },
        );
        expect(response.status).toBe(200);
        expect(await response.json()).toEqual({ object: "list", data: [] });
        expect(names).toEqual(["provider.example"]);
        // The same certificate does not pass for another name on the same address.
        const err = await rejection(
          tls.request({ url: `https://other.example:${port}` }, "/v1/models", { method: "GET" }),
        );
        expect((err as GatewayError).code).toBe("upstream_unavailable");
        expect((err as GatewayError).message).not.toContain("other.example");
      } finally {
        await tls.close();
        server.closeAllConnections();
        await new Promise((r) => server.close(r));
      }
    },
  );

  it("refuses a name that resolves to loopback at connect time", async () => {
    const lookups: string[] = [];
    const lookup: LookupAll = async (host) => {
      lookups.push(host);
      return [{ address: "127.0.0.1", family: 4 }];
    };
    const strict = createUpstreamClient({ allowPrivate: false, lookup });
    try {
      const before = fake.requests.length;
      const err = await rejection(
        strict.request({ url: `http://evil.example:${fake.port}/base` }, "/v1/models", {
          method: "GET",
        }),
      );
      expect((err as GatewayError).code).toBe("endpoint_not_allowed");
      expect((err as GatewayError).message).not.toContain("evil.example");
      expect(lookups).toEqual(["evil.example"]);
      expect(fake.requests.length).toBe(before);
    } finally {
      await strict.close();
    }
  });

  it("reports a refused connection without the address", async () => {
    const closed = await listen((_req, res) => res.end());
    await new Promise((r) => servers.pop()?.close(r));
    const err = await rejection(client.request({ url: closed }, "/v1/models", { method: "GET" }));
    expect(err).toBeInstanceOf(GatewayError);
    const gw = err as GatewayError;
    expect(gw.code).toBe("upstream_unavailable");
    const port = new URL(closed).port;
    expect(gw.message).not.toContain(port);
    expect(String((gw.cause as Error).message)).not.toContain(port);
    expect((gw.cause as { code?: string }).code).toBe("ECONNREFUSED");
  });

  it("times out waiting for the headers", async () => {
    const silent = await listen(() => {
      // never answers
    });
    const err = await rejection(
      client.request({ url: silent }, "/v1/models", { method: "GET", timeoutMs: 100 }),
    );
    expect((err as GatewayError).code).toBe("upstream_unavailable");
    expect((err as GatewayError).message).toContain("did not answer within 100 ms");
  });

  it("passes the caller's abort reason through, before and after the headers", async () => {
    const slow = await startFakeUpstream({ chunks: 50, delayMs: 20 });
    try {
      const controller = new AbortController();
      const response = await client.request({ url: slow.url }, "/v1/chat/completions", {
        method: "POST",
        body: JSON.stringify({
          model: "fake-model",
          messages: [{ role: "user", content: "x" }],
          stream: true,
        }),
        signal: controller.signal,
      });
      const reason = new Error("client went away");
      const iterator = response.body[Symbol.asyncIterator]();
      await iterator.next();
      controller.abort(reason);
      const err = await rejection(
        (async () => {
          for (;;) if ((await iterator.next()).done) return;
        })(),
      );
      expect(err).toBe(reason);
      expect(await slow.requests.at(-1)?.finished).toBe("aborted");

      const before = new AbortController();
      before.abort(reason);
      const early = await rejection(
        client.request({ url: slow.url }, "/v1/models", { method: "GET", signal: before.signal }),
      );
      expect(early).toBe(reason);
    } finally {
      await slow.stop();
    }
  });

  it("limits how much of a body it buffers", async () => {
    const big = await listen((_req, res) => res.end("x".repeat(10_000)));
    const response = await client.request({ url: big }, "/", { method: "GET" });
    const err = await rejection(response.text(1000));
    expect((err as GatewayError).code).toBe("upstream_error");
  });

  it("reports a stream cut mid-way as upstream_error", async () => {
    const failing = await startFakeUpstream({ failMidStream: true, chunks: 5 });
    try {
      const response = await client.request({ url: failing.url }, "/v1/chat/completions", {
        method: "POST",
        body: JSON.stringify({
          model: "fake-model",
          messages: [{ role: "user", content: "x" }],
          stream: true,
        }),
      });
      const err = await rejection(
        (async () => {
          for await (const _event of readEventStream(response.body)) {
            // drain
          }
        })(),
      );
      expect((err as GatewayError).code).toBe("upstream_error");
    } finally {
      await failing.stop();
    }
  });
});

describe("answerDeadlineMs", () => {
  it.each([
    // the default limit at the default speed: 4096 tokens at 10/s
    [30_000, 4096n, 10, 409_600],
    // four choices of it
    [30_000, 4096n * 4n, 10, 1_638_400],
    // a short answer keeps the headers deadline
    [30_000, 10n, 10, 30_000],
    [30_000, 300n, 10, 30_000],
    [30_000, 301n, 10, 30_100],
    // rounded up to the millisecond
    [100, 1n, 3, 334],
    [100, 0n, 3, 100],
    // beyond what a timer holds (and beyond 2^53): the longest timer
    [30_000, 10n ** 30n, 10, maxTimerMs],
    [30_000, 2_147_483_648n, 1, maxTimerMs],
  ])("headers %i ms, %s tokens at %i/s: %i ms", (headersTimeoutMs, tokens, speed, expected) => {
    expect(
      answerDeadlineMs({ headersTimeoutMs, outputTokens: tokens, minTokensPerSecond: speed }),
    ).toBe(expected);
  });

  it("refuses a speed that is not positive", () => {
    expect(() =>
      answerDeadlineMs({ headersTimeoutMs: 1, outputTokens: 1n, minTokensPerSecond: 0 }),
    ).toThrow(RangeError);
  });
});

describe("createUpstreamChat", () => {
  const timeouts = { timeoutMs: 150, idleTimeoutMs: 150, minTokensPerSecond: 10 };
  const chat = () => createUpstreamChat(client, timeouts);
  const body = new TextEncoder().encode('{"model":"m","messages":[]}');
  const answer = '{"choices":[{"message":{"content":"late"}}]}';

  /** A server that sends its headers (and the whole answer) only after `ms`, as vLLM does. */
  const headersAfter = (ms: number) =>
    listen((_req, res) => {
      setTimeout(() => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(answer);
      }, ms);
    });

  it("gives a JSON answer the time its output takes at the least speed, headers included", async () => {
    const url = await headersAfter(500);
    // 50 tokens at 10/s: 5 s
    const reply = await chat()({ url }, body, {
      signal: new AbortController().signal,
      answerOutputTokens: 50n,
    });
    expect(reply.status).toBe(200);
    expect(await reply.text()).toBe(answer);
  });

  it("holds a stream, and a JSON answer past its output's time, to the headers deadline", async () => {
    const url = await headersAfter(500);
    const stream = await rejection(chat()({ url }, body, { signal: new AbortController().signal }));
    expect(stream).toBeInstanceOf(GatewayError);
    expect((stream as GatewayError).message).toBe("upstream did not answer within 150 ms");
    // 2 tokens at 10/s: 200 ms, longer than the headers deadline and shorter than the answer
    const json = await rejection(
      chat()({ url }, body, { signal: new AbortController().signal, answerOutputTokens: 2n }),
    );
    expect((json as GatewayError).code).toBe("upstream_unavailable");
    expect((json as GatewayError).message).toBe("upstream did not answer within 200 ms");
  });

  it("lets a JSON body that follows early headers be as silent as its output's time", async () => {
    const url = await listen((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.flushHeaders();
      // Beyond the idle timeout even at undici's body timer resolution (about a second).
      setTimeout(() => res.end(answer), 2000);
    });
    const reply = await chat()({ url }, body, {
      signal: new AbortController().signal,
      answerOutputTokens: 50n,
    });
    expect(await reply.text()).toBe(answer);
    // A stream's body is held to the idle timeout.
    const streamed = await chat()({ url }, body, { signal: new AbortController().signal });
    const events = streamed.stream(() => true).done;
    expect(((await rejection(events)) as GatewayError).code).toBe("upstream_error");
  });
});

describe("readEventStream", () => {
  async function* chunks(...parts: string[]): AsyncIterable<Uint8Array> {
    for (const part of parts) yield new TextEncoder().encode(part);
  }

  it("joins events split across chunks and keeps an unterminated last event", async () => {
    const events: string[] = [];
    for await (const e of readEventStream(
      chunks('data: {"a"', ":1}\n\n: comment\n\ndata: [DONE]\n"),
    )) {
      events.push(e.data);
    }
    expect(events).toEqual(['{"a":1}', "[DONE]"]);
  });

  it("refuses an oversized event", async () => {
    const err = await rejection(
      (async () => {
        for await (const _e of readEventStream(chunks(`data: ${"x".repeat(5000)}`), {
          maxEventBytes: 1000,
        })) {
          // drain
        }
      })(),
    );
    expect((err as GatewayError).code).toBe("upstream_error");
  });
});

/**
 * undici returns a connection to its pool a tick after the body ends; a request sent in that
 * tick would open a second connection, which is fine in production but not what these tests
 * count.
 */
function idle(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** A throw-away self-signed certificate for `name`, made with the openssl CLI. */
function selfSignedCert(name: string): { key: string; cert: string } {
  const dir = mkdtempSync(join(tmpdir(), "gw-cert-"));
  try {
    execFileSync(
      "openssl",
      [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        join(dir, "key.pem"),
        "-out",
        join(dir, "cert.pem"),
        "-days",
        "1",
        "-subj",
        `/CN=${name}`,
        "-addext",
        `subjectAltName=DNS:${name}`,
      ],
      { stdio: "ignore" },
    );
    return {
      key: readFileSync(join(dir, "key.pem"), "utf8"),
      cert: readFileSync(join(dir, "cert.pem"), "utf8"),
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
