import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import { clearBlockedPayer } from "../src/adapters/pg/x402.js";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { creditTokenAbi } from "../gen/contracts/artifacts.js";
import { startGateway, type Gateway } from "../src/app.js";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import { testDatabaseUrl } from "./helpers/db.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { flush, settlementRows, settlingEnv } from "./helpers/settlement.js";
import { eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { fundedAgent, paidChat } from "./helpers/x402.js";

/**
 * Issue 37, items 2 to 4: x402 payments across restarts and processes, a payer that empties its
 * balance before settlement, and the in-flight exposure cap.
 */

const chatBody = {
  model: "demo-chat",
  messages: [{ role: "user", content: "hello from an agent" }],
  max_tokens: 64,
};

describe("x402 settlement: exactly once, failures bounded", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  /** Gateways started by a test beside the stack's, on its database and chain. */
  const others: Gateway[] = [];

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
  }, 120_000);
  afterAll(async () => {
    for (const g of others) await g.close();
    await fake?.stop();
    await stack?.close();
  });

  /** Another gateway process on the stack's database and chain, with `config` changed. */
  async function anotherGateway(change: Partial<TestStack["config"]> = {}): Promise<Gateway> {
    const gateway = await startGateway(
      { ...stack.config, ...change },
      { logger: stack.logger, database: stack.database.db },
    );
    others.push(gateway);
    return gateway;
  }

  async function closed(ids: readonly string[]): Promise<{ id: string; charged: bigint }[]> {
    let rows: { id: string; credits_charged: string }[] = [];
    await eventually(async () => {
      ({ rows } = await stack.database.db.pool.query<{ id: string; credits_charged: string }>(
        `SELECT id, credits_charged::text FROM inference_requests
         WHERE id = ANY ($1) AND status NOT IN ('pending', 'streaming')`,
        [ids],
      ));
      return rows.length === ids.length;
    });
    return rows.map((r) => ({ id: r.id, charged: BigInt(r.credits_charged) }));
  }

  async function priced(url: string) {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    expect(res.status).toBe(402);
    return decodePaymentRequiredHeader(res.headers.get("payment-required")!).accepts[0]!;
  }

  it("a gateway that stops between serving and settling: the payment settles exactly once after the restart", async () => {
    const agent = await fundedAgent(stack, 10n ** 18n);
    const before = await agent.balance();
    const res = await paidChat(stack, agent.fetch(), chatBody);
    expect(res.status).toBe(200);
    await res.text();
    const id = res.headers.get("x-gateway-request-id")!;
    const [{ charged }] = (await closed([id])) as [{ id: string; charged: bigint }];
    await stack.restart();
    expect(await agent.balance()).toBe(before);
    const flushed = await flush(stack);
    expect(flushed).toMatchObject({ status: 200 });
    expect(await agent.balance()).toBe(before - charged);
    await stack.restart();
    await flush(stack);
    expect(await agent.balance()).toBe(before - charged);
    expect((await settlementRows(stack, [id]))[0]!.settlement_status).toBe("settled");
  });

  it.skipIf(testDatabaseUrl() === undefined)(
    "the same signature sent to two gateway processes at once serves once",
    async () => {
      const second = await anotherGateway();
      const agent = await fundedAgent(stack, 10n ** 18n);
      const asked = await priced(stack.gateway.url);
      const { payload } = await new UptoEvmScheme(agent.account).createPaymentPayload(2, asked);
      const header = encodePaymentSignatureHeader({ x402Version: 2, accepted: asked, payload });
      const calls = fake.requests.length;
      const answers = await Promise.all(
        [stack.gateway.url, second.url].map((url) =>
          fetch(`${url}/v1/chat/completions`, {
            method: "POST",
            headers: { "content-type": "application/json", "payment-signature": header },
            body: JSON.stringify(chatBody),
          }),
        ),
      );
      expect(answers.map((a) => a.status).sort()).toEqual([200, 402]);
      expect((await json(answers.find((a) => a.status === 402)!)).error.code).toBe("payment_used");
      await answers.find((a) => a.status === 200)!.text();
      expect(fake.requests.length).toBe(calls + 1);
    },
  );

  it("a payer who empties its balance before settlement: recorded failed, the offer unpaid, the payer refused until cleared", async () => {
    // What the tests before left to settle, settled first: the payout then moves only for this one.
    await flush(stack);
    const agent = await fundedAgent(stack, 10n ** 18n);
    const res = await paidChat(stack, agent.fetch(), chatBody);
    expect(res.status).toBe(200);
    await res.text();
    const id = res.headers.get("x-gateway-request-id")!;
    await closed([id]);
    // Everything moved away before the settlement runs.
    const wallet = stack.clients.wallet(agent.key);
    const all = await agent.balance();
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await wallet.writeContract({
        address: stack.demo.models[0]!.creditToken,
        abi: creditTokenAbi,
        functionName: "transfer",
        args: [stack.roles.payer.address, all],
      }),
    });
    const payoutBefore = await agent.balance(stack.roles.operator.address);
    const flushed = await flush(stack);
    expect(flushed.status).toBe(200);
    const [row] = await settlementRows(stack, [id]);
    expect(row!.settlement_status).toBe("unsettleable");
    expect(row!.settlement_reason).toBe("payment_failed: TRANSFER_FROM_FAILED");
    expect(await agent.balance(stack.roles.operator.address)).toBe(payoutBefore);
    const { rows } = await stack.database.db.pool.query<{ state: string; reason: string }>(
      "SELECT state, reason FROM x402_payments WHERE payer = $1",
      [agent.account.address.toLowerCase()],
    );
    expect(rows).toEqual([{ state: "failed", reason: "payment_failed: TRANSFER_FROM_FAILED" }]);
    // Refunded by a friend, it is still refused (on every process: the database's list).
    const payerWallet = stack.clients.wallet(stack.roles.payer.privateKey);
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await payerWallet.writeContract({
        address: stack.demo.models[0]!.creditToken,
        abi: creditTokenAbi,
        functionName: "transfer",
        args: [agent.account.address, all],
      }),
    });
    const calls = fake.requests.length;
    const refused = await paidChat(stack, agent.fetch(), chatBody);
    expect(refused.status).toBe(402);
    const body = await json(refused);
    expect(body.error.code).toBe("payer_blocked");
    expect(fake.requests.length).toBe(calls);
    // An operator clears it (`gateway x402 clear`).
    expect(await clearBlockedPayer(stack.database.db.pool, agent.account.address)).toBe(true);
    const served = await paidChat(stack, agent.fetch(), chatBody);
    expect(served.status).toBe(200);
    await served.text();
  });

  it("caps a payer's payments not yet settled: beyond the cap 402 payment_exposure_exceeded, room again once they settle", async () => {
    const maximum = BigInt((await priced(stack.gateway.url)).amount);
    // A process whose cap holds one request's maximum.
    const capped = await anotherGateway({ x402PayerExposureCap: maximum });
    const agent = await fundedAgent(stack, 10n ** 18n);
    const pay = agent.fetch();
    const first = await pay(`${capped.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    expect(first.status).toBe(200);
    await first.text();
    const [{ charged }] = (await closed([first.headers.get("x-gateway-request-id")!])) as [
      { id: string; charged: bigint },
    ];
    const calls = fake.requests.length;
    const second = await pay(`${capped.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    expect(second.status).toBe(402);
    const body = await json(second);
    expect(body.error.code).toBe("payment_exposure_exceeded");
    expect(body.error.message).toBe(
      `payer ${agent.account.address} has ${charged} in payments not yet settled; with this request's ${maximum} that passes the cap of ${maximum}: retry once they settle`,
    );
    expect(fake.requests.length).toBe(calls);
    await flush(stack);
    const third = await pay(`${capped.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody),
    });
    expect(third.status).toBe(200);
    await third.text();
  });
});
