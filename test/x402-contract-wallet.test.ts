import { UptoEvmScheme } from "@x402/evm/upto/client";
import { wrapFetchWithPayment, x402Client } from "@x402/fetch";
import {
  createTestClient,
  createWalletClient,
  getAddress,
  http,
  maxUint256,
  parseEther,
  type Hex,
} from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { creditTokenAbi } from "../gen/contracts/artifacts.js";
import { deployErc1271Wallet } from "../src/adapters/chain/deploy.js";
import { permit2Address } from "../src/adapters/chain/x402-contracts.js";
import { placeX402OnAnvil } from "../src/dev/x402-placement.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { mintCredits } from "./helpers/market.js";
import { flush, settlementRows, settlingEnv } from "./helpers/settlement.js";
import { eventually, json, startChatStack, type TestStack } from "./helpers/stack.js";
import { askedPayment, paymentHeader, postPaid } from "./helpers/x402.js";

/**
 * Issue 37: a contract wallet (ERC-1271) pays per request as an account does. Its signature does
 * not recover its address; the gateway asks the chain (`isValidSignature`), as Permit2 does when
 * the settlement moves its tokens. Someone else's signature for the wallet is refused.
 */

const chatBody = {
  model: "demo-chat",
  messages: [{ role: "user", content: "hello from a contract wallet" }],
  max_tokens: 64,
};

describe("x402: a contract wallet pays", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let wallet: Hex;
  const owner = privateKeyToAccount(generatePrivateKey());

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack(settlingEnv));
    await placeX402OnAnvil(stack.clients, stack.anvil.rpcUrl);
    wallet = await deployErc1271Wallet(
      stack.clients.wallet(stack.roles.deployer.privateKey),
      stack.clients.publicClient,
      { owner: owner.address },
    );
    await mintCredits(stack, wallet, 10n ** 18n);
    // The wallet's one Permit2 approval (its own call; impersonated here, the wallet has no
    // execute function).
    const testClient = createTestClient({
      mode: "anvil",
      chain: stack.clients.chain,
      transport: http(stack.anvil.rpcUrl),
    });
    await testClient.impersonateAccount({ address: wallet });
    await testClient.setBalance({ address: wallet, value: parseEther("1") });
    const asWallet = createWalletClient({
      account: wallet,
      chain: stack.clients.chain,
      transport: http(stack.anvil.rpcUrl),
    });
    await stack.clients.publicClient.waitForTransactionReceipt({
      hash: await asWallet.writeContract({
        address: stack.demo.models[0]!.creditToken,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [permit2Address, maxUint256],
      }),
    });
    await testClient.stopImpersonatingAccount({ address: wallet });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  const balanceOf = (address: Hex) =>
    stack.clients.publicClient.readContract({
      address: stack.demo.models[0]!.creditToken,
      abi: creditTokenAbi,
      functionName: "balanceOf",
      args: [address],
    });

  /** The wallet as x402's signer: its address, its owner's signatures. */
  const signer = (by = owner) => ({
    address: wallet,
    signTypedData: (args: Parameters<typeof owner.signTypedData>[0]) => by.signTypedData(args),
  });

  it("is served, and settlement moves exactly the charge from the wallet", async () => {
    const client = new x402Client();
    client.register("eip155:*", new UptoEvmScheme(signer()));
    client.setSpendControls({
      allowedAssets: [
        {
          network: `eip155:${stack.anvil.chainId}`,
          asset: stack.demo.models[0]!.creditToken,
          maxAmountPerPayment: (10n ** 18n).toString(),
        },
      ],
    });
    const before = await balanceOf(wallet);
    const res = await wrapFetchWithPayment(fetch, client)(
      `${stack.gateway.url}/v1/chat/completions`,
      {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(chatBody),
      },
    );
    expect(res.status).toBe(200);
    await res.text();
    const id = res.headers.get("x-gateway-request-id")!;
    const charged = BigInt(res.headers.get("x-gateway-credits-charged")!);
    await eventually(async () => (await settlementRows(stack, [id]))[0] !== undefined);
    expect((await flush(stack)).status).toBe(200);
    const [row] = await settlementRows(stack, [id]);
    expect(row!.settlement_status).toBe("settled");
    expect(await balanceOf(wallet)).toBe(before - charged);
  });

  it("refuses a signature for the wallet that its owner did not make, before any provider call", async () => {
    const asked = await askedPayment(stack, chatBody);
    const stranger = privateKeyToAccount(generatePrivateKey());
    const { payload } = await new UptoEvmScheme(signer(stranger)).createPaymentPayload(2, asked);
    const calls = fake.requests.length;
    const res = await postPaid(stack, paymentHeader(asked, payload), chatBody);
    expect(res.status).toBe(402);
    expect((await json(res)).error).toMatchObject({
      code: "payment_invalid",
      message: `the signature was not made by ${getAddress(wallet)}`,
    });
    expect(fake.requests.length).toBe(calls);
  });
});
