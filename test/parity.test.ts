import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, toJson } from "@bufbuild/protobuf";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest, type IncomingHttpHeaders } from "node:http";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  Dialect,
  InferenceService,
  StreamChatCompletionRequestSchema,
  StreamChatCompletionResponseSchema,
  type StreamChatCompletionResponse,
} from "../gen/gateway/v1/inference_pb.js";
import { demoTariff } from "../src/dev/demo-market.js";
import {
  startFakeUpstream,
  type FakeUpstream,
  type FakeUpstreamOptions,
} from "./helpers/fake-upstream.js";
import { onboard, setOffer } from "./helpers/market.js";
import { eventually, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Parity of the chat path (issue 29's safety net). This pins, byte for byte, what clients get
 * from the gateway's chat path today, so that a rewrite of the pipeline (async generators to
 * push-based sinks) can be shown to change none of it. Each scenario below is one entry of the
 * golden file test/fixtures/parity/chat.json, holding:
 *
 * - `exchanges`: per request, what the client received: the HTTP status, the gateway's response
 *   headers (all but `date`, `connection` and `keep-alive`), the HTTP trailers (read with
 *   node:http, which fetch cannot), and the whole body as its lines (JSON answers and the raw
 *   SSE text, exactly as sent); for the gRPC scenarios the response metadata, every
 *   `StreamChatCompletionResponse` message (protobuf JSON, `chunk.data` decoded as UTF-8 text),
 *   and the final status with its trailing metadata.
 * - `closes`: the `inference_requests` row of each request the scenario made, once closed:
 *   status, tokens, credits, billing, usage source, the provider's claim and the gateway's count,
 *   error, settlement status, lease and authorization columns (not the instance or API key ids).
 * - `upstream`: the path and body of every request the gateway sent the fake provider.
 *
 * Values that differ between runs are replaced, per scenario, by placeholders numbered in order
 * of first appearance (so that ids that must be equal within a scenario still are): request ids
 * `<request-id-N>` (also inside `resp_`/`msg_` ids), quote ids `<quote-id-N>`, any other 32-byte
 * hex `<hex-N>`, log ids `<log-id-N>`, the fake provider's `chatcmpl-` ids `<chatcmpl-id-N>`,
 * authorization ids `<authorization-id-N>`, and times (`created`, `created_at`, ... within a day of
 * now) `<time>`. The demo market's ids (offers, models, permit) are deterministic and stay.
 *
 * Scenarios, in the order they run on one stack (one fake provider, `chunks: 3`, no delays):
 * chat JSON; chat SSE, without and with `stream_options.include_usage`; `/v1/responses` and
 * `/v1/messages`, JSON and SSE; an idempotent replay (the same Idempotency-Key twice, JSON and
 * SSE: both answers); gRPC `InferenceService.StreamChatCompletion`, JSON and SSE; the provider
 * failing mid-stream (chat SSE and both dialects); a client cancel mid-stream; failover before
 * the first byte (JSON and SSE; the demo chat offer's provider answers 500, the paused demo
 * offer, made active at twice the tariff, serves). The failover runs last: it leaves two active
 * offers behind.
 *
 * Nothing here depends on timing. Mid-stream events (a provider failing, a client cancelling)
 * happen at a point the test sees: the provider sends two content chunks and holds
 * (`stallAfterChunks`), and only once the client has received both does the test cut the
 * provider's connection (`cutStreams`) or its own. So a cancelled stream's bytes up to the cancel
 * are pinned too.
 *
 * Updating: `PARITY_UPDATE=1 npx vitest run test/parity.test.ts` rewrites the golden file from
 * the code as it is, only from a run in which every scenario passed its own checks (the scenarios
 * share one stack and run in order, so a partial run, `-t`, writes nothing). Do it only when a change of the bytes a client receives (or of a close) is
 * intended, and have the diff of the golden file reviewed with the change: the point of this test
 * is that a refactoring leaves the file as it is.
 */

const goldenFile = fileURLToPath(new URL("./fixtures/parity/chat.json", import.meta.url));
const updating = process.env.PARITY_UPDATE === "1";
/** The scenarios below (the golden file holds exactly these). */
const scenarioCount = 17;

const messages = [{ role: "user", content: "hello parity" }];
/**
 * Whether an SSE body received so far ends with the event of the second content chunk (" word1",
 * in any dialect): with `stallAfterChunks: 2` the provider sends nothing more.
 */
const relayedTwoChunks = (received: string) =>
  received.includes(' word1"') && received.endsWith("\n\n");
/** The fake provider's behaviour for every scenario unless it says otherwise. */
const upstreamDefaults: Partial<FakeUpstreamOptions> = {
  chunks: 3,
  delayMs: 0,
  failStatus: undefined,
  stallAfterChunks: undefined,
  omitUsage: false,
};

interface HttpExchange {
  status: number;
  headers: Record<string, string>;
  trailers: Record<string, string>;
  body: string[];
}

interface GrpcExchange {
  headers: Record<string, string>;
  messages: unknown[];
  status: { code: number; details: string; metadata: Record<string, string> };
}

interface Scenario {
  exchanges: unknown[];
  closes: Record<string, unknown>[];
  upstream: { path: string; body: unknown }[];
}

/** Headers that describe the connection, not the answer. */
const connectionHeaders = new Set(["date", "connection", "keep-alive"]);

function headerRecord(headers: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of Object.keys(headers).sort()) {
    if (connectionHeaders.has(name)) continue;
    const value = headers[name];
    out[name] = Array.isArray(value) ? value.join(", ") : String(value);
  }
  return out;
}

/**
 * One HTTP request with node:http (fetch does not expose trailers). `onBody` sees the body
 * received so far after each read. With `cancelWhen`, the client destroys the connection as soon
 * as the body received so far satisfies it, and the answer's `body` is what was received by then.
 */
function send(
  url: string,
  path: string,
  headers: Record<string, string>,
  body: unknown,
  watch: { cancelWhen?: (received: string) => boolean; onBody?: (received: string) => void } = {},
): Promise<HttpExchange> {
  const { cancelWhen, onBody } = watch;
  const payload = Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      `${url}${path}`,
      {
        method: "POST",
        agent: false,
        headers: {
          "content-type": "application/json",
          "content-length": String(payload.byteLength),
          ...headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        const exchange = (): HttpExchange => ({
          status: res.statusCode ?? 0,
          headers: headerRecord(res.headers),
          trailers: headerRecord(res.trailers),
          body: Buffer.concat(chunks).toString("utf8").split("\n"),
        });
        res.on("data", (chunk: Buffer) => {
          chunks.push(chunk);
          const received = Buffer.concat(chunks).toString("utf8");
          onBody?.(received);
          if (cancelWhen?.(received) === true) {
            const sofar = exchange();
            req.destroy();
            resolve(sofar);
          }
        });
        res.on("end", () => resolve(exchange()));
        res.on("error", (error) => (cancelWhen === undefined ? reject(error) : undefined));
      },
    );
    req.on("error", (error) => (cancelWhen === undefined ? reject(error) : undefined));
    req.end(payload);
  });
}

function metadataRecord(metadata: grpc.Metadata): Record<string, string> {
  const map = metadata.getMap();
  const out: Record<string, string> = {};
  for (const name of Object.keys(map).sort()) {
    if (connectionHeaders.has(name)) continue;
    const value = map[name]!;
    out[name] = typeof value === "string" ? value : `base64:${value.toString("base64")}`;
  }
  return out;
}

/** `InferenceService.StreamChatCompletion` with @grpc/grpc-js: metadata, messages, status. */
function grpcStream(
  url: string,
  apiKey: string,
  input: Parameters<typeof create<typeof StreamChatCompletionRequestSchema>>[1],
): Promise<{
  headers: grpc.Metadata;
  messages: StreamChatCompletionResponse[];
  status: grpc.StatusObject;
}> {
  const client = new grpc.Client(new URL(url).host, grpc.credentials.createInsecure());
  const method = InferenceService.method.streamChatCompletion;
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${apiKey}`);
  const call = client.makeServerStreamRequest(
    `/${method.parent.typeName}/${method.name}`,
    (value: unknown) => Buffer.from(toBinary(StreamChatCompletionRequestSchema, value as never)),
    (bytes: Buffer) => fromBinary(StreamChatCompletionResponseSchema, bytes),
    create(StreamChatCompletionRequestSchema, input),
    md,
  );
  const out: StreamChatCompletionResponse[] = [];
  let headers = new grpc.Metadata();
  call.on("metadata", (metadata: grpc.Metadata) => (headers = metadata));
  call.on("data", (message: StreamChatCompletionResponse) => out.push(message));
  return new Promise((resolve) => {
    call.on("error", () => undefined);
    call.on("status", (status: grpc.StatusObject) => {
      client.close();
      resolve({ headers, messages: out, status });
    });
  });
}

/**
 * Replaces what differs between runs, in order of first appearance, with numbered placeholders
 * (one numbering per kind). `requestIds` and `quoteIds` tell the 32-byte hex values apart;
 * `stable` are the demo market's, kept.
 */
class Normalizer {
  private readonly seen = new Map<string, Map<string, string>>();
  private readonly now = Math.floor(Date.now() / 1000);

  constructor(
    private readonly requestIds: ReadonlySet<string>,
    private readonly quoteIds: ReadonlySet<string>,
    private readonly stable: ReadonlySet<string>,
  ) {}

  private placeholder(kind: string, value: string): string {
    let values = this.seen.get(kind);
    if (values === undefined) this.seen.set(kind, (values = new Map()));
    let name = values.get(value);
    if (name === undefined) values.set(value, (name = `<${kind}-${values.size + 1}>`));
    return name;
  }

  private isTime(digits: string): boolean {
    const n = Number(digits);
    const seconds = digits.length >= 13 ? Math.floor(n / 1000) : n;
    return Math.abs(seconds - this.now) < 86_400;
  }

  text(text: string): string {
    return (
      text
        // 32-byte hex: a request id (also the tail of resp_/msg_ ids), a quote id, the market's.
        .replace(/(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])/g, (hex) => {
          const id = `0x${hex.toLowerCase()}`;
          if (this.stable.has(id)) return hex;
          if (this.requestIds.has(id)) return this.placeholder("request-id", id);
          if (this.quoteIds.has(id)) return this.placeholder("quote-id", id);
          return this.placeholder("hex", id);
        })
        .replace(/chatcmpl-[A-Za-z0-9]+/g, (id) => this.placeholder("chatcmpl-id", id))
        .replace(/pauth_[0-9a-f]+/g, (id) => this.placeholder("authorization-id", id))
        // The 12-byte request ids of logs (X-Request-Id).
        .replace(/(?<![0-9a-fA-F])[0-9a-f]{24}(?![0-9a-fA-F])/g, (id) =>
          this.placeholder("log-id", id),
        )
        .replace(
          /("(?:created|created_at|completed_at|expires_at|timestamp)"\s*:\s*)(\d{10,13})(?!\d)/g,
          (whole, key: string, digits: string) => (this.isTime(digits) ? `${key}<time>` : whole),
        )
    );
  }

  /** Every string in `value` normalized (keys kept), times of `timeKeys` as `<time>`. */
  deep(value: unknown, timeKeys: ReadonlySet<string> = new Set()): unknown {
    if (typeof value === "string") return this.text(value);
    if (Array.isArray(value)) return value.map((v) => this.deep(v, timeKeys));
    if (typeof value === "object" && value !== null) {
      const out: Record<string, unknown> = {};
      for (const [key, v] of Object.entries(value)) {
        out[key] =
          timeKeys.has(key) && v !== null && this.isTime(String(v))
            ? "<time>"
            : this.deep(v, timeKeys);
      }
      return out;
    }
    return value;
  }
}

const recordColumns = `id, model, model_id, offer_id, permit_id, quote_id, stream, status,
  input_tokens::text, output_tokens::text, cached_input_tokens::text, reasoning_tokens::text,
  maximum_credits::text, credits_charged::text, billing, usage_source, tariff_version::text, error,
  claimed_input_tokens::text, claimed_output_tokens::text, claimed_cached_input_tokens::text,
  claimed_reasoning_tokens::text, counted_input_tokens::text, counted_output_tokens::text,
  counted_cached_input_tokens::text, counted_reasoning_tokens::text, settlement_status, leased,
  authorization_id, authorization_capped, created_at::text, completed_at::text`;

describe("chat path parity (golden file test/fixtures/parity/chat.json)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let backupOffer: Hex;
  let backup: FakeUpstream | undefined;
  let golden: Record<string, Scenario> = {};
  const actual: Record<string, Scenario> = {};
  const known = new Set<string>();
  let upstreamSeen = 0;
  let backupSeen = 0;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({}, { chunks: 3 }));
    backupOffer = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
    if (!updating) golden = JSON.parse(readFileSync(goldenFile, "utf8")) as typeof golden;
    known.clear();
    for (const row of await rows()) known.add(row.id as string);
    upstreamSeen = fake.requests.length;
  }, 120_000);
  afterAll(async () => {
    if (updating && Object.keys(actual).length === scenarioCount) {
      mkdirSync(dirname(goldenFile), { recursive: true });
      writeFileSync(goldenFile, `${JSON.stringify(actual, null, 2)}\n`);
    }
    await backup?.stop();
    await fake?.stop();
    await stack?.close();
  });

  async function rows(): Promise<Record<string, unknown>[]> {
    const { rows } = await stack.database.db.pool.query<Record<string, unknown>>(
      `SELECT ${recordColumns} FROM inference_requests`,
    );
    return rows;
  }

  const headersFor = (path: string, extra: Record<string, string>): Record<string, string> => ({
    ...(path === "/v1/messages"
      ? { "x-api-key": stack.apiKey, "anthropic-version": "2023-06-01" }
      : { authorization: `Bearer ${stack.apiKey}` }),
    "x-gateway-permit": stack.demo.permitId,
    ...extra,
  });
  const post = (
    path: string,
    body: object,
    extra: Record<string, string> = {},
    watch: Parameters<typeof send>[4] = {},
  ) => send(stack.gateway.url, path, headersFor(path, extra), body, watch);

  /**
   * Runs a scenario's requests, waits until the `records` requests it made are closed, runs
   * `check` (what must hold of the scenario itself, golden file or not: a result that fails it is
   * not written), and compares (or, when updating, stores) the normalized result.
   */
  async function scenario(
    name: string,
    records: number,
    act: () => Promise<{ exchanges: (HttpExchange | GrpcExchange)[] }>,
    check: (result: Scenario) => void = () => undefined,
  ): Promise<void> {
    const { exchanges } = await act();
    let fresh: Record<string, unknown>[] = [];
    await eventually(async () => {
      fresh = (await rows()).filter((r) => !known.has(r.id as string));
      return (
        fresh.length >= records &&
        fresh.every((r) => r.status !== "pending" && r.status !== "streaming")
      );
    }, 15_000);
    for (const row of fresh) known.add(row.id as string);
    expect(fresh, `${name}: requests recorded`).toHaveLength(records);
    const upstream = [
      ...fake.requests.slice(upstreamSeen).map((r) => ({ path: r.path, body: r.body })),
      ...(backup?.requests.slice(backupSeen) ?? []).map((r) => ({
        path: `backup:${r.path}`,
        body: r.body,
      })),
    ];
    upstreamSeen = fake.requests.length;
    backupSeen = backup?.requests.length ?? 0;

    const { rows: quoteRows } = await stack.database.db.pool.query<{ quote_id: string }>(
      "SELECT quote_id FROM quotes",
    );
    const normalizer = new Normalizer(
      new Set((await rows()).map((r) => String(r.id).toLowerCase())),
      new Set([
        ...quoteRows.map((r) => r.quote_id.toLowerCase()),
        ...(await rows()).map((r) => String(r.quote_id).toLowerCase()),
      ]),
      new Set(
        [
          stack.demo.permitId,
          ...stack.demo.offers.map((o) => o.offerId),
          ...stack.demo.models.map((m) => m.modelId),
        ].map((id) => id.toLowerCase()),
      ),
    );
    const normalizedExchanges = exchanges.map((e) => normalizer.deep(e));
    // The order the client saw the ids in (a request's id is in its answer), then the rest.
    const closes = (
      fresh.map((row) => normalizer.deep(row, new Set(["created_at", "completed_at"]))) as Record<
        string,
        unknown
      >[]
    ).sort((a, b) => String(a.id).localeCompare(String(b.id), "en", { numeric: true }));
    const result: Scenario = {
      exchanges: normalizedExchanges,
      closes,
      upstream: normalizer.deep(upstream) as Scenario["upstream"],
    };
    check(result);
    actual[name] = result;
    if (!updating) {
      expect(golden[name], `${name}: in the golden file`).toBeDefined();
      expect(result, name).toEqual(golden[name]);
    }
  }

  const resetUpstream = () => fake.setOptions(upstreamDefaults);

  it("chat JSON", async () => {
    resetUpstream();
    await scenario("chat-json", 1, async () => ({
      exchanges: [
        await post("/v1/chat/completions", { model: "demo-chat", messages, max_tokens: 16 }),
      ],
    }));
  });

  it("chat SSE", async () => {
    resetUpstream();
    await scenario("chat-sse", 1, async () => ({
      exchanges: [
        await post("/v1/chat/completions", { model: "demo-chat", messages, stream: true }),
      ],
    }));
  });

  it("chat SSE with stream_options.include_usage", async () => {
    resetUpstream();
    await scenario("chat-sse-include-usage", 1, async () => ({
      exchanges: [
        await post("/v1/chat/completions", {
          model: "demo-chat",
          messages,
          stream: true,
          stream_options: { include_usage: true },
        }),
      ],
    }));
  });

  const responsesBody = { model: "demo-chat", input: "hello parity", instructions: "be brief" };
  const messagesBody = {
    model: "demo-chat",
    max_tokens: 64,
    system: "be brief",
    messages: [{ role: "user", content: "hello parity" }],
  };

  it("/v1/responses JSON", async () => {
    resetUpstream();
    await scenario("responses-json", 1, async () => ({
      exchanges: [await post("/v1/responses", { ...responsesBody, max_output_tokens: 64 })],
    }));
  });

  it("/v1/responses SSE", async () => {
    resetUpstream();
    await scenario("responses-sse", 1, async () => ({
      exchanges: [await post("/v1/responses", { ...responsesBody, stream: true })],
    }));
  });

  it("/v1/messages JSON", async () => {
    resetUpstream();
    await scenario("messages-json", 1, async () => ({
      exchanges: [await post("/v1/messages", messagesBody)],
    }));
  });

  it("/v1/messages SSE", async () => {
    resetUpstream();
    await scenario("messages-sse", 1, async () => ({
      exchanges: [await post("/v1/messages", { ...messagesBody, stream: true })],
    }));
  });

  it("idempotent replay, JSON: the same Idempotency-Key twice", async () => {
    resetUpstream();
    await scenario(
      "idempotent-replay-json",
      1,
      async () => {
        const body = { model: "demo-chat", messages, max_tokens: 16 };
        const headers = { "idempotency-key": "parity-replay-json" };
        const first = await post("/v1/chat/completions", body, headers);
        const second = await post("/v1/chat/completions", body, headers);
        return { exchanges: [first, second] };
      },
      // One upstream call: the second answer is the stored one.
      (result) => expect(result.upstream).toHaveLength(1),
    );
  });

  it("idempotent replay, SSE: the same Idempotency-Key twice", async () => {
    resetUpstream();
    await scenario(
      "idempotent-replay-sse",
      1,
      async () => {
        const body = { model: "demo-chat", messages, stream: true };
        const headers = { "idempotency-key": "parity-replay-sse" };
        const first = await post("/v1/chat/completions", body, headers);
        const second = await post("/v1/chat/completions", body, headers);
        return { exchanges: [first, second] };
      },
      (result) => expect(result.upstream).toHaveLength(1),
    );
  });

  async function grpcExchange(body: object): Promise<GrpcExchange> {
    const {
      headers,
      messages: out,
      status,
    } = await grpcStream(stack.gateway.url, stack.apiKey, {
      body: new TextEncoder().encode(JSON.stringify(body)),
      permitId: stack.demo.permitId,
      dialect: Dialect.UNSPECIFIED,
    });
    return {
      headers: metadataRecord(headers),
      messages: out.map((message) => {
        const json = toJson(StreamChatCompletionResponseSchema, message) as Record<string, unknown>;
        if (message.event.case === "chunk") {
          const chunk = json.chunk as Record<string, unknown>;
          chunk.data = new TextDecoder().decode(message.event.value.data);
        }
        return json;
      }),
      status: {
        code: status.code,
        details: status.details,
        metadata: metadataRecord(status.metadata),
      },
    };
  }

  it("gRPC StreamChatCompletion, JSON", async () => {
    resetUpstream();
    await scenario("grpc-json", 1, async () => ({
      exchanges: [await grpcExchange({ model: "demo-chat", messages, max_tokens: 16 })],
    }));
  });

  it("gRPC StreamChatCompletion, SSE", async () => {
    resetUpstream();
    await scenario("grpc-sse", 1, async () => ({
      exchanges: [await grpcExchange({ model: "demo-chat", messages, stream: true })],
    }));
  });

  /**
   * The provider dies mid-stream: it sends two content chunks and holds, and once the client has
   * received both through the gateway, its connection is cut. (Not `failMidStream`, which
   * destroys the socket in the same turn as its last writes: which of those bytes reach the
   * gateway, and which the gateway reads before it sees the close, is up to timing.)
   */
  const midStreamFailure = (name: string, path: string, body: object) =>
    scenario(name, 1, async () => {
      fake.setOptions({ chunks: 4, stallAfterChunks: 2 });
      let cut = 0;
      const exchange = await post(
        path,
        body,
        {},
        {
          onBody: (received) => {
            if (cut === 0 && relayedTwoChunks(received)) cut = fake.cutStreams();
          },
        },
      );
      expect(cut, `${name}: streams cut`).toBe(1);
      return { exchanges: [exchange] };
    });

  it("provider failure mid-stream, chat SSE", async () => {
    resetUpstream();
    await midStreamFailure("midstream-failure-chat-sse", "/v1/chat/completions", {
      model: "demo-chat",
      messages,
      stream: true,
    });
  });

  it("provider failure mid-stream, /v1/responses SSE", async () => {
    resetUpstream();
    await midStreamFailure("midstream-failure-responses-sse", "/v1/responses", {
      ...responsesBody,
      stream: true,
    });
  });

  it("provider failure mid-stream, /v1/messages SSE", async () => {
    resetUpstream();
    await midStreamFailure("midstream-failure-messages-sse", "/v1/messages", {
      ...messagesBody,
      stream: true,
    });
  });

  it("client cancel mid-stream, chat SSE", async () => {
    resetUpstream();
    // The provider sends two content chunks and then holds: what the gateway relayed (and so
    // what it charges) is the same on every run, whenever the cancel reaches it.
    fake.setOptions({ chunks: 10, stallAfterChunks: 2 });
    await scenario("client-cancel-chat-sse", 1, async () => {
      const received = await post(
        "/v1/chat/completions",
        { model: "demo-chat", messages, stream: true },
        {},
        { cancelWhen: relayedTwoChunks },
      );
      const upstreamCall = fake.requests.at(-1)!;
      expect(await upstreamCall.finished).toBe("aborted");
      return { exchanges: [received] };
    });
  });

  describe("failover before the first byte (the first offer answers 500, a dearer second serves)", () => {
    beforeAll(async () => {
      backup = await startFakeUpstream({ models: ["demo-chat"], chunks: 3 });
      // The paused demo offer, active at twice the tariff: ranked after the demo chat offer.
      await setOffer(stack, backupOffer, {
        status: 0,
        tariff: {
          input: demoTariff.inputPricePerMTok * 2n,
          output: demoTariff.outputPricePerMTok * 2n,
          wake: 0n,
        },
      });
      await onboard(stack, backupOffer, backup.url);
      backupSeen = backup.requests.length;
      upstreamSeen = fake.requests.length;
    });

    for (const stream of [false, true]) {
      it(stream ? "SSE" : "JSON", async () => {
        resetUpstream();
        fake.setOptions({ failStatus: 500 });
        await scenario(
          `failover-${stream ? "sse" : "json"}`,
          1,
          async () => ({
            exchanges: [
              await post("/v1/chat/completions", {
                model: "demo-chat",
                messages,
                ...(stream ? { stream } : { max_tokens: 16 }),
              }),
            ],
          }),
          (result) => {
            // The first offer was called (and failed), then the second served and was charged.
            expect(result.upstream.map((u) => u.path)).toEqual([
              "/v1/chat/completions",
              "backup:/v1/chat/completions",
            ]);
            expect(result.closes.map((c) => c.offer_id)).toEqual([backupOffer.toLowerCase()]);
          },
        );
      });
    }
  });

  it("the golden file holds exactly the scenarios run", () => {
    const names = Object.keys(actual).sort();
    expect(names).toHaveLength(scenarioCount);
    if (!updating) expect(Object.keys(golden).sort()).toEqual(names);
  });
});
