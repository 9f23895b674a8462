import { decodePaymentRequiredHeader, encodePaymentSignatureHeader } from "@x402/core/http";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { createTestClient, http, maxUint256, parseEther, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { creditTokenAbi } from "../../gen/contracts/artifacts.js";
import { permit2Address } from "../../src/adapters/chain/x402-contracts.js";
import {
  buildReadPayerRequestsTypedData,
  signable,
} from "../../src/domain/permit-authorization/index.js";
import { mintCredits } from "./market.js";
import { json, type TestStack } from "./stack.js";

/** An agent with a wallet: credit tokens of the demo chat model, Permit2 approved once (or not). */
export interface Agent {
  readonly key: Hex;
  readonly account: PrivateKeyAccount;
  /** An unmodified x402 fetch for it, allowed this market's credit token; `sent` records signatures. */
  fetch(sent?: string[]): typeof fetch;
  balance(owner?: Hex): Promise<bigint>;
}

/**
 * `approve: false`: no Permit2 approval (its first payment is gasless: the client signs x402's
 * `eip2612GasSponsoring` approval, reading its allowance and nonce through the stack's RPC).
 */
export async function fundedAgent(
  stack: TestStack,
  credits: bigint,
  { approve = true }: { approve?: boolean } = {},
): Promise<Agent> {
  const key = generatePrivateKey();
  const account = privateKeyToAccount(key);
  const token = stack.demo.models[0]!.creditToken;
  const testClient = createTestClient({
    mode: "anvil",
    chain: stack.clients.chain,
    transport: http(stack.anvil.rpcUrl),
  });
  await testClient.setBalance({ address: account.address, value: parseEther("1") });
  await mintCredits(stack, account.address, credits);
  const wallet = stack.clients.wallet(key);
  if (approve)
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await wallet.writeContract({
        address: token,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [permit2Address, maxUint256],
      }),
    });
  return {
    key,
    account,
    fetch(sent: string[] = []) {
      const client = new x402Client();
      client.register("eip155:*", new UptoEvmScheme(account, { rpcUrl: stack.anvil.rpcUrl }));
      client.setSpendControls({
        allowedAssets: [
          {
            network: `eip155:${stack.anvil.chainId}`,
            asset: token,
            maxAmountPerPayment: (10n ** 18n).toString(),
          },
        ],
      });
      const recording: typeof fetch = async (input, init) => {
        const request = new Request(input, init);
        const signature = request.headers.get("payment-signature");
        if (signature !== null) sent.push(signature);
        return fetch(request);
      };
      return wrapFetchWithPayment(recording, client);
    },
    balance: (owner: Hex = account.address) =>
      stack.clients.publicClient.readContract({
        address: token,
        abi: creditTokenAbi,
        functionName: "balanceOf",
        args: [owner],
      }),
  };
}

/** A paid chat on the demo model: the answer's request id, once its record is closed. */
export async function paidChat(
  stack: TestStack,
  pay: typeof fetch,
  body: object = {
    model: "demo-chat",
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 64,
  },
): Promise<Response> {
  return pay(`${stack.gateway.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

/** What the gateway asks to be paid for a chat `body` sent without credentials: its 402's first `accepts`. */
export async function askedPayment(stack: TestStack, body: object): Promise<Asked> {
  const priced = await fetch(`${stack.gateway.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return decodePaymentRequiredHeader(priced.headers.get("payment-required")!).accepts[0]!;
}

/** A payment requirement as the gateway's 402 states it. */
export type Asked = ReturnType<typeof decodePaymentRequiredHeader>["accepts"][number];

/** The PAYMENT-SIGNATURE header paying `asked` with a scheme client's `payload`. */
export function paymentHeader(asked: Asked, payload: Record<string, unknown>): string {
  return encodePaymentSignatureHeader({ x402Version: 2, accepted: asked, payload });
}

/** A chat `body` sent with the PAYMENT-SIGNATURE `payment` (the signer's, or a forged one). */
export function postPaid(stack: TestStack, payment: string, body: object): Promise<Response> {
  return fetch(`${stack.gateway.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "payment-signature": payment },
    body: JSON.stringify(body),
  });
}

/**
 * A payer's `Authorization: Payer ...` credential (an EIP-712 `ReadPayerRequests`) signed by
 * `account`: for this gateway's deployment unless another is named, good for 5 minutes unless
 * `expiresAt` says otherwise.
 */
export async function payerCredential(
  stack: TestStack,
  account: PrivateKeyAccount,
  options: { expiresAt?: number; deployment?: string } = {},
): Promise<string> {
  const expiresAt = options.expiresAt ?? Math.floor(Date.now() / 1000) + 300;
  const deployment =
    options.deployment ??
    String((await json(await fetch(`${stack.gateway.url}/v1/gateway`))).deployment);
  const message = { payer: account.address, deployment, expiresAt };
  const typed = buildReadPayerRequestsTypedData({
    chainId: stack.anvil.chainId,
    market: stack.demo.market,
    message,
  });
  const signature = await account.signTypedData(signable(typed) as never);
  return `Payer payer=${account.address}, deployment="${deployment}", expires_at=${expiresAt}, signature=${signature}`;
}
