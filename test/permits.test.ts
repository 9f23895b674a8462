import { createPublicClient, custom, http, type Hex, type PublicClient } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAnvil, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { creditTokenAbi, marketAbi } from "../gen/contracts/artifacts.js";
import { chainClients, type ChainClients } from "../src/adapters/chain/clients.js";
import { createChainPermitReader } from "../src/adapters/chain/permits.js";
import {
  demoAccounts,
  id32,
  seedDemoMarket,
  type DemoAccounts,
  type DemoMarket,
} from "../src/dev/demo-market.js";
import { GatewayError } from "../src/domain/errors.js";
import { checkPermit } from "../src/domain/permits.js";

/** A public client whose JSON-RPC traffic is counted: HTTP requests and the calls in them. */
function countingClient(rpcUrl: string, clients: ChainClients) {
  const traffic = { requests: 0, calls: 0 };
  const client = createPublicClient({
    chain: clients.chain,
    transport: http(rpcUrl, {
      batch: true,
      retryCount: 0,
      onFetchRequest(_request, init) {
        traffic.requests += 1;
        const body: unknown = JSON.parse(String(init.body));
        traffic.calls += Array.isArray(body) ? body.length : 1;
      },
    }),
  }) as PublicClient;
  return { client, traffic };
}

describe("chain permit reader (anvil)", () => {
  let anvil: AnvilInstance;
  let clients: ChainClients;
  let roles: DemoAccounts;
  let demo: DemoMarket;
  let permitCount = 0;

  beforeAll(async () => {
    anvil = await startAnvil();
    clients = chainClients(anvil.chainId, anvil.rpcUrl, 50);
    roles = demoAccounts(anvil.accounts);
    demo = await seedDemoMarket(clients, roles);
  });
  afterAll(async () => {
    await anvil?.stop();
  });

  const confirm = async (hash: Hex): Promise<void> => {
    const receipt = await clients.publicClient.waitForTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
  };

  /** Opens a fresh permit on the demo chat model as the demo payer. */
  async function openPermit(offerId: Hex = `0x${"00".repeat(32)}`): Promise<Hex> {
    const permitId = id32(`permit:test:${(permitCount += 1)}`);
    const payer = clients.wallet(roles.payer.privateKey);
    const chat = demo.models[0]!;
    await confirm(
      await payer.writeContract({
        address: chat.creditToken,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [demo.market, 1000n],
      }),
    );
    const expiresAt = BigInt(Math.floor(Date.now() / 1000) + 3600);
    await confirm(
      await payer.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "openPermit",
        args: [permitId, chat.modelId, offerId, 1000n, expiresAt],
      }),
    );
    return permitId;
  }

  async function requestClose(permitId: Hex): Promise<void> {
    const payer = clients.wallet(roles.payer.privateKey);
    await confirm(
      await payer.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "requestClose",
        args: [permitId],
      }),
    );
  }

  function reader(opts: { maxStalenessMs?: number } = {}) {
    const clock = { ms: 1_000_000 };
    const { client, traffic } = countingClient(anvil.rpcUrl, clients);
    const permits = createChainPermitReader({
      client,
      market: demo.market,
      now: () => clock.ms,
      ...opts,
    });
    return { permits, traffic, clock };
  }

  it("reads the demo permit", async () => {
    const { permits } = reader();
    const permit = await permits.get(demo.permitId);
    expect(permit).toEqual({
      permitId: demo.permitId,
      payer: roles.payer.address.toLowerCase(),
      modelId: demo.models[0]!.modelId,
      offerId: undefined,
      deposit: demo.permitDeposit,
      settled: 0n,
      expiresAt: expect.any(Number),
      state: "open",
      closableAt: undefined,
    });
    expect(permit!.expiresAt).toBeGreaterThan(Date.now() / 1000 + 29 * 24 * 3600);
    const checked = await checkPermit(demo.permitId, permits, {
      modelId: demo.models[0]!.modelId,
      now: Math.floor(Date.now() / 1000),
    });
    expect(checked).toEqual(permit);
  });

  it("reads a permit pinned to an offer, and checkPermit enforces the pin", async () => {
    const offerId = demo.offers[0]!.offerId;
    const permitId = await openPermit(offerId);
    const { permits } = reader();
    expect(await permits.get(permitId)).toMatchObject({ permitId, offerId, state: "open" });
    const ctx = { modelId: demo.models[0]!.modelId, now: Math.floor(Date.now() / 1000) };
    await expect(
      checkPermit(permitId, permits, { ...ctx, pinnedOfferId: offerId }),
    ).resolves.toBeDefined();
    await expect(
      checkPermit(permitId, permits, { ...ctx, pinnedOfferId: demo.offers[2]!.offerId }),
    ).rejects.toMatchObject({ code: "permit_offer_mismatch" });
    await expect(
      checkPermit(permitId, permits, { ...ctx, modelId: demo.models[1]!.modelId }),
    ).rejects.toMatchObject({ code: "permit_model_mismatch" });
  });

  it("answers undefined for an unknown permit, remembered only briefly", async () => {
    const { permits, traffic, clock } = reader();
    const unknown = id32("permit:nobody");
    expect(await permits.get(unknown)).toBeUndefined();
    expect(await permits.get(unknown)).toBeUndefined();
    expect(traffic.calls).toBe(1);
    clock.ms += 500;
    expect(await permits.get(unknown)).toBeUndefined();
    expect(traffic.calls).toBe(2);
    await expect(
      checkPermit(unknown, permits, { modelId: demo.models[0]!.modelId, now: 0 }),
    ).rejects.toMatchObject({ code: "permit_not_found" });
  });

  it("serves repeated reads within the staleness bound without an RPC", async () => {
    const { permits, traffic, clock } = reader();
    await permits.get(demo.permitId);
    expect(traffic).toEqual({ requests: 1, calls: 1 });
    for (let i = 0; i < 5; i += 1) {
      clock.ms += 399;
      expect(await permits.get(demo.permitId)).toMatchObject({ state: "open" });
    }
    expect(traffic).toEqual({ requests: 1, calls: 1 });
    clock.ms += 5;
    await permits.get(demo.permitId);
    expect(traffic).toEqual({ requests: 2, calls: 2 });
  });

  it("coalesces concurrent reads of one permit and batches reads of several", async () => {
    const { permits, traffic } = reader();
    const same = await Promise.all(Array.from({ length: 5 }, () => permits.get(demo.permitId)));
    expect(new Set(same.map((p) => p?.permitId))).toEqual(new Set([demo.permitId]));
    expect(traffic).toEqual({ requests: 1, calls: 1 });
    const ids = [id32("permit:a"), id32("permit:b"), id32("permit:c")];
    await Promise.all(ids.map((id) => permits.get(id)));
    expect(traffic).toEqual({ requests: 2, calls: 4 });
  });

  it("sees a closing permit after invalidate", async () => {
    const permitId = await openPermit();
    const { permits, traffic } = reader();
    expect(await permits.get(permitId)).toMatchObject({ state: "open" });
    await requestClose(permitId);
    // Within staleness the cache still answers, without asking the chain.
    expect(await permits.get(permitId)).toMatchObject({ state: "open" });
    expect(traffic.calls).toBe(1);
    permits.invalidate(permitId);
    // closableAt is the close request's block time plus the market's grace period.
    const block = await clients.publicClient.getBlock();
    const grace = await clients.publicClient.readContract({
      address: demo.market,
      abi: marketAbi,
      functionName: "closeGracePeriod",
    });
    expect(await permits.get(permitId)).toMatchObject({
      state: "closing",
      closableAt: Number(block.timestamp + grace),
    });
    await expect(
      checkPermit(permitId, permits, { modelId: demo.models[0]!.modelId, now: 0 }),
    ).rejects.toMatchObject({ code: "permit_closing", kind: "payment" });
  });

  it("sees a closing permit once the cached read is older than maxStalenessMs", async () => {
    const permitId = await openPermit();
    const { permits, clock } = reader({ maxStalenessMs: 2000 });
    expect(await permits.get(permitId)).toMatchObject({ state: "open" });
    await requestClose(permitId);
    clock.ms += 1999;
    expect(await permits.get(permitId)).toMatchObject({ state: "open" });
    clock.ms += 1;
    expect(await permits.get(permitId)).toMatchObject({ state: "closing" });
  });

  it("does not let a read in flight at invalidate serve later callers", async () => {
    const { permits, traffic } = reader();
    const first = permits.get(demo.permitId);
    permits.invalidate(demo.permitId);
    const second = permits.get(demo.permitId);
    expect(second).not.toBe(first);
    await Promise.all([first, second]);
    expect(traffic.calls).toBe(2);
    // The second read was stored; the first, possibly older, was not allowed to.
    await permits.get(demo.permitId);
    expect(traffic.calls).toBe(2);
  });

  it("bounds the cache, evicting the oldest entry", async () => {
    const { client, traffic } = countingClient(anvil.rpcUrl, clients);
    const permits = createChainPermitReader({ client, market: demo.market, maxEntries: 2 });
    const [a, b, c] = [id32("permit:x"), id32("permit:y"), demo.permitId];
    for (const id of [a, b, c]) await permits.get(id);
    expect(permits.size).toBe(2);
    expect(traffic.calls).toBe(3);
    await permits.get(c);
    await permits.get(b);
    expect(traffic.calls).toBe(3);
    await permits.get(a);
    expect(traffic.calls).toBe(4);
  });

  it("propagates a failed read as chain_unavailable and asks again on the next get", async () => {
    let down = true;
    const inner = http(anvil.rpcUrl, { retryCount: 0 })({ chain: clients.chain });
    const client = createPublicClient({
      chain: clients.chain,
      transport: custom(
        {
          async request(args) {
            if (down) throw new Error("rpc down");
            return inner.request(args);
          },
        },
        { retryCount: 0 },
      ),
    }) as PublicClient;
    const permits = createChainPermitReader({ client, market: demo.market });
    await expect(permits.get(demo.permitId)).rejects.toMatchObject({ code: "chain_unavailable" });
    expect(permits.size).toBe(0);
    down = false;
    expect(await permits.get(demo.permitId)).toMatchObject({ state: "open" });
  });

  // Last: it stops the node.
  it("fails closed when the chain stops answering, and never caches the failure", async () => {
    const { permits, clock } = reader({ maxStalenessMs: 2000 });
    await permits.get(demo.permitId);
    await anvil.stop();
    // A fresh read within staleness is still served (the chain was read 0 ms ago)...
    expect(await permits.get(demo.permitId)).toMatchObject({ state: "open" });
    clock.ms += 2000;
    // ...an expired one asks the chain, which fails.
    const error = await permits.get(demo.permitId).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(GatewayError);
    expect(error).toMatchObject({ code: "chain_unavailable" });
    const ctx = { modelId: demo.models[0]!.modelId, now: Math.floor(Date.now() / 1000) };
    await expect(checkPermit(demo.permitId, permits, ctx)).rejects.toMatchObject({
      code: "chain_unavailable",
      kind: "unavailable",
    });
    expect(permits.size).toBe(0);
  });
});
