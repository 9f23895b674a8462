import {
  decodePaymentRequiredHeader,
  decodePaymentResponseHeader,
  encodePaymentSignatureHeader,
} from "@x402/core/http";
import type { PaymentPayload, PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { getAddress, type Hex } from "viem";
import { permit2Address } from "../src/adapters/chain/x402-contracts.js";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { flush, settlementRows, settlingEnv } from "./helpers/settlement.js";
import { askedPayment, fundedAgent, paymentHeader, postPaid, type Agent } from "./helpers/x402.js";
import { authed, eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";

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
          // The credit token's EIP-712 domain: the client signs an EIP-2612 approval of
          // Permit2 in it when its allowance is short (x402-gasless.test.ts).
          extra: {
            facilitatorAddress: getAddress(stack.demo.market),
            name: expect.any(String),
            version: "1",
          },
        },
      ]);
      expect(Object.keys(paymentRequired.extensions ?? {})).toEqual(["eip2612GasSponsoring"]);
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

describe("x402: an agent pays per request with an unmodified @x402/fetch", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  /** An agent with 50 credit tokens, Permit2 approved once (without it the 402 says so: below). */
  let agentWallet: Agent;
  let agent: Agent["account"];

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
    agentWallet = await fundedAgent(stack, 50n * 10n ** 18n);
    agent = agentWallet.account;
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /** The agent's fetch: x402's own client, allowed this market's credit token. */
  const agentFetch = (sent: string[] = []) => agentWallet.fetch(sent);
  const balanceOf = (owner: Hex) => agentWallet.balance(owner);

  it("gets answers in every dialect, JSON and SSE; settlement takes exactly the charges, once, and pays the offer", async () => {
    const pay = agentFetch();
    const payout = stack.roles.operator.address;
    const before = { agent: await balanceOf(agent.address), payout: await balanceOf(payout) };
    const ids: string[] = [];
    for (const { path, body } of routes) {
      for (const stream of [false, true]) {
        const res = await pay(`${stack.gateway.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ ...body, stream }),
        });
        const text = await res.text();
        expect({ path, stream, status: res.status }).toEqual({ path, stream, status: 200 });
        if (!stream) {
          // The JSON answer says what the payment will settle (headers are gone for a stream).
          expect(decodePaymentResponseHeader(res.headers.get("payment-response")!)).toEqual({
            success: true,
            payer: agent.address,
            network: `eip155:${stack.anvil.chainId}`,
            transaction: "",
            amount: res.headers.get("x-gateway-credits-charged"),
            extra: { requestId: res.headers.get("x-gateway-request-id"), settlement: "pending" },
          });
        }
        expect(text.length).toBeGreaterThan(0);
        ids.push(res.headers.get("x-gateway-request-id")!);
      }
    }
    expect(new Set(ids).size).toBe(6);
    await eventually(async () => {
      const open = await stack.database.db.pool.query(
        "SELECT 1 FROM inference_requests WHERE id = ANY ($1) AND status NOT IN ('pending', 'streaming')",
        [ids],
      );
      return open.rowCount === ids.length;
    });
    const { rows } = await stack.database.db.pool.query<{
      id: string;
      credits_charged: string;
      api_key_id: string;
      permit_id: string;
    }>(
      "SELECT id, credits_charged::text, api_key_id, permit_id FROM inference_requests WHERE id = ANY ($1)",
      [ids],
    );
    expect(rows.length).toBe(6);
    for (const r of rows) {
      expect(r.api_key_id).toBe(`x402:${agent.address.toLowerCase()}`);
      expect(BigInt(r.credits_charged)).toBeGreaterThan(0n);
    }
    const charged = rows.reduce((sum, r) => sum + BigInt(r.credits_charged), 0n);
    // Nothing moved before settlement.
    expect(await balanceOf(agent.address)).toBe(before.agent);
    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    expect(await balanceOf(agent.address)).toBe(before.agent - charged);
    expect(await balanceOf(payout)).toBe(before.payout + charged);
    const settled = await settlementRows(stack, ids);
    expect(settled.map((s) => s.settlement_status)).toEqual(ids.map(() => "settled"));
    const payments = await stack.database.db.pool.query<{ state: string }>(
      "SELECT state FROM x402_payments WHERE permit_id = ANY ($1)",
      [rows.map((r) => r.permit_id)],
    );
    expect(payments.rows.map((p) => p.state)).toEqual(rows.map(() => "settled"));
    // A second flush moves nothing.
    await flush(stack);
    expect(await balanceOf(agent.address)).toBe(before.agent - charged);
  });

  it("serves one signature once: a replay, sequential or concurrent, is 402 payment_used with no provider call", async () => {
    const sent: string[] = [];
    const res = await agentFetch(sent)(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    expect(res.status).toBe(200);
    await res.text();
    expect(sent.length).toBe(1);
    const calls = fake.requests.length;
    const replay = () =>
      fetch(`${stack.gateway.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "payment-signature": sent[0]! },
        body: JSON.stringify(chatBody),
      });
    const again = await replay();
    expect(again.status).toBe(402);
    expect((await json(again)).error.code).toBe("payment_used");
    expect(fake.requests.length).toBe(calls);

    // A fresh signature sent twice at once: one answer, one refusal.
    const fresh: string[] = [];
    const asked = await askedPayment(stack, chatBody);
    const { payload } = await new UptoEvmScheme(agent).createPaymentPayload(2, asked);
    fresh.push(paymentHeader(asked, payload));
    const both = await Promise.all([0, 1].map(() => postPaid(stack, fresh[0]!, chatBody)));
    const statuses = both.map((r) => r.status).sort();
    expect(statuses).toEqual([200, 402]);
    const refused = both.find((r) => r.status === 402)!;
    expect((await json(refused)).error.code).toBe("payment_used");
    await both.find((r) => r.status === 200)!.text();
    expect(fake.requests.length).toBe(calls + 1);
  });

  it("refuses a payer without Permit2 allowance or balance with the reason, before any provider call", async () => {
    const poor = privateKeyToAccount(generatePrivateKey());
    const asked = await askedPayment(stack, chatBody);
    const { payload } = await new UptoEvmScheme(poor).createPaymentPayload(2, asked);
    const calls = fake.requests.length;
    const res = await postPaid(stack, paymentHeader(asked, payload), chatBody);
    expect(res.status).toBe(402);
    const body = await json(res);
    expect(body.error.code).toBe("permit2_allowance_required");
    expect(body.error.message).toBe(
      `payer ${poor.address} has approved 0 of token ${getAddress(asked.asset)} to Permit2 (${permit2Address}); this request needs ${asked.amount} (PERMIT2_ALLOWANCE_REQUIRED)`,
    );
    expect(fake.requests.length).toBe(calls);

    // Approved, but holding nothing: the transfer would fail on chain.
    const broke = await fundedAgent(stack, 0n);
    const { payload: brokePayload } = await new UptoEvmScheme(broke.account).createPaymentPayload(
      2,
      asked,
    );
    const refused = await postPaid(stack, paymentHeader(asked, brokePayload), chatBody);
    expect(refused.status).toBe(402);
    expect((await json(refused)).error).toMatchObject({
      code: "payment_refused",
      message: `payer ${broke.account.address} holds 0 of token ${getAddress(asked.asset)}; this request may cost ${asked.amount}`,
    });
    expect(fake.requests.length).toBe(calls);
  });
});
