import { randomBytes } from "node:crypto";
import pg from "pg";
import { zeroHash, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import type { AnvilInstance } from "../../src/adapters/chain/anvil.js";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import { chainClients, type ChainClients } from "../../src/adapters/chain/clients.js";
import { createApiKey } from "../../src/adapters/pg/api-keys.js";
import { authorizeApiKey } from "../../src/clients/permit.js";
import {
  inputTokenUpperBound,
  outputBound,
  parseChatRequest,
} from "../../src/domain/chat/request/index.js";
import { maximumCredits } from "../../src/domain/pricing.js";
import {
  demoAccounts,
  demoMetadata,
  demoTariff,
  id32,
  seedDemoMarket,
  type DemoAccounts,
  type DemoMarket,
} from "../../src/dev/demo-market.js";
import { registerEndpoint, verifyOffer } from "../../src/clients/provider.js";

/** Outside harnesses start the bench's chain with the product's own anvil launcher. */
export { startAnvil, type AnvilInstance } from "../../src/adapters/chain/anvil.js";

/** A fresh `gw_bench_<hex>` database on the server of `serverUrl`. */
export interface BenchDatabase {
  readonly name: string;
  readonly url: string;
  /** Drops the database (terminating leftover connections). Idempotent. */
  drop(): Promise<void>;
}

async function withAdmin<T>(serverUrl: string, run: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: serverUrl, connectionTimeoutMillis: 10_000 });
  await client.connect();
  try {
    return await run(client);
  } finally {
    await client.end();
  }
}

export async function createBenchDatabase(serverUrl: string): Promise<BenchDatabase> {
  const name = `gw_bench_${randomBytes(6).toString("hex")}`;
  await withAdmin(serverUrl, (c) => c.query(`CREATE DATABASE ${name}`));
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  let dropping: Promise<void> | undefined;
  return {
    name,
    url: url.toString(),
    drop() {
      dropping ??= withAdmin(serverUrl, async (c) => {
        try {
          // PostgreSQL 13+: also ends connections a killed gateway may have left behind.
          await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
        } catch {
          await c.query(`DROP DATABASE IF EXISTS ${name}`);
        }
      });
      return dropping;
    },
  };
}

export interface BenchMarket {
  readonly clients: ChainClients;
  readonly roles: DemoAccounts;
  readonly demo: DemoMarket;
  /** The permit every benchmark request spends: fresh, on `demo-chat`, any offer. */
  readonly permitId: Hex;
  readonly permitDeposit: bigint;
  /** `max_concurrency` the active demo offers were given for the run. */
  readonly maxConcurrency: number;
}

/**
 * The demo market, adjusted for load: the demo offers allow 8 concurrent requests, which would
 * answer most of 32 connections with 429 `offer_at_capacity`, so the active offers get
 * `maxConcurrency` (through `setOfferMetadata`, before the gateway indexes them); and a fresh
 * permit with `deposit` credits (the demo's 100 credits are far from exhausted by a run, but a
 * run should never be able to end on `insufficient_credits`).
 */
export async function seedBenchMarket(
  anvil: AnvilInstance,
  opts: { maxConcurrency: number; deposit: bigint },
): Promise<BenchMarket> {
  const clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
  const roles = demoAccounts(anvil.accounts);
  const demo = await seedDemoMarket(clients, roles);
  const { publicClient } = clients;
  const confirm = async (hash: Hex): Promise<void> => {
    const receipt = await publicClient.waitForTransactionReceipt({ hash });
    if (receipt.status !== "success") throw new Error(`bench transaction ${hash} reverted`);
  };

  const operator = clients.wallet(roles.operator.privateKey);
  for (const offer of demo.offers.filter((o) => o.status === "active")) {
    await confirm(
      await operator.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "setOfferMetadata",
        args: [
          offer.offerId,
          { ...demoMetadata("eu-west", "cpu"), maxConcurrency: opts.maxConcurrency },
        ],
      }),
    );
  }

  const chat = demo.models.find((m) => m.id === "demo-chat");
  if (!chat) throw new Error("the demo market has no demo-chat model");
  const creator = clients.wallet(roles.creator.privateKey);
  const payer = clients.wallet(roles.payer.privateKey);
  await confirm(
    await creator.writeContract({
      address: chat.creditToken,
      abi: creditTokenAbi,
      functionName: "mint",
      args: [roles.payer.address, opts.deposit],
    }),
  );
  await confirm(
    await payer.writeContract({
      address: chat.creditToken,
      abi: creditTokenAbi,
      functionName: "approve",
      args: [demo.market, opts.deposit],
    }),
  );
  const permitId = id32(`permit:bench:${randomBytes(8).toString("hex")}`);
  const expiresAt = BigInt(Math.floor(Date.now() / 1000) + 24 * 3600);
  await confirm(
    await payer.writeContract({
      address: demo.market,
      abi: marketAbi,
      functionName: "openPermit",
      args: [permitId, chat.modelId, zeroHash, opts.deposit, expiresAt],
    }),
  );
  return {
    clients,
    roles,
    demo,
    permitId,
    permitDeposit: opts.deposit,
    maxConcurrency: opts.maxConcurrency,
  };
}

/**
 * The most one of `bodies` can reserve at the demo tariff: the price of the gateway's input-token
 * bound and the request's output bound (the output limit times `n`), with the wake fee (what a
 * quote's `maximum_credits` is).
 */
export function maximumCreditsPerRequest(bodies: readonly string[]): bigint {
  let most = 0n;
  for (const text of bodies) {
    const req = parseChatRequest(new TextEncoder().encode(text), { maxBytes: 1 << 20 });
    const credits = maximumCredits(
      demoTariff,
      { inputTokenBound: inputTokenUpperBound(req), outputBound: outputBound(req, {}) },
      true,
    );
    if (credits > most) most = credits;
  }
  return most;
}

/** An API key on the bench database (the gateway has migrated it by now). */
export async function createBenchApiKey(databaseUrl: string): Promise<string> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
  try {
    return (await createApiKey(pool, "bench")).key;
  } finally {
    await pool.end();
  }
}

/**
 * The demo payer authorizes the bench API key to spend its permits, through the gateway's
 * routes with the payer's signature (DESIGN.md section 8): without it every chat is 403
 * `permit_not_authorized` and the preflight fails.
 */
export async function authorizeBenchKey(
  market: BenchMarket,
  gateway: { baseUrl: string; apiKey: string },
): Promise<void> {
  await authorizeApiKey(gateway, {
    signer: privateKeyToAccount(market.roles.payer.privateKey),
    chain: { chainId: market.clients.chain.id, market: market.demo.market },
  });
}

/**
 * Registers and verifies every active demo offer against the fake upstream, with the demo
 * operator's key: the same signed challenge a real provider goes through (src/dev/sandbox.ts).
 */
export async function onboardOffers(
  market: BenchMarket,
  gateway: { baseUrl: string; apiKey: string },
  upstreamUrl: string,
): Promise<number> {
  const signer = privateKeyToAccount(market.roles.operator.privateKey);
  const endpointToken = `bench_${randomBytes(16).toString("hex")}`;
  const active = market.demo.offers.filter((o) => o.status === "active");
  for (const offer of active) {
    await registerEndpoint(gateway, {
      offerId: offer.offerId,
      endpointUrl: upstreamUrl,
      endpointToken,
      signer,
      chain: { chainId: market.clients.chain.id, market: market.demo.market },
    });
    const { offer: verified } = await verifyOffer(gateway, offer.offerId);
    if (verified.verified_at === null) {
      throw new Error(`offer ${offer.offerId} was not verified against the fake upstream`);
    }
  }
  return active.length;
}
