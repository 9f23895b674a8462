import type { ContractFunctionArgs, ContractFunctionName, Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import { demoTariff, id32, type demoMetadata } from "../../src/dev/demo-market.js";
import { registerEndpoint, verifyOffer } from "../../src/clients/provider.js";
import { startFakeUpstream, type FakeUpstream } from "./fake-upstream.js";
import { auditSecret } from "./log-audit.js";
import type { TestStack } from "./stack.js";

let permitCounter = 0;

type MarketFunction = ContractFunctionName<typeof marketAbi, "nonpayable">;
type TokenFunction = ContractFunctionName<typeof creditTokenAbi, "nonpayable">;

async function confirm(stack: TestStack, hash: Hex): Promise<void> {
  const receipt = await stack.clients.publicClient.waitForTransactionReceipt({ hash });
  if (receipt.status !== "success") throw new Error(`transaction ${hash} reverted`);
}

/** Sends a market transaction as `privateKey`'s account and waits for it to succeed. */
async function market<F extends MarketFunction>(
  stack: TestStack,
  privateKey: Hex,
  functionName: F,
  args: ContractFunctionArgs<typeof marketAbi, "nonpayable", F>,
): Promise<void> {
  const wallet = stack.clients.wallet(privateKey);
  const request = { address: stack.demo.market, abi: marketAbi, functionName, args } as const;
  await confirm(
    stack,
    await wallet.writeContract(request as Parameters<typeof wallet.writeContract>[0]),
  );
}

/** Sends a credit-token transaction as `privateKey`'s account and waits for it to succeed. */
async function token<F extends TokenFunction>(
  stack: TestStack,
  privateKey: Hex,
  address: Hex,
  functionName: F,
  args: ContractFunctionArgs<typeof creditTokenAbi, "nonpayable", F>,
): Promise<void> {
  const wallet = stack.clients.wallet(privateKey);
  const request = { address, abi: creditTokenAbi, functionName, args } as const;
  await confirm(
    stack,
    await wallet.writeContract(request as Parameters<typeof wallet.writeContract>[0]),
  );
}

/**
 * Opens a permit from the demo payer, or from the account of `payerPrivateKey` (any funded
 * anvil account), minting and approving the model's credits first.
 */
export async function openPermit(
  stack: TestStack,
  opts: {
    model?: number;
    offerId?: Hex;
    deposit: bigint;
    expiresAt?: bigint;
    payerPrivateKey?: Hex;
  },
): Promise<Hex> {
  const model = stack.demo.models[opts.model ?? 0]!;
  const permitId = id32(`permit:test:${Date.now()}:${permitCounter++}`);
  const { creator } = stack.roles;
  const payer =
    opts.payerPrivateKey === undefined
      ? stack.roles.payer
      : {
          address: privateKeyToAccount(opts.payerPrivateKey).address,
          privateKey: opts.payerPrivateKey,
        };
  await token(stack, creator.privateKey, model.creditToken, "mint", [payer.address, opts.deposit]);
  await token(stack, payer.privateKey, model.creditToken, "approve", [
    stack.demo.market,
    opts.deposit,
  ]);
  const block = await stack.clients.publicClient.getBlock();
  await market(stack, payer.privateKey, "openPermit", [
    permitId,
    model.modelId,
    opts.offerId ?? `0x${"00".repeat(32)}`,
    opts.deposit,
    opts.expiresAt ?? block.timestamp + 30n * 24n * 3600n,
  ]);
  return permitId;
}

export async function requestClose(stack: TestStack, permitId: Hex): Promise<void> {
  await market(stack, stack.roles.payer.privateKey, "requestClose", [permitId]);
}

/** Requests the close, lets the grace period pass on chain, and finalizes (refund). */
export async function closePermit(stack: TestStack, permitId: Hex): Promise<void> {
  await requestClose(stack, permitId);
  await finalizeClose(stack, permitId);
}

/** Moves anvil's clock `seconds` ahead and mines a block at the new time. */
export async function advanceChainTime(stack: TestStack, seconds: number): Promise<void> {
  await stack.clients.publicClient.request({
    method: "evm_increaseTime" as never,
    params: [seconds] as never,
  });
  await stack.clients.publicClient.request({ method: "evm_mine" as never, params: [] as never });
}

/** Lets the close grace period of a permit whose close was requested pass, and finalizes it. */
export async function finalizeClose(stack: TestStack, permitId: Hex): Promise<void> {
  await advanceChainTime(stack, 7200);
  await market(stack, stack.roles.payer.privateKey, "finalizeClose", [permitId]);
}

/** Mints `amount` of a demo model's credit token to `to` (as the model's creator, its owner). */
export async function mintCredits(
  stack: TestStack,
  to: Hex,
  amount: bigint,
  model = 0,
): Promise<void> {
  await token(
    stack,
    stack.roles.creator.privateKey,
    stack.demo.models[model]!.creditToken,
    "mint",
    [to, amount],
  );
}

export async function setOffer(
  stack: TestStack,
  offerId: Hex,
  change: { status?: number; tariff?: { input: bigint; output: bigint; wake: bigint } },
): Promise<void> {
  const operator = stack.roles.operator.privateKey;
  if (change.status !== undefined)
    await market(stack, operator, "setOfferStatus", [offerId, change.status]);
  if (change.tariff !== undefined) {
    const { input, output, wake } = change.tariff;
    await market(stack, operator, "setOfferTariff", [offerId, input, output, wake]);
  }
  // Index it now rather than waiting for the poll.
  await stack.gateway.indexer.syncOnce();
}

/** Publishes new metadata for an offer (as its operator would) and indexes it now. */
export async function setOfferMetadata(
  stack: TestStack,
  offerId: Hex,
  metadata: ReturnType<typeof demoMetadata>,
): Promise<void> {
  await market(stack, stack.roles.operator.privateKey, "setOfferMetadata", [offerId, metadata]);
  await stack.gateway.indexer.syncOnce();
}

/** Registers and verifies `endpointUrl` for an offer, as its operator would. */
export async function onboard(
  stack: TestStack,
  offerId: Hex,
  endpointUrl: string,
  endpointToken?: string,
): Promise<void> {
  auditSecret("endpoint url", endpointUrl);
  auditSecret("endpoint token", endpointToken);
  const connection = { baseUrl: stack.gateway.url, apiKey: stack.apiKey };
  await registerEndpoint(connection, {
    offerId,
    endpointUrl,
    ...(endpointToken === undefined ? {} : { endpointToken }),
    signer: privateKeyToAccount(stack.roles.operator.privateKey),
    chain: { chainId: stack.config.chainId, market: stack.demo.market },
  });
  await verifyOffer(connection, offerId);
}

/** The demo market's first active offer of its first model (the one `demo-chat` routes to). */
export function demoChatOffer(stack: TestStack): Hex {
  return stack.demo.offers.find(
    (o) => o.status === "active" && o.modelId === stack.demo.models[0]!.modelId,
  )!.offerId;
}

/** Twice the demo tariff: an offer at it is ranked after the demo chat offer. */
export const dearerTariff = {
  version: 0n,
  inputPricePerMTok: demoTariff.inputPricePerMTok * 2n,
  outputPricePerMTok: demoTariff.outputPricePerMTok * 2n,
  wakeFee: 0n,
};

/**
 * A second offer of `demo-chat` (the demo market's paused one), activated at
 * {@link dearerTariff} and onboarded on its own fake provider.
 */
export async function secondChatOffer(stack: TestStack): Promise<{ b: Hex; fakeB: FakeUpstream }> {
  const b = stack.demo.offers.find((o) => o.status === "paused")!.offerId;
  await setOffer(stack, b, {
    status: 0,
    tariff: {
      input: dearerTariff.inputPricePerMTok,
      output: dearerTariff.outputPricePerMTok,
      wake: 0n,
    },
  });
  const fakeB = await startFakeUpstream({ models: ["demo-chat"], chunks: 2 });
  await onboard(stack, b, fakeB.url);
  return { b, fakeB };
}
