import { decodePaymentRequiredHeader } from "@x402/core/http";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { settlingEnv } from "./helpers/settlement.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { payerCredential, paymentHeader } from "./helpers/x402.js";

/**
 * Issue 37: a payment the gateway refuses cost it a signature's recovery and a chain call, so an
 * anonymous caller sending refused payments spends its address's failure budget as unknown API
 * keys do (ADDRESS_RATE_LIMIT_RPS / _BURST): past it, 429 `address_rate_limited` before any
 * payment is checked. Asking the price (no payment) and a key's requests are not refused by it.
 * A payer read token seen for the first time costs a recovery too, valid or not, and anyone can
 * sign one with a fresh key: it takes from the same budget; a token already checked does not.
 */

const chatBody = {
  model: "demo-chat",
  messages: [{ role: "user", content: "hello from an agent" }],
  max_tokens: 64,
};

describe("x402: refused payments and the address's failure budget", () => {
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({
      ...settlingEnv,
      ADDRESS_RATE_LIMIT_RPS: "1",
      ADDRESS_RATE_LIMIT_BURST: "3",
    }));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const post = (headers: Record<string, string> = {}) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(chatBody),
    });

  it("refused payments take from the budget; past it 429 before the payment is checked; a key is still served", async () => {
    const priced = await post();
    expect(priced.status).toBe(402);
    const asked = decodePaymentRequiredHeader(priced.headers.get("payment-required")!).accepts[0]!;
    // A payer that never approved Permit2: each payment is refused after its checks.
    const poor = new UptoEvmScheme(privateKeyToAccount(generatePrivateKey()));
    const signed = async () =>
      paymentHeader(asked, (await poor.createPaymentPayload(2, asked)).payload);
    const payments = await Promise.all([1, 2, 3, 4].map(() => signed()));
    const calls = fake.requests.length;
    const codes: unknown[] = [];
    for (const payment of payments) {
      const res = await post({ "payment-signature": payment });
      codes.push({ status: res.status, code: (await json(res)).error.code });
      if (res.status === 429) expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
    }
    // The budget holds three failures (the price asked before took none).
    expect(codes).toEqual([
      { status: 402, code: "permit2_allowance_required" },
      { status: 402, code: "permit2_allowance_required" },
      { status: 402, code: "permit2_allowance_required" },
      { status: 429, code: "address_rate_limited" },
    ]);
    // Asking the price costs nothing and is still answered; a key's request is served.
    expect((await post()).status).toBe(402);
    const keyed = await authed(stack, "/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-gateway-permit": stack.demo.permitId },
      body: JSON.stringify(chatBody),
    });
    expect(keyed.status).toBe(200);
    await keyed.text();
    expect(fake.requests.length).toBe(calls + 1);
  });

  it("new payer read tokens take from the budget even when they hold; a token already checked still reads", async () => {
    // The test before spent the budget: wait until it is whole again (3 at 1 a second).
    await new Promise((resolve) => setTimeout(resolve, 3_200));
    const list = (authorization: string) =>
      fetch(`${stack.gateway.url}/v1/requests`, { headers: { authorization } });
    const tokens = await Promise.all(
      [1, 2, 3, 4].map(() => payerCredential(stack, privateKeyToAccount(generatePrivateKey()))),
    );
    const statuses: unknown[] = [];
    for (const token of tokens) {
      const res = await list(token);
      statuses.push({
        status: res.status,
        code: res.ok ? undefined : (await json(res)).error.code,
      });
      if (res.ok) expect((await json(res)).data).toEqual([]);
    }
    expect(statuses).toEqual([
      { status: 200, code: undefined },
      { status: 200, code: undefined },
      { status: 200, code: undefined },
      { status: 429, code: "address_rate_limited" },
    ]);
    // The first token was checked: reading with it again recovers nothing and is served.
    const again = await list(tokens[0]!);
    expect(again.status).toBe(200);
    expect((await json(again)).data).toEqual([]);
  });
});
