import { privateKeyToAccount } from "viem/accounts";
import type { Hex } from "viem";
import { creditTokenAbi, marketAbi } from "../../src/adapters/chain/artifacts.js";
import { id32 } from "../../src/dev/demo-market.js";
import { registerEndpoint, verifyOffer } from "../../src/provider/client.js";
import type { TestStack } from "./stack.js";

let permitCounter = 0;

async function send(stack: TestStack, hash: Hex): Promise<void> {
  const receipt = await stack.clients.publicClient.waitForTransactionReceipt({ hash });
  if (receipt.status !== "success") throw new Error(`transaction ${hash} reverted`);
}

/** Opens a permit from the demo payer (minting and approving the model's credits first). */
export async function openPermit(
  stack: TestStack,
  opts: { model?: number; offerId?: Hex; deposit: bigint; expiresAt?: bigint },
): Promise<Hex> {
  const model = stack.demo.models[opts.model ?? 0]!;
  const permitId = id32(`permit:test:${Date.now()}:${permitCounter++}`);
  const creator = stack.clients.wallet(stack.roles.creator.privateKey);
  const payer = stack.clients.wallet(stack.roles.payer.privateKey);
  await send(
    stack,
    await creator.writeContract({
      address: model.creditToken,
      abi: creditTokenAbi,
      functionName: "mint",
      args: [stack.roles.payer.address, opts.deposit],
    }),
  );
  await send(
    stack,
    await payer.writeContract({
      address: model.creditToken,
      abi: creditTokenAbi,
      functionName: "approve",
      args: [stack.demo.market, opts.deposit],
    }),
  );
  const block = await stack.clients.publicClient.getBlock();
  await send(
    stack,
    await payer.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "openPermit",
      args: [
        permitId,
        model.modelId,
        opts.offerId ?? `0x${"00".repeat(32)}`,
        opts.deposit,
        opts.expiresAt ?? block.timestamp + 30n * 24n * 3600n,
      ],
    }),
  );
  return permitId;
}

export async function requestClose(stack: TestStack, permitId: Hex): Promise<void> {
  const payer = stack.clients.wallet(stack.roles.payer.privateKey);
  await send(
    stack,
    await payer.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "requestClose",
      args: [permitId],
    }),
  );
}

export async function closePermit(stack: TestStack, permitId: Hex): Promise<void> {
  await requestClose(stack, permitId);
  await stack.clients.publicClient.request({
    method: "evm_increaseTime" as never,
    params: [7200] as never,
  });
  await stack.clients.publicClient.request({ method: "evm_mine" as never, params: [] as never });
  const payer = stack.clients.wallet(stack.roles.payer.privateKey);
  await send(
    stack,
    await payer.writeContract({
      address: stack.demo.market,
      abi: marketAbi,
      functionName: "finalizeClose",
      args: [permitId],
    }),
  );
}

export async function setOffer(
  stack: TestStack,
  offerId: Hex,
  change: { status?: number; tariff?: { input: bigint; output: bigint; wake: bigint } },
): Promise<void> {
  const operator = stack.clients.wallet(stack.roles.operator.privateKey);
  if (change.status !== undefined) {
    await send(
      stack,
      await operator.writeContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "setOfferStatus",
        args: [offerId, change.status],
      }),
    );
  }
  if (change.tariff !== undefined) {
    await send(
      stack,
      await operator.writeContract({
        address: stack.demo.market,
        abi: marketAbi,
        functionName: "setOfferTariff",
        args: [offerId, change.tariff.input, change.tariff.output, change.tariff.wake],
      }),
    );
  }
  // Index it now rather than waiting for the poll.
  await stack.gateway.indexer.syncOnce();
}

/** Registers and verifies `endpointUrl` for an offer, as its operator would. */
export async function onboard(
  stack: TestStack,
  offerId: Hex,
  endpointUrl: string,
  token?: string,
): Promise<void> {
  const connection = { baseUrl: stack.gateway.url, apiKey: stack.apiKey };
  await registerEndpoint(connection, {
    offerId,
    endpointUrl,
    ...(token === undefined ? {} : { endpointToken: token }),
    signer: privateKeyToAccount(stack.roles.operator.privateKey),
  });
  await verifyOffer(connection, offerId);
}
