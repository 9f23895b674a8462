import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InferenceService } from "../gen/gateway/v1/inference_pb.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { grpcClient, grpcServerStream } from "./helpers/grpc.js";
import { reportedCharge, sseData } from "./helpers/sse.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * What an Idempotency-Key keeps is bounded per answer (DESIGN.md 8, issue 18): an answer larger
 * than IDEMPOTENCY_MAX_RESULT_BYTES completes for its client and is charged once; its replay is
 * 409 `idempotency_result_too_large`, with no provider call and no charge. A small answer still
 * replays as before.
 */
describe("Idempotency-Key result bound", () => {
  const maxBytes = 4096;
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    // 200 content chunks: about 30 KiB of chunk data, far above the bound.
    ({ stack, fake } = await startChatStack(
      { IDEMPOTENCY_MAX_RESULT_BYTES: String(maxBytes) },
      { chunks: 200 },
    ));
  }, 60_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const chat = (key: string, body: object) =>
    authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": stack.demo.permitId,
        "idempotency-key": key,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "a long answer" }],
        ...body,
      }),
    });

  /** Records of `requestId`: one, however often its key is replayed. */
  async function ledgerRows(requestId: string) {
    const { rows } = await stack.database.db.pool.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM inference_requests WHERE id = $1",
      [requestId.toLowerCase()],
    );
    return rows[0]!.n;
  }

  async function expectTooLargeReplay(key: string, body: object, requestId: string) {
    const calls = fake.calls("/v1/chat/completions");
    const before = await json(await authed(stack, `/v1/requests/${requestId}`));
    const replay = await chat(key, body);
    expect(replay.status).toBe(409);
    expect(replay.headers.get("content-type")).toMatch(/^application\/json/);
    const error = await json(replay);
    expect(error).toEqual({
      error: {
        code: "idempotency_result_too_large",
        type: "conflict_error",
        message: `the answer to this Idempotency-Key (request ${requestId}) was larger than ${maxBytes} bytes and was not kept, so it cannot be replayed; it was charged once (GET /v1/requests/${requestId})`,
      },
    });
    // No provider call, no new request, the charge unchanged.
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    expect(await ledgerRows(requestId)).toBe(1);
    const after = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(after.credits_charged).toBe(before.credits_charged);
    expect(after.status).toBe("completed");
  }

  it("a streamed answer above the bound completes and is charged once; its replay is 409 idempotency_result_too_large without a provider call", async () => {
    // Room for the 200 words (about 700 tokens): the gateway cuts an answer at its priced limit.
    const body = { stream: true, max_tokens: 2000 };
    const res = await chat("bound-stream-1", body);
    expect(res.status).toBe(200);
    const events = sseData(await res.text());
    const requestId = res.headers.get("x-gateway-request-id")!;
    // The whole answer: the role chunk, 200 content chunks, the finish chunk, the gateway's last
    // chunk and [DONE] (the usage chunk was not asked for).
    expect(events).toHaveLength(204);
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(record).toMatchObject({ status: "completed", billing: "billed", output_tokens: "200" });
    expect(reportedCharge(events)).toBe(BigInt(record.credits_charged));
    await expectTooLargeReplay("bound-stream-1", body, requestId);
    // And again: the stored result stays the error.
    await expectTooLargeReplay("bound-stream-1", body, requestId);
  });

  it("over gRPC: the replay of a key whose answer was too large is aborted with the reason, no provider call", async () => {
    const client = grpcClient(stack.gateway.url);
    try {
      const call = () =>
        grpcServerStream(
          client,
          InferenceService.method.streamChatCompletion,
          {
            body: new TextEncoder().encode(
              JSON.stringify({
                model: "demo-chat",
                messages: [{ role: "user", content: "a long answer" }],
                stream: true,
                max_tokens: 2000,
              }),
            ),
            permitId: stack.demo.permitId,
            idempotencyKey: "bound-grpc-1",
          },
          { authorization: `Bearer ${stack.apiKey}` },
        );
      const first = await call();
      expect(first.at(-1)?.event.case).toBe("completed");
      const calls = fake.calls("/v1/chat/completions");
      const error = (await call().catch((e: grpc.ServiceError) => e)) as grpc.ServiceError;
      expect(error.code).toBe(grpc.status.ABORTED);
      const details = error.metadata.get("grpc-status-details-bin")[0] as Buffer;
      expect(details.toString("latin1")).toContain("idempotency_result_too_large");
      expect(fake.calls("/v1/chat/completions")).toBe(calls);
    } finally {
      client.close();
    }
  });

  it("a JSON answer above the bound: the same", async () => {
    fake.setOptions({ chunks: 1000 });
    try {
      // Room for the 1000 words (about 3,700 tokens), which the gateway would otherwise cut.
      const body = { max_tokens: 5000 };
      const res = await chat("bound-json-1", body);
      expect(res.status).toBe(200);
      const answer = await json(res);
      expect(answer.usage.completion_tokens).toBe(1000);
      const requestId = res.headers.get("x-gateway-request-id")!;
      await expectTooLargeReplay("bound-json-1", body, requestId);
    } finally {
      fake.setOptions({ chunks: 200 });
    }
  });

  it("an answer within the bound still replays whole, with no provider call", async () => {
    const body = { stream: true, max_tokens: 5 };
    const res = await chat("bound-small-1", body);
    const first = await res.text();
    const calls = fake.calls("/v1/chat/completions");
    const replay = await chat("bound-small-1", body);
    expect(replay.status).toBe(200);
    expect(await replay.text()).toBe(first);
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
  });
});
