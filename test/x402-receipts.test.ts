import { getAddress, recoverTypedDataAddress, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { signableReceipt } from "../src/domain/receipts.js";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { settlingEnv } from "./helpers/settlement.js";
import { authed, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { fundedAgent, payerCredential as signPayerCredential, type Agent } from "./helpers/x402.js";

/**
 * Issue 37, item 5: the receipt of a request paid with x402. A streamed answer's headers are
 * gone when it ends, so its last event carries the signed usage receipt (every dialect); the
 * record and the receipt are read later with the payer's signature (`Authorization: Payer`),
 * since no API key made the request.
 */

const receiptKey = generatePrivateKey();
const receiptSigner = privateKeyToAccount(receiptKey).address;

const streamed = [
  {
    path: "/v1/chat/completions",
    body: {
      model: "demo-chat",
      messages: [{ role: "user", content: "a receipt please" }],
      max_tokens: 64,
      stream: true,
    },
  },
  {
    path: "/v1/responses",
    body: { model: "demo-chat", input: "a receipt please", max_output_tokens: 64, stream: true },
  },
  {
    path: "/v1/messages",
    body: {
      model: "demo-chat",
      max_tokens: 64,
      messages: [{ role: "user", content: "a receipt please" }],
      stream: true,
    },
  },
] as const;

interface SignedReceipt {
  receipt: { domain: never; message: Record<string, unknown>; primaryType: string };
  signature: Hex;
  signer: string;
}

/** The `x_gateway` members of a stream's events, in order (every dialect puts it on its last). */
function gatewayMembers(text: string): Record<string, unknown>[] {
  const found: Record<string, unknown>[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const event = JSON.parse(line.slice(6)) as { x_gateway?: Record<string, unknown> };
    if (event.x_gateway !== undefined) found.push(event.x_gateway);
  }
  return found;
}

async function signerOf(signed: SignedReceipt): Promise<string> {
  return recoverTypedDataAddress({
    ...signableReceipt(signed.receipt),
    signature: signed.signature,
  });
}

describe("x402: the receipt of a paid request", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let agent: Agent;
  let deployment: string;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({ ...settlingEnv, RECEIPT_PRIVATE_KEY: receiptKey }));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
    agent = await fundedAgent(stack, 50n * 10n ** 18n);
    deployment = String((await json(await fetch(`${stack.gateway.url}/v1/gateway`))).deployment);
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const payerCredential = (
    account: PrivateKeyAccount,
    options: { expiresAt?: number; deployment?: string } = {},
  ) => signPayerCredential(stack, account, { deployment, ...options });

  const read = (path: string, authorization?: string) =>
    fetch(`${stack.gateway.url}${path}`, {
      headers: authorization === undefined ? {} : { authorization },
    });

  it("a streamed answer ends with the signed receipt in every dialect, the one the payer reads later with its signature", async () => {
    const pay = agent.fetch();
    const credential = await payerCredential(agent.account);
    for (const { path, body } of streamed) {
      const res = await pay(`${stack.gateway.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      expect({ path, status: res.status }).toEqual({ path, status: 200 });
      const requestId = res.headers.get("x-gateway-request-id")!;
      const members = gatewayMembers(await res.text());
      // One event carries x_gateway: the last one, with the charge and the receipt.
      expect({ path, events: members.length }).toEqual({ path, events: 1 });
      const last = members[0]!;
      const signed = last["receipt"] as SignedReceipt;
      expect(signed.signer).toBe(receiptSigner);
      expect(getAddress(await signerOf(signed))).toBe(receiptSigner);
      expect(signed.receipt.message).toMatchObject({
        requestId,
        charge: last["credits_charged"],
        inputTokens: last["input_tokens"],
        outputTokens: last["output_tokens"],
      });
      expect(BigInt(last["credits_charged"] as string)).toBeGreaterThan(0n);

      // Later, with the payer's signature instead of an API key: the same receipt, byte for byte.
      const again = await read(`/v1/requests/${requestId}/receipt`, credential);
      expect(again.status).toBe(200);
      expect(await json(again)).toEqual(signed);
      const record = await read(`/v1/requests/${requestId}`, credential);
      expect(record.status).toBe(200);
      expect((await json(record)).credits_charged).toBe(last["credits_charged"]);
    }
  });

  it("a JSON answer (PAYMENT-RESPONSE in its headers) has its receipt read the same way", async () => {
    const res = await agent.fetch()(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...streamed[0].body, stream: false }),
    });
    expect(res.status).toBe(200);
    await res.text();
    expect(res.headers.get("payment-response")).not.toBeNull();
    const requestId = res.headers.get("x-gateway-request-id")!;
    const got = await read(
      `/v1/requests/${requestId}/receipt`,
      await payerCredential(agent.account),
    );
    expect(got.status).toBe(200);
    const signed = (await json(got)) as SignedReceipt;
    expect(signed.receipt.message["charge"]).toBe(res.headers.get("x-gateway-credits-charged"));
    expect(getAddress(await signerOf(signed))).toBe(receiptSigner);
  });

  it("no one but the payer reads a paid request: another payer, an API key, a stale, foreign or forged token", async () => {
    const res = await agent.fetch()(`${stack.gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(streamed[0].body),
    });
    expect(res.status).toBe(200);
    await res.text();
    const requestId = res.headers.get("x-gateway-request-id")!;
    const path = `/v1/requests/${requestId}/receipt`;
    const codeOf = async (r: Response) => ({ status: r.status, code: (await json(r)).error.code });

    // No credentials at all.
    expect(await codeOf(await read(path))).toEqual({ status: 401, code: "missing_api_key" });
    // Another payer's good token: the request is not its own, so it does not exist for it.
    const stranger = privateKeyToAccount(generatePrivateKey());
    expect(await codeOf(await read(path, await payerCredential(stranger)))).toEqual({
      status: 404,
      code: "request_not_found",
    });
    expect(
      await codeOf(await read(`/v1/requests/${requestId}`, await payerCredential(stranger))),
    ).toEqual({ status: 404, code: "request_not_found" });
    // The gateway's demo API key did not make it either.
    expect(await codeOf(await authed(stack, path))).toEqual({
      status: 404,
      code: "request_not_found",
    });
    // The payer's address with a stranger's signature.
    const forged = (await payerCredential(stranger)).replace(
      `payer=${stranger.address}`,
      `payer=${agent.account.address}`,
    );
    const refused = await read(path, forged);
    expect(refused.status).toBe(401);
    expect((await json(refused)).error).toEqual({
      type: "authentication_error",
      code: "invalid_signature",
      message: `the signature is not the payer's (${agent.account.address})`,
    });
    // Expired, and signed for another deployment.
    expect(
      await codeOf(
        await read(
          path,
          await payerCredential(agent.account, { expiresAt: Math.floor(Date.now() / 1000) - 1 }),
        ),
      ),
    ).toEqual({ status: 401, code: "signature_expired" });
    const foreign = await read(
      path,
      await payerCredential(agent.account, { deployment: "another-deployment" }),
    );
    expect(await codeOf(foreign)).toEqual({ status: 403, code: "wrong_deployment" });
    // Malformed: refused before any signature is checked.
    expect(await codeOf(await read(path, "Payer payer=0x1"))).toEqual({
      status: 401,
      code: "invalid_signature",
    });
    // A payer token opens records, not spending: chat with it is refused as without a key.
    const chat = await fetch(`${stack.gateway.url}/v1/quotes`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        authorization: await payerCredential(agent.account),
      },
      body: JSON.stringify(streamed[0].body),
    });
    expect(await codeOf(chat)).toEqual({ status: 401, code: "missing_api_key" });
  });
});
