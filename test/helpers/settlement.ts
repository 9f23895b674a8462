import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import { anvilAccounts } from "../../src/adapters/chain/anvil.js";
import { createChainSettlement } from "../../src/adapters/chain/settlement.js";
import { createPgSettlementStore } from "../../src/adapters/pg/settlement.js";
import {
  createSettlementFlusher,
  type SettlementChain,
  type SettlementFlusher,
  type SettlementFlusherDeps,
} from "../../src/domain/settlement/index.js";
import { authed, json, type TestStack } from "./stack.js";

/** The demo market's settlement operator (anvil account 1, `demoAccounts().settlement`). */
export const settlementKey: Hex = anvilAccounts()[1]!.privateKey;

/** A gateway environment that settles: the operator's key, and the close watcher on a short leash. */
export const settlingEnv = {
  PERMIT_CACHE_MS: "0",
  SETTLEMENT_PRIVATE_KEY: settlementKey,
  SETTLEMENT_WAIT_MS: "20000",
};

export const messages = [{ role: "user" as const, content: "hello settlement" }];

/** One chat on `permitId`; returns its request id and charge (from the record). */
export async function chatOn(
  stack: TestStack,
  permitId: Hex,
  opts: { stream?: boolean; model?: string } = {},
): Promise<{ id: string; charged: bigint; offerId: Hex }> {
  const res = await authed(stack, "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", "x-gateway-permit": permitId },
    body: JSON.stringify({
      model: opts.model ?? "demo-chat",
      messages,
      max_tokens: 16,
      stream: opts.stream === true,
    }),
  });
  if (res.status !== 200) throw new Error(`chat failed: ${res.status} ${await res.text()}`);
  const id = res.headers.get("x-gateway-request-id")!;
  await res.text();
  const record = await json(await authed(stack, `/v1/requests/${id}`));
  return { id, charged: BigInt(record.credits_charged), offerId: record.offer_id };
}

/** POST /settlements/flush with the operator token. */
export async function flush(
  stack: TestStack,
  body: object = {},
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
): Promise<{ status: number; body: any }> {
  const res = await fetch(`${stack.gateway.url}/settlements/flush`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.operatorToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await json(res) };
}

export async function chainPermit(stack: TestStack, permitId: Hex) {
  return stack.clients.publicClient.readContract({
    address: stack.demo.market,
    abi: marketAbi,
    functionName: "getPermit",
    args: [permitId],
  });
}

export async function tokenBalance(stack: TestStack, model: number, owner: Hex): Promise<bigint> {
  return stack.clients.publicClient.readContract({
    address: stack.demo.models[model]!.creditToken,
    abi: creditTokenAbi,
    functionName: "balanceOf",
    args: [owner],
  });
}

/** Settlement columns of the requests, by id. */
export async function settlementRows(stack: TestStack, ids: readonly string[]) {
  const { rows } = await stack.database.db.pool.query<{
    id: string;
    settlement_status: string;
    batch_id: string | null;
    tx_hash: string | null;
    settlement_reason: string | null;
    credits_charged: string;
  }>(
    `SELECT id, settlement_status, batch_id, tx_hash, settlement_reason, credits_charged
     FROM inference_requests WHERE id = ANY ($1::text[]) ORDER BY id`,
    [ids],
  );
  return rows;
}

/** The settlement operator's chain adapter on the stack's anvil. */
export function settlementChain(stack: TestStack): SettlementChain {
  return createChainSettlement({
    client: stack.clients.publicClient,
    chainId: stack.anvil.chainId,
    market: stack.demo.market,
    privateKey: settlementKey,
  });
}

/**
 * A flusher over the stack's database and `chain` (the real adapter, or one a test wraps to fail
 * at a step): what a settlement process of its own would run.
 */
export function testFlusher(
  stack: TestStack,
  chain: SettlementChain,
  overrides: Partial<SettlementFlusherDeps> = {},
): SettlementFlusher {
  return createSettlementFlusher({
    store: createPgSettlementStore(stack.database.db.pool),
    chain,
    holder: `test_${randomBytes(4).toString("hex")}`,
    logger: stack.logger,
    clock: () => Math.floor(Date.now() / 1000),
    confirmations: 0,
    maxBatchGas: 12_000_000n,
    replaceAfterBlocks: 2,
    feeBumpPercent: 20,
    feeCap: { maxFeePerGas: 500_000_000_000n, maxPriorityFeePerGas: 50_000_000_000n },
    waitMs: 5000,
    leaseSeconds: 30,
    pollMs: 50,
    ...overrides,
  });
}
