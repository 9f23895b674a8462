import * as grpc from "@grpc/grpc-js";
import type { Hex } from "viem";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { InferenceService, PermitState } from "../gen/gateway/v1/inference_pb.js";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { createApiKey } from "../src/adapters/pg/api-keys.js";
import { authorizeKey } from "./helpers/authorize.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { auditSecret } from "./helpers/log-audit.js";
import { closePermit, openPermit, requestClose } from "./helpers/market.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

const messages = [{ role: "user" as const, content: "what is my balance?" }];
const deposit = 10n ** 18n;

describe("permit balance: GET /v1/permits/{id} and InferenceService.GetPermit", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let offset = 0;
  const clock = () => Math.floor(Date.now() / 1000) + offset;
  let chatOffer: Hex;

  beforeAll(async () => {
    ({ stack, fake, chatOffer } = await startChatStack({}, { clock, chunks: 5 }));
  });
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });
  beforeEach(() => {
    offset = 0;
    fake.setOptions({ delayMs: 0 });
  });

  const balance = async (permitId: string) => {
    const res = await authed(stack, `/v1/permits/${permitId}`);
    const body = await json(res);
    expect(res.status, JSON.stringify(body)).toBe(200);
    return body;
  };
  /** The chain's time now (anvil's clock runs ahead of the wall clock once a test skipped time). */
  const chainNow = async () => (await stack.clients.publicClient.getBlock()).timestamp;

  it("shows a fresh permit: open, nothing charged or held, the whole deposit available", async () => {
    const expiresAt = (await chainNow()) + 7n * 24n * 3600n;
    const permitId = await openPermit(stack, { deposit, expiresAt });
    expect(await balance(permitId)).toEqual({
      permit_id: permitId,
      state: "open",
      model_id: stack.demo.models[0]!.modelId,
      offer_id: null,
      payer: stack.roles.payer.address.toLowerCase(),
      expires_at: Number(expiresAt),
      closable_at: null,
      deposit: deposit.toString(),
      settled: "0",
      charged_unsettled: "0",
      reserved: "0",
      available: deposit.toString(),
    });

    const pinned = await openPermit(stack, { deposit: 5n, offerId: chatOffer });
    expect(await balance(pinned)).toMatchObject({
      permit_id: pinned,
      offer_id: chatOffer,
      deposit: "5",
      available: "5",
    });
  });

  it("answers the API keys the payer authorized, and refuses 403 permit_not_authorized any other", async () => {
    const other = await createApiKey(stack.database.db.pool, "another client");
    auditSecret("api key", other.key);
    const ask = () =>
      fetch(`${stack.gateway.url}/v1/permits/${stack.demo.permitId}`, {
        headers: { authorization: `Bearer ${other.key}` },
      });
    const refused = await ask();
    expect(refused.status).toBe(403);
    expect((await json(refused)).error).toMatchObject({
      code: "permit_not_authorized",
      type: "permission_error",
    });
    await authorizeKey(stack.gateway.url, other.key, stack.roles.payer.privateKey, {
      permitId: stack.demo.permitId,
    });
    const res = await ask();
    expect(res.status).toBe(200);
    expect(await json(res)).toMatchObject({
      permit_id: stack.demo.permitId,
      deposit: stack.demo.permitDeposit.toString(),
    });
  });

  it("holds a request's maximum while it is in flight, then its charge exactly", async () => {
    const permitId = await openPermit(stack, { deposit });
    const body = { model: "demo-chat", messages, max_tokens: 16 };
    const quoteRes = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(quoteRes.status).toBe(200);
    const quote = await json(quoteRes);
    const maximum = BigInt(quote.maximum_credits);
    expect(maximum).toBeGreaterThan(0n);

    fake.setOptions({ delayMs: 1500 });
    const calls = fake.calls("/v1/chat/completions");
    const answer = authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "x-gateway-permit": permitId,
        "x-gateway-quote": quote.quote_id,
      },
      body: JSON.stringify(body),
    });
    // The reservation commits before the provider is called: once the provider has the request,
    // the balance must show it.
    await eventually(async () => fake.calls("/v1/chat/completions") > calls, 5000, 10);
    expect(await balance(permitId)).toMatchObject({
      state: "open",
      settled: "0",
      charged_unsettled: "0",
      reserved: maximum.toString(),
      available: (deposit - maximum).toString(),
    });

    const res = await answer;
    expect(res.status).toBe(200);
    await res.text();
    const requestId = res.headers.get("x-gateway-request-id")!;
    // Reading the record waits until this process has committed the charge.
    const record = await json(await authed(stack, `/v1/requests/${requestId}`));
    expect(record).toMatchObject({
      permit_id: permitId,
      status: "completed",
      maximum_credits: maximum.toString(),
    });
    const charged = BigInt(record.credits_charged);
    expect(charged).toBeGreaterThan(0n);
    expect(res.headers.get("x-gateway-credits-charged")).toBe(charged.toString());
    expect(await balance(permitId)).toMatchObject({
      settled: "0",
      charged_unsettled: charged.toString(),
      reserved: "0",
      available: (deposit - charged).toString(),
    });
  });

  it("shows a closing permit with closable_at and nothing available", async () => {
    const permitId = await openPermit(stack, { deposit });
    await requestClose(stack, permitId);
    const grace = await stack.clients.publicClient.readContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "closeGracePeriod",
    });
    const closableAt = Number((await chainNow()) + grace);
    expect(await balance(permitId)).toMatchObject({
      permit_id: permitId,
      state: "closing",
      closable_at: closableAt,
      deposit: deposit.toString(),
      reserved: "0",
      available: "0",
    });
  });

  it("shows a closed permit as closed with nothing available, its unsettled charges still counted", async () => {
    const permitId = await openPermit(stack, { deposit });
    const res = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": permitId },
      body: JSON.stringify({ model: "demo-chat", messages }),
    });
    expect(res.status).toBe(200);
    await res.text();
    const record = await json(
      await authed(stack, `/v1/requests/${res.headers.get("x-gateway-request-id")}`),
    );
    expect(BigInt(record.credits_charged)).toBeGreaterThan(0n);

    await closePermit(stack, permitId);
    // The indexer drops the cached permit on PermitClosed.
    let closed: Record<string, unknown> = {};
    await eventually(async () => {
      closed = await balance(permitId);
      // (and the lease this process held on it is given back on the close request)
      return closed.state === "closed" && closed.reserved === "0";
    });
    expect(closed).toMatchObject({
      state: "closed",
      closable_at: expect.any(Number),
      deposit: deposit.toString(),
      settled: "0",
      // The charge can no longer settle (the deposit went back to the payer); it stays counted.
      charged_unsettled: record.credits_charged,
      reserved: "0",
      available: "0",
    });
  });

  it("shows nothing available once the permit expired by the gateway's clock", async () => {
    const expiresAt = (await chainNow()) + 3600n;
    const permitId = await openPermit(stack, { deposit, expiresAt });
    expect(await balance(permitId)).toMatchObject({ available: deposit.toString() });
    offset = Number(expiresAt) - Math.floor(Date.now() / 1000); // the gateway's clock at the expiry
    expect(await balance(permitId)).toMatchObject({
      state: "open",
      expires_at: Number(expiresAt),
      deposit: deposit.toString(),
      available: "0",
    });
  });

  it("refuses chat 402 permit_expired and shows nothing available once the chain's time passed expires_at, though the gateway's clock has not", async () => {
    const expiresAt = (await chainNow()) + 3600n;
    const permitId = await openPermit(stack, { deposit, expiresAt });
    const chat = () =>
      authed(stack, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json", "x-gateway-permit": permitId },
        body: JSON.stringify({ model: "demo-chat", messages, max_tokens: 16 }),
      });
    const admitted = await chat();
    expect(admitted.status).toBe(200);
    await admitted.text();
    const charged = admitted.headers.get("x-gateway-credits-charged")!;
    expect(BigInt(charged)).toBeGreaterThan(0n);

    // The chain's time moves two hours on; the gateway's clock (the wall clock) stays before
    // the expiry.
    await stack.clients.publicClient.request({
      method: "evm_increaseTime" as never,
      params: [7200] as never,
    });
    await stack.clients.publicClient.request({ method: "evm_mine" as never, params: [] as never });
    expect(await chainNow()).toBeGreaterThan(expiresAt);
    expect(clock()).toBeLessThan(Number(expiresAt));
    // The gateway learns the block's time from the head its indexer reads anyway (a pass now,
    // rather than waiting for the poll).
    await stack.gateway.indexer.syncOnce();

    const calls = fake.calls("/v1/chat/completions");
    const refused = await chat();
    expect(refused.status).toBe(402);
    expect(await json(refused)).toEqual({
      error: {
        code: "permit_expired",
        type: "payment_required",
        message: `permit ${permitId} has expired`,
      },
    });
    expect(fake.calls("/v1/chat/completions")).toBe(calls);
    // Reading the record waits for the first answer's charge to commit.
    await authed(stack, `/v1/requests/${admitted.headers.get("x-gateway-request-id")}`);
    let view: Record<string, unknown> = {};
    // (the lease this process held on the permit goes back once it is idle)
    await eventually(async () => {
      view = await balance(permitId);
      return view.reserved === "0";
    });
    expect(view).toEqual({
      permit_id: permitId,
      state: "open",
      model_id: stack.demo.models[0]!.modelId,
      offer_id: null,
      payer: stack.roles.payer.address.toLowerCase(),
      expires_at: Number(expiresAt),
      closable_at: null,
      deposit: deposit.toString(),
      settled: "0",
      charged_unsettled: charged,
      reserved: "0",
      available: "0",
    });
  });

  describe("errors, with the spec's error body", () => {
    const expectError = async (res: Response, status: number, code: string, type: string) => {
      expect(res.status).toBe(status);
      const body = await json(res);
      expect(body).toEqual({ error: { code, type, message: expect.any(String) } });
      expect(body.error.message.length).toBeGreaterThan(0);
    };

    it("401 without an API key or with an unknown one", async () => {
      const none = await fetch(`${stack.gateway.url}/v1/permits/${stack.demo.permitId}`);
      await expectError(none, 401, "missing_api_key", "authentication_error");
      expect(none.headers.get("www-authenticate")).toBe("Bearer");
      const wrong = await fetch(`${stack.gateway.url}/v1/permits/${stack.demo.permitId}`, {
        headers: { authorization: "Bearer sk_not_a_key" },
      });
      await expectError(wrong, 401, "invalid_api_key", "authentication_error");
    });

    it("400 invalid_hex for an id that is not Hex32", async () => {
      for (const bad of ["0x1234", "permit", `${stack.demo.permitId}00`, `0x${"zz".repeat(32)}`]) {
        await expectError(
          await authed(stack, `/v1/permits/${bad}`),
          400,
          "invalid_hex",
          "invalid_request_error",
        );
      }
    });

    it("402 permit_not_found for a Hex32 id the market does not know", async () => {
      await expectError(
        await authed(stack, `/v1/permits/0x${"42".repeat(32)}`),
        402,
        "permit_not_found",
        "payment_required",
      );
    });

    it("405 for another method on the route", async () => {
      const res = await authed(stack, `/v1/permits/${stack.demo.permitId}`, { method: "POST" });
      expect(res.status).toBe(405);
    });
  });

  it("answers the same balance over gRPC (@grpc/grpc-js)", async () => {
    const permitId = await openPermit(stack, { deposit, offerId: chatOffer });
    const closing = await openPermit(stack, { deposit: 7n });
    await requestClose(stack, closing);
    const client = grpcClient(stack.gateway.url);
    const auth = { authorization: `Bearer ${stack.apiKey}` };
    try {
      const { permit } = await grpcUnary(
        client,
        InferenceService.method.getPermit,
        { permitId },
        auth,
      );
      const rest = await balance(permitId);
      expect(permit).toMatchObject({
        permitId,
        state: PermitState.OPEN,
        modelId: rest.model_id,
        offerId: chatOffer,
        payer: rest.payer,
        expiresAt: BigInt(rest.expires_at),
        deposit: deposit.toString(),
        settled: "0",
        chargedUnsettled: "0",
        reserved: "0",
        available: deposit.toString(),
      });
      expect(permit?.closableAt).toBeUndefined();

      const { permit: closingPermit } = await grpcUnary(
        client,
        InferenceService.method.getPermit,
        { permitId: closing },
        auth,
      );
      const closingRest = await balance(closing);
      expect(closingPermit).toMatchObject({
        state: PermitState.CLOSING,
        offerId: "",
        closableAt: BigInt(closingRest.closable_at),
        available: "0",
      });

      const unknown = await grpcUnary(
        client,
        InferenceService.method.getPermit,
        { permitId: `0x${"42".repeat(32)}` },
        auth,
      ).catch((e: grpc.ServiceError) => e);
      expect((unknown as grpc.ServiceError).code).toBe(grpc.status.FAILED_PRECONDITION);
      const bad = await grpcUnary(
        client,
        InferenceService.method.getPermit,
        { permitId: "0x12" },
        auth,
      ).catch((e: grpc.ServiceError) => e);
      expect((bad as grpc.ServiceError).code).toBe(grpc.status.INVALID_ARGUMENT);
      const anonymous = await grpcUnary(client, InferenceService.method.getPermit, {
        permitId,
      }).catch((e: grpc.ServiceError) => e);
      expect((anonymous as grpc.ServiceError).code).toBe(grpc.status.UNAUTHENTICATED);
    } finally {
      client.close();
    }
  });
});
