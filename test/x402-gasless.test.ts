import {
  decodePaymentRequiredHeader,
  decodePaymentSignatureHeader,
  encodePaymentSignatureHeader,
} from "@x402/core/http";
import type { PaymentPayload, PaymentRequired } from "@x402/core/types";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { getAddress, parseSignature, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { creditTokenAbi } from "../gen/contracts/artifacts.js";
import { permit2Address, x402UptoProxyAddress } from "../src/adapters/chain/x402-contracts.js";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import { eip2612Declaration } from "../src/domain/x402/index.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { flush, settlementRows, settlingEnv } from "./helpers/settlement.js";
import { eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { fundedAgent, paidChat } from "./helpers/x402.js";

/**
 * Issue 37 item 6: a gasless first payment. A payer holding credit tokens but no Permit2
 * allowance pays with an unmodified @x402/fetch: the 402 declares x402's `eip2612GasSponsoring`,
 * the upto client signs the token's EIP-2612 approval of Permit2 beside its transfer, the gateway
 * checks it and simulates the settlement with it, and the settlement submits it in the batch
 * (the operator pays the gas). A tampered approval is refused 402 before any provider call.
 */

const chatBody = {
  model: "demo-chat",
  messages: [{ role: "user", content: "hello from a gasless agent" }],
  max_tokens: 64,
};

describe("x402: a gasless first payment (EIP-2612 approval of Permit2)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let token: Hex;
  let tokenName: string;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
    token = getAddress(stack.demo.models[0]!.creditToken);
    tokenName = await stack.clients.publicClient.readContract({
      address: token,
      abi: creditTokenAbi,
      functionName: "name",
    });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const read = (functionName: "balanceOf" | "nonces", owner: Hex) =>
    stack.clients.publicClient.readContract({
      address: token,
      abi: creditTokenAbi,
      functionName,
      args: [owner],
    });
  const allowance = (owner: Hex) =>
    stack.clients.publicClient.readContract({
      address: token,
      abi: creditTokenAbi,
      functionName: "allowance",
      args: [owner, permit2Address],
    });

  const post = (headers: Record<string, string> = {}, body: object = chatBody) =>
    fetch(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });

  async function asked(): Promise<PaymentRequired> {
    const res = await post();
    expect(res.status).toBe(402);
    await res.text();
    return decodePaymentRequiredHeader(res.headers.get("payment-required")!);
  }

  it("declares eip2612GasSponsoring in the 402, with the token's EIP-712 name and version", async () => {
    const required = await asked();
    expect(required.accepts[0]!.extra).toEqual({
      facilitatorAddress: getAddress(stack.demo.market),
      name: tokenName,
      version: "1",
    });
    expect(required.extensions).toEqual(eip2612Declaration());
    expect(Object.keys(required.extensions!)).toEqual(["eip2612GasSponsoring"]);
  });

  it("serves a payer without Permit2 allowance, JSON and SSE; settlement submits its approval and takes exactly the charges", async () => {
    const agent = await fundedAgent(stack, 50n * 10n ** 18n, { approve: false });
    const owner = agent.account.address;
    const payout = stack.roles.operator.address;
    expect(await allowance(owner)).toBe(0n);
    const before = { agent: await read("balanceOf", owner), payout: await agent.balance(payout) };
    const sent: string[] = [];
    const pay = agent.fetch(sent);
    const first = await paidChat(stack, pay, chatBody);
    expect(first.status).toBe(200);
    expect((await json(first)).choices[0].message.content.length).toBeGreaterThan(0);
    // What the unmodified client signed: the EIP-2612 approval of Permit2 beside its transfer.
    const payment = decodePaymentSignatureHeader(sent[0]!);
    const info = (payment.extensions?.eip2612GasSponsoring as { info: Record<string, string> })
      .info;
    const signedAmount = (
      payment.payload as { permit2Authorization: { permitted: { amount: string } } }
    ).permit2Authorization.permitted.amount;
    expect(info).toMatchObject({
      from: owner,
      asset: token,
      spender: permit2Address,
      amount: signedAmount,
      nonce: "0",
    });
    // Nothing on chain before settlement: the approval waits for its batch.
    expect(await allowance(owner)).toBe(0n);
    // Streamed: its allowance is still short (the first approval is not submitted), so the
    // client signs the same nonce again; one of the two approvals is taken, either serves both.
    const streamed = await paidChat(stack, pay, { ...chatBody, stream: true });
    expect(streamed.status).toBe(200);
    expect(await streamed.text()).toContain("data: [DONE]");
    expect(sent.length).toBe(2);
    const ids = [first, streamed].map((r) => r.headers.get("x-gateway-request-id")!);
    await eventually(async () => {
      const open = await stack.database.db.pool.query(
        "SELECT 1 FROM inference_requests WHERE id = ANY ($1) AND status NOT IN ('pending', 'streaming')",
        [ids],
      );
      return open.rowCount === ids.length;
    });
    const stored = await stack.database.db.pool.query<{ approval: { value: string } | null }>(
      `SELECT p.payload->'approval' AS approval FROM x402_payments p
       JOIN inference_requests r ON r.permit_id = p.permit_id WHERE r.id = ANY ($1)`,
      [ids],
    );
    expect(stored.rows.map((r) => r.approval?.value)).toEqual([signedAmount, signedAmount]);
    const { rows } = await stack.database.db.pool.query<{ credits_charged: string }>(
      "SELECT credits_charged::text FROM inference_requests WHERE id = ANY ($1)",
      [ids],
    );
    const charged = rows.reduce((sum, r) => sum + BigInt(r.credits_charged), 0n);
    expect(charged).toBeGreaterThan(0n);

    expect((await flush(stack)).status).toBe(200);
    expect(await read("balanceOf", owner)).toBe(before.agent - charged);
    expect(await agent.balance(payout)).toBe(before.payout + charged);
    expect(await read("nonces", owner)).toBe(1n);
    expect(await allowance(owner)).toBe(BigInt(signedAmount) - charged);
    const settled = await settlementRows(stack, ids);
    expect(settled.map((s) => s.settlement_status)).toEqual(["settled", "settled"]);
    // A second flush moves nothing.
    await flush(stack);
    expect(await read("balanceOf", owner)).toBe(before.agent - charged);
  });

  /** A gasless payer's paid chat, closed: its request id, charge and the approval it signed. */
  async function servedGasless() {
    const agent = await fundedAgent(stack, 10n ** 18n, { approve: false });
    const sent: string[] = [];
    const res = await paidChat(stack, agent.fetch(sent), chatBody);
    expect(res.status).toBe(200);
    await res.text();
    const id = res.headers.get("x-gateway-request-id")!;
    let charged = 0n;
    await eventually(async () => {
      const { rows } = await stack.database.db.pool.query<{ credits_charged: string }>(
        "SELECT credits_charged::text FROM inference_requests WHERE id = $1 AND status NOT IN ('pending', 'streaming')",
        [id],
      );
      if (rows[0] !== undefined) charged = BigInt(rows[0].credits_charged);
      return rows.length === 1;
    });
    const info = (
      decodePaymentSignatureHeader(sent[0]!).extensions?.eip2612GasSponsoring as {
        info: Record<string, string>;
      }
    ).info;
    return { agent, id, charged, info, before: await read("balanceOf", agent.account.address) };
  }

  it("a gateway that stops between serving and settling: the approval and the payment land once after the restart", async () => {
    const { agent, id, charged, before } = await servedGasless();
    await stack.restart();
    expect(await allowance(agent.account.address)).toBe(0n);
    expect((await flush(stack)).status).toBe(200);
    expect(await read("balanceOf", agent.account.address)).toBe(before - charged);
    expect(await read("nonces", agent.account.address)).toBe(1n);
    await stack.restart();
    await flush(stack);
    expect(await read("balanceOf", agent.account.address)).toBe(before - charged);
    expect((await settlementRows(stack, [id]))[0]!.settlement_status).toBe("settled");
  });

  it("an approval someone else submitted first does not fail the batch", async () => {
    const { agent, id, charged, info, before } = await servedGasless();
    // Anyone holding the signature may submit it (a front-run): the allowance is then given.
    const { r, s, v, yParity } = parseSignature(info.signature as Hex);
    const stranger = stack.clients.wallet(stack.roles.creator.privateKey);
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await stranger.writeContract({
        address: token,
        abi: creditTokenAbi,
        functionName: "permit",
        args: [
          agent.account.address,
          permit2Address,
          BigInt(info.amount!),
          BigInt(info.deadline!),
          Number(v ?? BigInt(27 + yParity)),
          r,
          s,
        ],
      }),
    });
    expect(await allowance(agent.account.address)).toBe(BigInt(info.amount!));
    expect((await flush(stack)).status).toBe(200);
    expect(await read("balanceOf", agent.account.address)).toBe(before - charged);
    expect((await settlementRows(stack, [id]))[0]!.settlement_status).toBe("settled");
  });

  /** The payment the upto client makes for `required` (with its approval), for `account`. */
  async function clientPayment(
    account: PrivateKeyAccount,
    required: PaymentRequired,
  ): Promise<PaymentPayload> {
    const accepted = required.accepts[0]!;
    const scheme = new UptoEvmScheme(account, { rpcUrl: stack.anvil.rpcUrl });
    const made = await scheme.createPaymentPayload(2, accepted, {
      extensions: required.extensions,
    });
    expect(made.extensions?.eip2612GasSponsoring).toBeDefined();
    return { x402Version: 2, accepted, payload: made.payload, extensions: made.extensions };
  }

  /** `payment` with its approval's info changed by `edit`, re-signed by `signer` unless told. */
  async function tampered(
    payment: PaymentPayload,
    signer: PrivateKeyAccount,
    edit: Record<string, string>,
  ): Promise<PaymentPayload> {
    const info = {
      ...(payment.extensions!.eip2612GasSponsoring as { info: Record<string, string> }).info,
      ...edit,
    };
    const signature = await signer.signTypedData({
      domain: {
        name: tokenName,
        version: "1",
        chainId: stack.anvil.chainId,
        verifyingContract: token,
      },
      types: {
        Permit: [
          { name: "owner", type: "address" },
          { name: "spender", type: "address" },
          { name: "value", type: "uint256" },
          { name: "nonce", type: "uint256" },
          { name: "deadline", type: "uint256" },
        ],
      },
      primaryType: "Permit",
      message: {
        owner: info.from as Hex,
        spender: info.spender as Hex,
        value: BigInt(info.amount!),
        nonce: BigInt(info.nonce!),
        deadline: BigInt(info.deadline!),
      },
    });
    return {
      ...payment,
      extensions: {
        eip2612GasSponsoring: { info: { ...info, signature: edit.signature ?? signature } },
      },
    };
  }

  async function refused(payment: PaymentPayload) {
    const calls = fake.requests.length;
    const res = await post({ "payment-signature": encodePaymentSignatureHeader(payment) });
    expect(res.status).toBe(402);
    const required = decodePaymentRequiredHeader(res.headers.get("payment-required")!);
    const { error } = await json(res);
    expect(required.error).toBe(error.message);
    expect(fake.requests.length).toBe(calls);
    return { code: error.code as string, message: error.message as string };
  }

  it("refuses a tampered approval with the reason, before any provider call; without one it says the approval is needed", async () => {
    const agent = await fundedAgent(stack, 50n * 10n ** 18n, { approve: false });
    const owner = agent.account.address;
    const required = await asked();
    const payment = await clientPayment(agent.account, required);

    // Signed for another spender (the upto proxy instead of Permit2).
    expect(
      await refused(await tampered(payment, agent.account, { spender: x402UptoProxyAddress })),
    ).toEqual({
      code: "eip2612_permit_invalid",
      message: `the EIP-2612 approval's spender must be Permit2 ${permit2Address}`,
    });
    // Signed by another key.
    const stranger = privateKeyToAccount(generatePrivateKey());
    expect(await refused(await tampered(payment, stranger, {}))).toEqual({
      code: "eip2612_permit_invalid",
      message: `the EIP-2612 approval was not signed by ${owner}`,
    });
    // Another payer's approval.
    expect(
      (await refused(await tampered(payment, stranger, { from: stranger.address }))).message,
    ).toBe(`the EIP-2612 approval is from ${stranger.address}, the payment from ${owner}`);
    // Below the payment.
    const signedAmount = BigInt(required.accepts[0]!.amount);
    expect(
      (await refused(await tampered(payment, agent.account, { amount: String(signedAmount - 1n) })))
        .code,
    ).toBe("eip2612_permit_invalid");
    // Expired (no time left to serve and settle).
    const soon = String(Math.floor(Date.now() / 1000) + 10);
    expect((await refused(await tampered(payment, agent.account, { deadline: soon }))).code).toBe(
      "eip2612_permit_expired",
    );
    // Well signed, for a nonce the token will not take: the simulation says so.
    expect(await refused(await tampered(payment, agent.account, { nonce: "7" }))).toEqual({
      code: "eip2612_permit_invalid",
      message: `the EIP-2612 approval was signed for nonce 7; payer ${owner}'s nonce at token ${token} is 0: sign afresh`,
    });
    // Without the approval, no allowance: the 402 says the approval is needed.
    expect((await refused({ ...payment, extensions: undefined })).code).toBe(
      "permit2_allowance_required",
    );
    // The untouched payment is served.
    const res = await post({ "payment-signature": encodePaymentSignatureHeader(payment) });
    expect(res.status).toBe(200);
    await res.text();
  });
});
