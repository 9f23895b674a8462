import { randomBytes } from "node:crypto";
import http from "node:http";
import http2 from "node:http2";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-node";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { createApiKey, hashApiKey, revokeApiKey } from "../../src/adapters/pg/api-keys.js";
import { startGateway, type Gateway } from "../../src/app.js";
import { errorCodeOf } from "../../src/connect/errors.js";
import { randomBase62 } from "../../src/domain/api-key-check.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { auditSecret } from "../helpers/log-audit.js";
import { startChatStack, type TestStack } from "../helpers/stack.js";

/**
 * Issue 28, item 5: a malformed or unknown API key is refused without a database query (after
 * its first, for a key the gateway issued and then revoked), before the request body is read,
 * on the REST facade and the RPC paths alike; an address that keeps failing is refused 429
 * `address_rate_limited` before its credentials are examined, and a paying client on the same
 * address is served all along.
 *
 * The queries are counted for real: the gateway under test is given a pool that counts every
 * statement sent through it (pool.query and every client it lends), with its background loops
 * (indexer, housekeeping, measurement sharing, probes) stopped, so that every statement counted
 * is one a request caused.
 */

interface Counted {
  readonly pool: pg.Pool;
  /** Every statement sent since the start (its text). */
  readonly statements: string[];
}

function countingPool(pool: pg.Pool): Counted {
  const statements: string[] = [];
  const record = (query: unknown) =>
    statements.push(
      typeof query === "string" ? query : String((query as { text?: unknown }).text ?? query),
    );
  const through = <T extends object>(target: T, wrap: Record<string, unknown>): T =>
    new Proxy(target, {
      get(t, p) {
        if (typeof p === "string" && p in wrap) return wrap[p];
        const value: unknown = Reflect.get(t, p, t);
        return typeof value === "function"
          ? (value as (...a: unknown[]) => unknown).bind(t)
          : value;
      },
    });
  const counted = through(pool, {
    query: (...args: unknown[]) => {
      record(args[0]);
      return (pool.query as (...a: unknown[]) => unknown)(...args);
    },
    connect: async () => {
      const client = await pool.connect();
      return through(client, {
        query: (...args: unknown[]) => {
          record(args[0]);
          return (client.query as (...a: unknown[]) => unknown)(...args);
        },
      });
    },
  });
  return { pool: counted, statements };
}

/** What a flood of requests got: status counts, and how long it took. */
interface FloodResult {
  readonly statuses: Map<number, number>;
  readonly codes: Map<string, number>;
  readonly seconds: number;
}

interface RawRequest {
  readonly method: string;
  readonly path: string;
  readonly headers: Record<string, string>;
  readonly body?: string;
}

/** Sends `total` requests made by `make`, `concurrency` at a time, over kept-alive connections. */
async function flood(
  base: string,
  total: number,
  concurrency: number,
  make: (i: number) => RawRequest,
): Promise<FloodResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
  const statuses = new Map<number, number>();
  const codes = new Map<string, number>();
  let next = 0;
  const started = performance.now();
  const one = (r: RawRequest) =>
    new Promise<void>((resolve, reject) => {
      const req = http.request(
        `${base}${r.path}`,
        {
          method: r.method,
          agent,
          headers: {
            ...r.headers,
            ...(r.body === undefined ? {} : { "content-length": Buffer.byteLength(r.body) }),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            statuses.set(res.statusCode!, (statuses.get(res.statusCode!) ?? 0) + 1);
            const text = Buffer.concat(chunks).toString("utf8");
            let code = "?";
            try {
              const body = JSON.parse(text) as { error?: { code?: string }; code?: string };
              code = body.error?.code ?? body.code ?? "?";
            } catch {
              // not JSON
            }
            codes.set(code, (codes.get(code) ?? 0) + 1);
            resolve();
          });
        },
      );
      req.on("error", reject);
      req.end(r.body);
    });
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < total) await one(make(next++));
    }),
  );
  agent.destroy();
  return { statuses, codes, seconds: (performance.now() - started) / 1000 };
}

const madeUpKey = () => `gw_${randomBase62(40)}`;
const chatBody = JSON.stringify({
  model: "demo-chat",
  messages: [{ role: "user", content: "hi" }],
});

/** The flood's requests: made-up keys of every form, on REST and RPC paths, with bodies or not. */
function randomKeyRequest(i: number, permitId: string): RawRequest {
  switch (i % 6) {
    case 0:
      return {
        method: "GET",
        path: "/v1/models",
        headers: { authorization: `Bearer ${madeUpKey()}` },
      };
    case 1:
      return {
        method: "POST",
        path: "/v1/chat/completions",
        headers: {
          authorization: `Bearer ${madeUpKey()}`,
          "content-type": "application/json",
          "x-gateway-permit": permitId,
        },
        body: chatBody,
      };
    case 2:
      return {
        method: "POST",
        path: "/v1/messages",
        headers: { "x-api-key": madeUpKey(), "content-type": "application/json" },
        body: JSON.stringify({
          model: "demo-chat",
          max_tokens: 8,
          messages: [{ role: "user", content: "hi" }],
        }),
      };
    case 3:
      return {
        method: "GET",
        path: `/v1/permits/${permitId}`,
        headers: { authorization: `Bearer ${randomBytes(24).toString("base64url")}` },
      };
    case 4:
      return {
        method: "POST",
        path: "/gateway.v1.CatalogService/ListModels",
        headers: { authorization: `Bearer ${madeUpKey()}`, "content-type": "application/json" },
        body: "{}",
      };
    default:
      return { method: "GET", path: "/v1/models", headers: {} };
  }
}

describe("unknown keys cost nothing (issue 28, item 5)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let counted: Counted;
  let gateway: Gateway;
  /** A key as issued before the check existed: its row has no check (key_check false). */
  const oldKey = `gw_${randomBase62(40)}`;
  auditSecret("api key", oldKey);

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ API_KEY_CACHE_MS: "60000" }));
    await stack.database.db.pool.query(
      "INSERT INTO api_keys (id, name, key_hash, prefix, key_check) VALUES ($1, 'old', $2, $3, false)",
      [`key_${randomBytes(12).toString("hex")}`, hashApiKey(oldKey), oldKey.slice(0, 8)],
    );
    counted = countingPool(stack.database.db.pool);
    gateway = await startGateway(
      {
        ...stack.config,
        apiKeyCacheMs: 60_000,
        pollIntervalMs: 3_600_000,
        housekeepingIntervalMs: 600_000,
        probeIntervalMs: 86_400_000,
        settlementCloseCheckMs: 3_600_000,
        addressRateLimitRps: 10,
        addressRateLimitBurst: 100,
      },
      { logger: stack.logger, database: { ...stack.database.db, pool: counted.pool } },
    );
    await Promise.all([
      gateway.housekeeping.stop(),
      gateway.measurementSync.stop(),
      gateway.indexer.stop(),
      gateway.health.stop(),
    ]);
  }, 120_000);
  afterAll(async () => {
    await gateway?.close();
    await fake?.stop();
    await stack?.close();
  });

  const keyLookups = (statements: readonly string[]) =>
    statements.filter((s) => /\bapi_keys\b/.test(s)).length;

  it("10 000 requests with made-up keys cost at most 10 database queries (counted: every statement the gateway sent)", async () => {
    const before = counted.statements.length;
    const result = await flood(gateway.url, 10_000, 32, (i) =>
      randomKeyRequest(i, stack.demo.permitId),
    );
    const statements = counted.statements.slice(before);
    console.log(
      `10 000 made-up keys alone: ${statements.length} database statements in ${result.seconds.toFixed(1)} s; answers ${JSON.stringify(Object.fromEntries(result.statuses))}, codes ${JSON.stringify(Object.fromEntries(result.codes))}`,
    );
    expect(statements.length).toBeLessThanOrEqual(10);
    expect([...result.statuses.keys()].sort()).toEqual([401, 429]);
    // The address had 100 failures in store (and 10 a second more): the rest were refused
    // before their credentials were looked at.
    expect(result.statuses.get(429)! + result.statuses.get(401)!).toBe(10_000);
    expect(result.statuses.get(401)!).toBeLessThan(100 + 10 * (result.seconds + 1));
    expect(result.codes.get("address_rate_limited")).toBeGreaterThan(5_000);
  }, 120_000);

  it("a paying client on the same address is served all along beside them (no 503, no 429), and they still cost at most 10 queries", async () => {
    // Its key is looked up once before.
    const warm = await payingChat();
    expect(warm).toBe(200);
    const before = counted.statements.length;
    let done = false;
    const paying: number[] = [];
    const client = (async () => {
      while (!done) paying.push(await payingChat());
    })();
    const result = await flood(gateway.url, 10_000, 32, (i) =>
      randomKeyRequest(i, stack.demo.permitId),
    );
    done = true;
    await client;
    const statements = counted.statements.slice(before);
    console.log(
      `10 000 made-up keys beside a paying client: ${paying.length} paid chats answered ${JSON.stringify(count(paying))}; ${keyLookups(statements)} API key lookups among ${statements.length} statements (the chats' own included)`,
    );
    expect(paying.length).toBeGreaterThanOrEqual(5);
    expect(count(paying)).toEqual({ 200: paying.length });
    expect(keyLookups(statements)).toBeLessThanOrEqual(10);
    expect(result.statuses.get(503)).toBeUndefined();
  }, 120_000);

  const count = (statuses: number[]) => {
    const out: Record<number, number> = {};
    for (const s of statuses) out[s] = (out[s] ?? 0) + 1;
    return out;
  };
  async function payingChat(): Promise<number> {
    const res = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
      },
      body: chatBody,
    });
    await res.arrayBuffer();
    return res.status;
  }

  it("a revoked key costs one query, then none", async () => {
    const { id, key } = await createApiKey(stack.database.db.pool, "revoked");
    auditSecret("api key", key);
    expect(await revokeApiKey(stack.database.db.pool, id)).toBe(true);
    const before = counted.statements.length;
    for (let i = 0; i < 50; i++) {
      const res = await fetch(`${gateway.url}/v1/models`, {
        headers: { authorization: `Bearer ${key}` },
      });
      expect(res.status === 401 || res.status === 429).toBe(true);
      await res.arrayBuffer();
    }
    expect(keyLookups(counted.statements.slice(before))).toBe(1);
  });

  it("a key issued before the check is served (its hash is held); one made up in its shape costs nothing", async () => {
    const before = counted.statements.length;
    const res = await fetch(`${gateway.url}/v1/models`, {
      headers: { authorization: `Bearer ${oldKey}` },
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(keyLookups(counted.statements.slice(before))).toBe(1);
  });

  it.skipIf(!process.env.TEST_DATABASE_URL)(
    "a key written without a check after start (an older release's CLI) is served once the database's signal has every process read the hashes again (PostgreSQL: PGlite runs one process)",
    async () => {
      const later = `gw_${randomBase62(40)}`;
      auditSecret("api key", later);
      await stack.database.db.pool.query(
        "INSERT INTO api_keys (id, name, key_hash, prefix) VALUES ($1, 'older release', $2, $3)",
        [`key_${randomBytes(12).toString("hex")}`, hashApiKey(later), later.slice(0, 8)],
      );
      let status = 0;
      for (let i = 0; i < 50 && status !== 200; i++) {
        await new Promise((r) => setTimeout(r, 20));
        const res = await fetch(`${gateway.url}/v1/models`, {
          headers: { authorization: `Bearer ${later}` },
        });
        status = res.status;
        await res.arrayBuffer();
      }
      expect(status).toBe(200);
    },
  );
});

describe("the key is checked before the body is read (REST and every RPC protocol)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /**
   * Sends the headers of a request announcing a 1 MB body and 10 bytes of it, never the rest:
   * the answer (status, headers, body, trailers) must come while the body is still missing.
   */
  function partialHttp1(
    path: string,
    headers: Record<string, string>,
  ): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
    return new Promise((resolve, reject) => {
      const req = http.request(
        `${stack.gateway.url}${path}`,
        { method: "POST", headers: { ...headers, "content-length": "1000000" } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            clearTimeout(timer);
            resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) });
            req.destroy();
          });
        },
      );
      const timer = setTimeout(() => {
        req.destroy();
        reject(new Error(`${path}: no answer within 3 s while the body was incomplete`));
      }, 3000);
      req.on("error", () => undefined);
      req.write('{"model":"');
    });
  }

  const random = () => `Bearer ${madeUpKey()}`;

  it("REST: 401 with the spec's error body, the dialect's shape on /v1/messages (x-api-key)", async () => {
    const chat = await partialHttp1("/v1/chat/completions", {
      authorization: random(),
      "content-type": "application/json",
    });
    expect(chat.status).toBe(401);
    expect(chat.headers["www-authenticate"]).toBe("Bearer");
    expect(JSON.parse(chat.body.toString())).toEqual({
      error: { code: "invalid_api_key", type: "authentication_error", message: "invalid API key" },
    });
    const messages = await partialHttp1("/v1/messages", {
      "x-api-key": madeUpKey(),
      "content-type": "application/json",
    });
    expect(messages.status).toBe(401);
    expect(JSON.parse(messages.body.toString())).toMatchObject({
      type: "error",
      error: { type: "authentication_error", code: "invalid_api_key" },
    });
    const quote = await partialHttp1("/v1/quotes", { "content-type": "application/json" });
    expect(quote.status).toBe(401);
    expect((JSON.parse(quote.body.toString()) as { error: { code: string } }).error.code).toBe(
      "missing_api_key",
    );
  });

  it("Connect unary and server stream, gRPC-Web: refused in their own protocol's form", async () => {
    const unary = await partialHttp1("/gateway.v1.QuoteService/CreateQuote", {
      authorization: random(),
      "content-type": "application/json",
    });
    expect(unary.status).toBe(401);
    const error = JSON.parse(unary.body.toString()) as {
      code: string;
      details: { type: string }[];
    };
    expect(error.code).toBe("unauthenticated");
    expect(error.details.map((d) => d.type)).toEqual(["google.rpc.ErrorInfo"]);

    const stream = await partialHttp1("/gateway.v1.InferenceService/StreamChatCompletion", {
      authorization: random(),
      "content-type": "application/connect+json",
    });
    expect(stream.status).toBe(200);
    expect(stream.body[0]).toBe(2); // the end-of-stream envelope
    const end = JSON.parse(stream.body.subarray(5).toString()) as { error: { code: string } };
    expect(end.error.code).toBe("unauthenticated");

    const web = await partialHttp1("/gateway.v1.CatalogService/ListModels", {
      authorization: random(),
      "content-type": "application/grpc-web+proto",
    });
    expect(web.status).toBe(200);
    expect(web.body[0]).toBe(0x80); // the trailer frame
    expect(web.body.subarray(5).toString()).toMatch(/grpc-status: ?16\r\n/);
  });

  it("gRPC (HTTP/2): the status in trailers while the request stream is still open", async () => {
    const session = http2.connect(stack.gateway.url);
    try {
      const trailers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("no gRPC answer within 3 s")), 3000);
        const req = session.request({
          ":method": "POST",
          ":path": "/gateway.v1.CatalogService/ListModels",
          "content-type": "application/grpc",
          te: "trailers",
          authorization: random(),
        });
        req.on("trailers", (t) => {
          clearTimeout(timer);
          resolve(t);
        });
        req.on("error", reject);
        req.resume();
        // A frame header announcing 1 MB, and nothing more; the stream stays open.
        req.write(Buffer.from([0, 0, 0x0f, 0x42, 0x40, 1, 2, 3]));
      });
      expect(trailers["grpc-status"]).toBe(String(Code.Unauthenticated));
      expect(trailers["grpc-status-details-bin"]).toBeDefined();
    } finally {
      session.close();
    }
  });

  it("connect-node's own clients read the refusals: Connect, gRPC and gRPC-Web, unary and server stream", async () => {
    const headers = { authorization: random() };
    const transports: [string, Transport][] = [
      ["connect", createConnectTransport({ baseUrl: stack.gateway.url, httpVersion: "1.1" })],
      ["grpc", createGrpcTransport({ baseUrl: stack.gateway.url })],
      ["grpc-web", createGrpcWebTransport({ baseUrl: stack.gateway.url, httpVersion: "1.1" })],
    ];
    for (const [name, transport] of transports) {
      const catalog = createClient(CatalogService, transport);
      const unary = await catalog.listModels({}, { headers }).catch((e: unknown) => e);
      expect(unary, name).toBeInstanceOf(ConnectError);
      expect([name, (unary as ConnectError).code]).toEqual([name, Code.Unauthenticated]);
      expect([name, errorCodeOf(unary as ConnectError)]).toEqual([name, "invalid_api_key"]);

      const inference = createClient(InferenceService, transport);
      const streamed = await (async () => {
        for await (const _ of inference.streamChatCompletion(
          { body: new TextEncoder().encode(chatBody), permitId: stack.demo.permitId },
          { headers },
        ))
          return "answered";
        return "ended";
      })().catch((e: unknown) => e);
      expect([name, errorCodeOf(streamed as ConnectError)]).toEqual([name, "invalid_api_key"]);

      // And a key of the gateway goes through, on the same transport.
      const served = await catalog.listModels(
        {},
        { headers: { authorization: `Bearer ${stack.apiKey}` } },
      );
      expect(served.models.length).toBeGreaterThan(0);
    }
  });
});
