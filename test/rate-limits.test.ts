import * as grpc from "@grpc/grpc-js";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { CatalogService } from "../gen/gateway/v1/catalog_pb.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { authorizeKey } from "./helpers/authorize.js";
import { auditSecret } from "./helpers/log-audit.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Per-API-key limits (issue 12): a token bucket on requests (REST and RPC share it), and the
 * key's concurrent chat streams. 429 `rate_limited` with an integer Retry-After.
 */
describe("rate limits per API key", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permitId: Hex;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(
      { RATE_LIMIT_RPS: "1", RATE_LIMIT_BURST: "5", MAX_STREAMS_PER_KEY: "1" },
      { chunks: 4 },
    ));
    permitId = stack.demo.permitId;
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => fake.setOptions({ delayMs: 0, failStatus: undefined, chunks: 4 }));

  /** A fresh API key: its own, full bucket. */
  const newKey = async (): Promise<string> => {
    const { key } = await createApiKey(stack.database.db.pool, "limits");
    auditSecret("api key", key);
    return key;
  };
  /**
   * A fresh key the demo payer authorized to spend its permits (DESIGN.md section 8), with its
   * bucket full again: authorizing takes two requests of the key, refilled at 1 per second.
   */
  const newChatKey = async (): Promise<string> => {
    const key = await newKey();
    await authorizeKey(stack.gateway.url, key, stack.roles.payer.privateKey);
    await new Promise((r) => setTimeout(r, 2100));
    return key;
  };
  const get = (key: string, path = "/v1/models") =>
    fetch(`${stack.gateway.url}${path}`, { headers: { authorization: `Bearer ${key}` } });
  const chat = (key: string, body: object, signal?: AbortSignal) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "x-gateway-permit": permitId,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hi" }],
        ...body,
      }),
      ...(signal === undefined ? {} : { signal }),
    });
  const chatCalls = () => fake.calls("/v1/chat/completions");

  it("answers 429 rate_limited with an integer Retry-After once the burst is spent, and refills", async () => {
    const key = await newKey();
    for (let i = 0; i < 5; i++) expect((await get(key)).status).toBe(200);
    const refused = await get(key);
    expect(refused.status).toBe(429);
    const retryAfter = refused.headers.get("retry-after");
    expect(retryAfter).toMatch(/^[1-9]\d*$/);
    expect(await json(refused)).toEqual({
      error: { code: "rate_limited", type: "rate_limit_error", message: expect.any(String) },
    });
    // Another key is not affected.
    expect((await get(await newKey())).status).toBe(200);
    // A token comes back after about a second (1 per second).
    await eventually(async () => (await get(key)).status === 200, 5000, 250);
  });

  it("shares one bucket between REST and gRPC, and answers RPCs resource_exhausted with the reason", async () => {
    const key = await newKey();
    for (let i = 0; i < 3; i++) expect((await get(key)).status).toBe(200);
    const client = grpcClient(stack.gateway.url);
    try {
      const call = () =>
        grpcUnary(client, CatalogService.method.listModels, {}, { authorization: `Bearer ${key}` });
      await call();
      await call();
      const error = (await call().catch((e: grpc.ServiceError) => e)) as grpc.ServiceError;
      expect(error.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
      expect(String(error.metadata.get("retry-after")[0])).toMatch(/^[1-9]\d*$/);
      // The ErrorInfo detail (google.rpc.Status in grpc-status-details-bin) carries the code.
      const details = error.metadata.get("grpc-status-details-bin")[0] as Buffer;
      expect(details.toString("latin1")).toContain("rate_limited");
    } finally {
      client.close();
    }
  });

  it("admits one stream per key at a time: a second gets 429 with Retry-After 1 and no provider call", async () => {
    const key = await newChatKey();
    fake.setOptions({ delayMs: 150, chunks: 20 });
    const first = new AbortController();
    const open = await chat(key, { stream: true }, first.signal);
    expect(open.status).toBe(200);
    const reader = open.body!.getReader();
    await reader.read(); // the stream is under way
    const calls = chatCalls();
    const second = await chat(key, { stream: true });
    expect(second.status).toBe(429);
    expect(second.headers.get("retry-after")).toBe("1");
    expect((await json(second)).error.code).toBe("rate_limited");
    expect(chatCalls()).toBe(calls);
    // A JSON answer is not a stream: it is not counted.
    fake.setOptions({ delayMs: 0 });
    expect((await chat(key, { stream: false })).status).toBe(200);
    // Other keys have their own count.
    const other = await chat(await newChatKey(), { stream: true });
    expect(other.status).toBe(200);
    await other.text();
    // The client disconnects: its slot is released.
    first.abort();
    await reader.cancel().catch(() => undefined);
    await eventually(
      async () => {
        const next = await chat(key, { stream: true });
        await next.text();
        return next.status === 200;
      },
      5000,
      200,
    );
  });

  it("releases the slot when a stream completes and when it fails", async () => {
    const key = await newChatKey();
    // Completes.
    const done = await chat(key, { stream: true });
    expect(done.status).toBe(200);
    expect(await done.text()).toContain("data: [DONE]");
    // Fails before the first byte (the provider answers 500).
    fake.setOptions({ failStatus: 500 });
    const failed = await chat(key, { stream: true });
    expect(failed.status).toBe(502);
    await failed.text();
    fake.setOptions({ failStatus: undefined });
    // Each released its slot: the next stream is admitted at once.
    const next = await chat(key, { stream: true });
    expect(next.status).toBe(200);
    expect(await next.text()).toContain("data: [DONE]");
  });
});
