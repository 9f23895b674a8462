import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import type { PaymentPayload, PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { getAddress, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { settlingEnv } from "./helpers/settlement.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Issue 37: agents pay per request with x402 `upto` (DESIGN.md section 11). What a caller without
 * a key is asked to pay, and the payments refused before anything else happens: no provider
 * call, nothing reserved. (The paid path on chain: x402-settlement.test.ts.)
 */

const chatBody = {
  model: "demo-chat",
  messages: [{ role: "user", content: "hello from an agent" }],
  max_tokens: 64,
};

/** The three dialects' routes and a body each, for the same request. */
const routes = [
  { path: "/v1/chat/completions", body: chatBody },
  {
    path: "/v1/responses",
    body: { model: "demo-chat", input: "hello from an agent", max_output_tokens: 64 },
  },
  {
    path: "/v1/messages",
    body: {
      model: "demo-chat",
      max_tokens: 64,
      messages: [{ role: "user", content: "hello from an agent" }],
    },
  },
] as const;

describe("x402: a chat request without credentials", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${stack.gateway.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });

  /** The quote's maximum for `body` on `path`'s dialect, as a key holder is quoted it. */
  async function quotedMaximum(body: unknown): Promise<string> {
    const res = await authed(stack, "/v1/quotes", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    return String((await json(res)).maximum_credits);
  }

  async function required(res: Response): Promise<PaymentRequired> {
    const header = res.headers.get("payment-required");
    expect(header).not.toBeNull();
    return decodePaymentRequiredHeader(header!);
  }

  it("is answered 402 with an upto payment of the request's priced maximum, in every dialect", async () => {
    const model = stack.demo.models.find((m) => m.id === "demo-chat")!;
    const creditToken = model.creditToken;
    const maximum = await quotedMaximum(chatBody);
    for (const { path, body } of routes) {
      const before = fake.requests.length;
      const res = await post(path, body);
      expect({ path, status: res.status }).toEqual({ path, status: 402 });
      const paymentRequired = await required(res);
      expect(paymentRequired.x402Version).toBe(2);
      expect(paymentRequired.resource.url).toBe(`http://gateway${path}`);
      expect(paymentRequired.accepts).toEqual([
        {
          scheme: "upto",
          network: `eip155:${stack.anvil.chainId}`,
          asset: getAddress(creditToken),
          amount: maximum,
          payTo: getAddress(stack.demo.market),
          maxTimeoutSeconds: 300,
          extra: { facilitatorAddress: getAddress(stack.demo.market) },
        },
      ]);
      const text = await res.text();
      expect(text).toContain("payment_required");
      expect(fake.requests.length).toBe(before);
    }
  });

  it("with a bad API key stays 401, and with a key nothing changes", async () => {
    const bad = await post("/v1/chat/completions", chatBody, {
      authorization: "Bearer gw_not_a_key",
    });
    expect(bad.status).toBe(401);
    expect(bad.headers.get("payment-required")).toBeNull();
    expect((await json(bad)).error.code).toBe("invalid_api_key");
    const keyed = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    // The key has no permit named: the permit rule answers, not x402.
    expect(keyed.status).toBe(402);
    expect(keyed.headers.get("payment-required")).toBeNull();
    expect((await json(keyed)).error.code).toBe("permit_missing");
  });

  /** A payment signed by `signer` for `requirements` (changed by `edit`), as @x402/evm makes it. */
  async function signed(
    requirements: PaymentRequirements,
    key: Hex = generatePrivateKey(),
  ): Promise<PaymentPayload> {
    const account = privateKeyToAccount(key);
    const scheme = new UptoEvmScheme(account);
    const { payload } = await scheme.createPaymentPayload(2, requirements);
    return { x402Version: 2, accepted: requirements, payload };
  }

  async function refusedWith(payment: PaymentPayload | string) {
    const before = fake.requests.length;
    const res = await post("/v1/chat/completions", chatBody, {
      "payment-signature":
        typeof payment === "string" ? payment : encodePaymentSignatureHeader(payment),
    });
    expect(res.status).toBe(402);
    const paymentRequired = await required(res);
    const body = await json(res);
    expect(fake.requests.length).toBe(before);
    expect(paymentRequired.error).toBe(body.error.message);
    return { code: body.error.code as string, message: body.error.message as string };
  }

  it("refuses a payment that is not one, not for this request, or not the payer's, before any provider call", async () => {
    const asked = (await required(await post("/v1/chat/completions", chatBody))).accepts[0]!;
    expect(await refusedWith("not base64 at all!")).toMatchObject({ code: "payment_invalid" });

    const below = await signed({ ...asked, amount: (BigInt(asked.amount) - 1n).toString() });
    expect(await refusedWith(below)).toEqual({
      code: "payment_insufficient",
      message: `the payment allows ${BigInt(asked.amount) - 1n}, this request's maximum is ${asked.amount}`,
    });

    const elsewhere = await signed({
      ...asked,
      payTo: privateKeyToAccount(generatePrivateKey()).address,
    });
    expect(await refusedWith(elsewhere)).toEqual({
      code: "payment_invalid",
      message: `the payment must be to and settled by the Market ${getAddress(stack.demo.market)}`,
    });

    const otherFacilitator = await signed({
      ...asked,
      extra: { facilitatorAddress: privateKeyToAccount(generatePrivateKey()).address },
    });
    expect((await refusedWith(otherFacilitator)).code).toBe("payment_invalid");

    const otherToken = await signed({
      ...asked,
      asset: privateKeyToAccount(generatePrivateKey()).address,
    });
    expect((await refusedWith(otherToken)).code).toBe("payment_invalid");

    // Signed by one key, claiming another payer.
    const forged = await signed(asked);
    const auth = (forged.payload as { permit2Authorization: { from: string } })
      .permit2Authorization;
    auth.from = privateKeyToAccount(generatePrivateKey()).address;
    expect(await refusedWith(forged)).toEqual({
      code: "payment_invalid",
      message: `the signature was not made by ${getAddress(auth.from)}`,
    });

    // Too short a window to serve and settle it.
    const hurried = await signed({ ...asked, maxTimeoutSeconds: 30 });
    expect((await refusedWith(hurried)).code).toBe("payment_expired");
  });
});
