import {
  BaseError,
  ContractFunctionRevertedError,
  createPublicClient,
  createTestClient,
  createWalletClient,
  defineChain,
  erc20Abi,
  getContract,
  http,
  keccak256,
  parseEventLogs,
  serializeCompactSignature,
  signatureToCompactSignature,
  stringToHex,
  zeroHash,
  type Address,
  type Hash,
  type Hex,
  type PublicClient,
  type TestClient,
} from "viem";
import { privateKeyToAccount, sign } from "viem/accounts";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startAnvil, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import { creditTokenAbi, erc1271WalletAbi, marketAbi } from "../gen/contracts/artifacts.js";
import {
  deployCreditToken,
  deployErc1271Wallet,
  deployMarket,
  type DeployerWallet,
} from "../src/adapters/chain/deploy.js";

const gracePeriod = 3600n;
const id = (label: string): Hex => keccak256(stringToHex(label));

const modelId = id("model:llama");
const otherModelId = id("model:mistral");
const offerA = id("offer:a");
const offerB = id("offer:b");
const offerOther = id("offer:other-model");

const metadata = {
  region: "eu-west",
  hardware: "1xH100",
  maxConcurrency: 8,
  capabilities: '{"max_output_tokens":4096,"context_window":8192,"streaming":true}',
};
const tariff = { version: 42n, inputPricePerMTok: 100n, outputPricePerMTok: 300n, wakeFee: 7n };

let anvil: AnvilInstance;
let pub: PublicClient;
let testClient: TestClient<"anvil">;
let snapshot: Hex;

let marketAddress: Address;
let tokenAddress: Address;

type Role =
  | "deployer"
  | "settler"
  | "creator"
  | "offerOwner"
  | "operator"
  | "payout"
  | "payer"
  | "stranger"
  | "payout2"
  | "payer2";
const roles: Role[] = [
  "deployer",
  "settler",
  "creator",
  "offerOwner",
  "operator",
  "payout",
  "payer",
  "stranger",
  "payout2",
  "payer2",
];
const wallets = {} as Record<Role, DeployerWallet>;
const addr = {} as Record<Role, Address>;

function market(role: Role) {
  return getContract({
    address: marketAddress,
    abi: marketAbi,
    client: { public: pub, wallet: wallets[role] },
  });
}

function token(role: Role) {
  return getContract({
    address: tokenAddress,
    abi: creditTokenAbi,
    client: { public: pub, wallet: wallets[role] },
  });
}

/** Waits for a transaction and insists it succeeded. */
async function mined(hash: Promise<Hash>) {
  const receipt = await pub.waitForTransactionReceipt({ hash: await hash });
  expect(receipt.status).toBe("success");
  return receipt;
}

/** Asserts the call reverts with the named custom error (and, if given, these arguments). */
async function expectRevert(
  call: Promise<unknown>,
  errorName: string,
  args?: readonly unknown[],
): Promise<void> {
  const err = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, `expected revert ${errorName}`).toBeInstanceOf(BaseError);
  const reverted = (err as BaseError).walk((e) => e instanceof ContractFunctionRevertedError);
  expect(reverted, String(err)).toBeInstanceOf(ContractFunctionRevertedError);
  const data = (reverted as ContractFunctionRevertedError).data;
  expect(data?.errorName).toBe(errorName);
  if (args) expect(data?.args).toEqual(args);
}

async function balanceOf(who: Address): Promise<bigint> {
  return pub.readContract({
    address: tokenAddress,
    abi: erc20Abi,
    functionName: "balanceOf",
    args: [who],
  });
}

async function balances(...who: Address[]): Promise<bigint[]> {
  return Promise.all(who.map(balanceOf));
}

async function now(): Promise<bigint> {
  return (await pub.getBlock()).timestamp;
}

async function advance(seconds: bigint): Promise<void> {
  await testClient.increaseTime({ seconds: Number(seconds) });
  await testClient.mine({ blocks: 1 });
}

async function openPermit(
  permitId: Hex,
  deposit: bigint,
  opts: { offerId?: Hex; payer?: Role; model?: Hex; ttl?: bigint } = {},
) {
  const expiresAt = (await now()) + (opts.ttl ?? 86_400n);
  return mined(
    market(opts.payer ?? "payer").write.openPermit([
      permitId,
      opts.model ?? modelId,
      opts.offerId ?? zeroHash,
      deposit,
      expiresAt,
    ]),
  );
}

function settle(
  batchId: Hex,
  charges: { permitId: Hex; offerId: Hex; amount: bigint }[],
  as: Role = "settler",
) {
  return market(as).write.settle([batchId, charges]);
}

beforeAll(async () => {
  anvil = await startAnvil();
  const chain = defineChain({
    id: anvil.chainId,
    name: "anvil",
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [anvil.rpcUrl] } },
  });
  const transport = http(anvil.rpcUrl);
  pub = createPublicClient({ chain, transport });
  testClient = createTestClient({ chain, transport, mode: "anvil" });
  roles.forEach((role, i) => {
    const key = anvil.accounts[i]?.privateKey;
    if (!key) throw new Error(`no anvil account ${i}`);
    const account = privateKeyToAccount(key);
    wallets[role] = createWalletClient({ account, chain, transport });
    addr[role] = account.address;
  });

  marketAddress = await deployMarket(wallets.deployer, pub, {
    settlementOperator: addr.settler,
    closeGracePeriod: gracePeriod,
  });
  tokenAddress = await deployCreditToken(wallets.creator, pub, {
    name: "Llama Credits",
    symbol: "LLC",
    owner: addr.creator,
  });

  const m = market("creator");
  await mined(
    m.write.createModel([modelId, tokenAddress, "meta/llama", "main", "chat", id("pool"), 7n]),
  );
  await mined(
    m.write.createModel([otherModelId, tokenAddress, "mistral", "v1", "chat", zeroHash, 0n]),
  );
  await mined(m.write.setModelStatus([modelId, 1]));
  const o = market("offerOwner");
  for (const [offerId, model] of [
    [offerA, modelId],
    [offerB, modelId],
    [offerOther, otherModelId],
  ] as const) {
    await mined(
      o.write.createOffer([offerId, model, addr.operator, addr.payout, tariff, metadata]),
    );
  }
  for (const payer of ["payer", "payer2"] as const) {
    await mined(token("creator").write.mint([addr[payer], 1_000_000n]));
    await mined(token(payer).write.approve([marketAddress, 2n ** 256n - 1n]));
  }
});

afterAll(async () => {
  await anvil?.stop();
});

// Every test starts from the fixture above: snapshot before, roll back after.
beforeEach(async () => {
  snapshot = await testClient.snapshot();
});

afterEach(async () => {
  await testClient.revert({ id: snapshot });
});

describe("settlement", () => {
  it("moves the charged credits from the escrow to the offer's payout", async () => {
    const permitId = id("permit:pay");
    await openPermit(permitId, 1000n);
    expect(await balances(addr.payer, marketAddress)).toEqual([999_000n, 1000n]);

    await mined(
      settle(id("batch:1"), [
        { permitId, offerId: offerA, amount: 250n },
        { permitId, offerId: offerB, amount: 50n },
      ]),
    );
    expect(await balances(addr.payout, marketAddress)).toEqual([300n, 700n]);
    expect((await market("stranger").read.getPermit([permitId])).settled).toBe(300n);

    // a changed payout address receives later settlements
    await mined(market("offerOwner").write.setOfferPayout([offerA, addr.payout2]));
    await mined(settle(id("batch:2"), [{ permitId, offerId: offerA, amount: 100n }]));
    expect(await balances(addr.payout, addr.payout2, marketAddress)).toEqual([300n, 100n, 600n]);
  });

  it("settles a batch id only once", async () => {
    const permitId = id("permit:replay");
    await openPermit(permitId, 1000n);
    const batchId = id("batch:replay");
    expect(await market("stranger").read.isBatchSettled([batchId])).toBe(false);
    await mined(settle(batchId, [{ permitId, offerId: offerA, amount: 100n }]));
    expect(await market("stranger").read.isBatchSettled([batchId])).toBe(true);

    // the replay would be valid on its own: only the batch id makes it a replay
    await expectRevert(
      settle(batchId, [{ permitId, offerId: offerA, amount: 100n }]),
      "BatchAlreadySettled",
      [batchId],
    );
    expect(await balances(addr.payout, marketAddress)).toEqual([100n, 900n]);
    expect((await market("stranger").read.getPermit([permitId])).settled).toBe(100n);
  });

  it("accepts settlement only from the settlement operator", async () => {
    const permitId = id("permit:auth");
    await openPermit(permitId, 1000n);
    const charges = [{ permitId, offerId: offerA, amount: 10n }];
    for (const role of ["stranger", "deployer", "payer", "offerOwner", "operator"] as const) {
      await expectRevert(settle(id("batch:auth"), charges, role), "NotSettlementOperator");
    }

    // the owner can hand the role over; the old operator then loses it
    await expectRevert(
      market("stranger").write.setSettlementOperator([addr.stranger]),
      "Unauthorized",
    );
    await mined(market("deployer").write.setSettlementOperator([addr.stranger]));
    await expectRevert(settle(id("batch:auth"), charges, "settler"), "NotSettlementOperator");
    await mined(settle(id("batch:auth"), charges, "stranger"));
    expect(await balanceOf(addr.payout)).toBe(10n);
  });

  it("rejects a charge beyond the deposit, within and across batches, moving nothing", async () => {
    const permitId = id("permit:cap");
    const otherPermit = id("permit:cap-other");
    await openPermit(permitId, 1000n);
    await openPermit(otherPermit, 1000n, { payer: "payer2" });

    await expectRevert(
      settle(id("batch:x"), [{ permitId, offerId: offerA, amount: 1001n }]),
      "ChargeExceedsDeposit",
      [permitId, 1000n, 1001n],
    );
    // cumulative within one batch; the valid charge on another permit is rolled back too
    const overInBatch = [
      { permitId: otherPermit, offerId: offerA, amount: 5n },
      { permitId, offerId: offerA, amount: 600n },
      { permitId, offerId: offerB, amount: 401n },
    ];
    await expectRevert(settle(id("batch:x"), overInBatch), "ChargeExceedsDeposit", [
      permitId,
      400n,
      401n,
    ]);
    // mined on chain (gas given, so no estimate stops it first): the transaction reverts whole
    const receipt = await pub.waitForTransactionReceipt({
      hash: await market("settler").write.settle([id("batch:x"), overInBatch], {
        gas: 1_000_000n,
      }),
    });
    expect(receipt.status).toBe("reverted");
    expect(await market("stranger").read.isBatchSettled([id("batch:x")])).toBe(false);
    expect(await balances(addr.payout, marketAddress)).toEqual([0n, 2000n]);
    expect((await market("stranger").read.getPermit([otherPermit])).settled).toBe(0n);

    // cumulative across batches
    await mined(settle(id("batch:1"), [{ permitId, offerId: offerA, amount: 600n }]));
    await expectRevert(
      settle(id("batch:2"), [{ permitId, offerId: offerA, amount: 401n }]),
      "ChargeExceedsDeposit",
      [permitId, 400n, 401n],
    );
    expect(await balances(addr.payout, marketAddress)).toEqual([600n, 1400n]);
    expect((await market("stranger").read.getPermit([permitId])).settled).toBe(600n);

    // exactly the rest is fine
    await mined(settle(id("batch:2"), [{ permitId, offerId: offerA, amount: 400n }]));
    expect(await balances(addr.payout, marketAddress)).toEqual([1000n, 1000n]);
  });

  it("rejects a charge for another offer on a pinned permit, or an offer of another model", async () => {
    const pinned = id("permit:pinned");
    const open = id("permit:any");
    await openPermit(pinned, 1000n, { offerId: offerA });
    await openPermit(open, 1000n);

    await expectRevert(
      settle(id("batch:pin"), [{ permitId: pinned, offerId: offerB, amount: 1n }]),
      "OfferMismatch",
      [pinned, offerB],
    );
    await expectRevert(
      settle(id("batch:pin"), [{ permitId: open, offerId: offerOther, amount: 1n }]),
      "OfferMismatch",
      [open, offerOther],
    );
    await expectRevert(
      settle(id("batch:pin"), [{ permitId: open, offerId: id("offer:none"), amount: 1n }]),
      "NotFound",
    );
    // a permit cannot be pinned to an offer of another model
    await expectRevert(
      market("payer").write.openPermit([id("permit:bad"), modelId, offerOther, 1n, 2n ** 63n]),
      "OfferMismatch",
    );
    await mined(
      settle(id("batch:pin"), [
        { permitId: pinned, offerId: offerA, amount: 1n },
        { permitId: open, offerId: offerB, amount: 2n },
      ]),
    );
    expect(await balanceOf(addr.payout)).toBe(3n);
  });

  it("still settles usage on an expired permit", async () => {
    const permitId = id("permit:expired");
    await openPermit(permitId, 1000n, { ttl: 60n });
    await advance(120n);
    expect((await market("stranger").read.getPermit([permitId])).expiresAt).toBeLessThan(
      await now(),
    );
    await mined(settle(id("batch:late"), [{ permitId, offerId: offerA, amount: 10n }]));
    expect(await balanceOf(addr.payout)).toBe(10n);
  });

  it("emits one ChargeSettled per charge and a BatchSettled with the total", async () => {
    const permitId = id("permit:events");
    await openPermit(permitId, 1000n);
    const batchId = id("batch:events");
    const receipt = await mined(
      settle(batchId, [
        { permitId, offerId: offerA, amount: 10n },
        { permitId, offerId: offerB, amount: 20n },
      ]),
    );
    const charged = parseEventLogs({
      abi: marketAbi,
      logs: receipt.logs,
      eventName: "ChargeSettled",
    });
    expect(charged.map((l) => l.args)).toEqual([
      { batchId, permitId, offerId: offerA, amount: 10n },
      { batchId, permitId, offerId: offerB, amount: 20n },
    ]);
    const [batch] = parseEventLogs({
      abi: marketAbi,
      logs: receipt.logs,
      eventName: "BatchSettled",
    });
    expect(batch?.args).toEqual({ batchId, charges: 2n, total: 30n });
    // indexed ids can be filtered on
    const filtered = await pub.getContractEvents({
      address: marketAddress,
      abi: marketAbi,
      eventName: "ChargeSettled",
      args: { offerId: offerB },
      fromBlock: receipt.blockNumber,
    });
    expect(filtered.map((l) => l.args.amount)).toEqual([20n]);
  });
});

describe("permit lifecycle", () => {
  it("escrows the deposit and emits PermitOpened", async () => {
    const permitId = id("permit:open");
    const receipt = await openPermit(permitId, 500n, { offerId: offerB });
    const [opened] = parseEventLogs({
      abi: marketAbi,
      logs: receipt.logs,
      eventName: "PermitOpened",
    });
    expect(opened?.args).toMatchObject({
      permitId,
      payer: addr.payer,
      modelId,
      offerId: offerB,
      deposit: 500n,
    });
    const permit = await market("stranger").read.getPermit([permitId]);
    expect(permit).toMatchObject({ payer: addr.payer, deposit: 500n, settled: 0n, state: 1 });
    expect(await balances(addr.payer, marketAddress)).toEqual([999_500n, 500n]);

    await expectRevert(openPermit(permitId, 1n), "AlreadyExists");
    await expectRevert(openPermit(id("permit:zero"), 0n), "InvalidArgument");
    await expectRevert(openPermit(id("permit:nomodel"), 1n, { model: id("x") }), "NotFound");
  });

  it("refunds deposit minus settled only after the grace period", async () => {
    const permitId = id("permit:close");
    await openPermit(permitId, 1000n);
    await mined(settle(id("batch:pre"), [{ permitId, offerId: offerA, amount: 300n }]));

    await expectRevert(market("stranger").write.requestClose([permitId]), "Unauthorized");
    await expectRevert(market("stranger").write.finalizeClose([permitId]), "InvalidState");
    const receipt = await mined(market("payer").write.requestClose([permitId]));
    const [requested] = parseEventLogs({
      abi: marketAbi,
      logs: receipt.logs,
      eventName: "PermitCloseRequested",
    });
    const closableAt =
      (await pub.getBlock({ blockNumber: receipt.blockNumber })).timestamp + gracePeriod;
    expect(requested?.args).toEqual({ permitId, closableAt });
    expect(await market("stranger").read.getPermit([permitId])).toMatchObject({
      state: 2,
      closableAt,
    });

    await expectRevert(market("stranger").write.finalizeClose([permitId]), "GracePeriodNotOver", [
      closableAt,
    ]);
    // usage incurred before the close can still settle while closing
    await mined(settle(id("batch:closing"), [{ permitId, offerId: offerB, amount: 100n }]));

    await advance(gracePeriod - 60n);
    await expectRevert(market("stranger").write.finalizeClose([permitId]), "GracePeriodNotOver");
    const payerBefore = await balanceOf(addr.payer);

    await advance(60n);
    // anyone may finalize; the refund always goes to the payer
    const closed = await mined(market("stranger").write.finalizeClose([permitId]));
    const [event] = parseEventLogs({
      abi: marketAbi,
      logs: closed.logs,
      eventName: "PermitClosed",
    });
    expect(event?.args).toEqual({ permitId, refund: 600n });
    expect(await balanceOf(addr.payer)).toBe(payerBefore + 600n);
    expect(await balances(addr.payout, marketAddress)).toEqual([400n, 0n]);
    expect((await market("stranger").read.getPermit([permitId])).state).toBe(3);

    await expectRevert(market("stranger").write.finalizeClose([permitId]), "InvalidState");
    await expectRevert(
      settle(id("batch:after"), [{ permitId, offerId: offerA, amount: 1n }]),
      "InvalidState",
    );
  });
});

describe("models and offers", () => {
  it("creates an offer at tariff version 1 and bumps the version on each change", async () => {
    const offerId = id("offer:new");
    const receipt = await mined(
      market("offerOwner").write.createOffer([
        offerId,
        modelId,
        addr.operator,
        addr.payout,
        tariff,
        metadata,
      ]),
    );
    const logs = parseEventLogs({ abi: marketAbi, logs: receipt.logs });
    expect(logs.map((l) => l.eventName)).toEqual([
      "OfferCreated",
      "OfferTariffChanged",
      "OfferMetadataChanged",
    ]);
    expect(logs[0]?.args).toEqual({
      offerId,
      modelId,
      operator: addr.operator,
      owner: addr.offerOwner,
      payout: addr.payout,
    });
    expect(logs[1]?.args).toEqual({
      offerId,
      version: 1n,
      inputPricePerMTok: 100n,
      outputPricePerMTok: 300n,
      wakeFee: 7n,
    });
    expect(logs[2]?.args).toEqual({ offerId, ...metadata });
    expect((await market("stranger").read.getOffer([offerId])).tariff.version).toBe(1n);

    await expectRevert(
      market("stranger").write.setOfferTariff([offerId, 1n, 2n, 3n]),
      "Unauthorized",
    );
    await mined(market("operator").write.setOfferTariff([offerId, 1n, 2n, 3n]));
    const changed = await mined(market("offerOwner").write.setOfferTariff([offerId, 4n, 5n, 6n]));
    const [event] = parseEventLogs({
      abi: marketAbi,
      logs: changed.logs,
      eventName: "OfferTariffChanged",
    });
    expect(event?.args).toEqual({
      offerId,
      version: 3n,
      inputPricePerMTok: 4n,
      outputPricePerMTok: 5n,
      wakeFee: 6n,
    });
    expect((await market("stranger").read.getOffer([offerId])).tariff).toEqual({
      version: 3n,
      inputPricePerMTok: 4n,
      outputPricePerMTok: 5n,
      wakeFee: 6n,
    });
  });

  it("guards who may change models and offers", async () => {
    await expectRevert(
      market("stranger").write.createModel([modelId, tokenAddress, "r", "v", "t", zeroHash, 0n]),
      "AlreadyExists",
    );
    await expectRevert(market("stranger").write.setModelStatus([modelId, 2]), "Unauthorized");
    await mined(market("creator").write.setModelStatus([modelId, 2]));
    expect((await market("stranger").read.getModel([modelId])).status).toBe(2);

    await expectRevert(
      market("offerOwner").write.createOffer([
        id("offer:orphan"),
        id("model:none"),
        addr.operator,
        addr.payout,
        tariff,
        metadata,
      ]),
      "NotFound",
    );
    // the operator may run the offer but not hand it to someone else
    await mined(market("operator").write.setOfferStatus([offerA, 1]));
    await expectRevert(
      market("operator").write.setOfferOperator([offerA, addr.stranger]),
      "Unauthorized",
    );
    await expectRevert(
      market("operator").write.setOfferPayout([offerA, addr.stranger]),
      "Unauthorized",
    );
    const receipt = await mined(
      market("offerOwner").write.setOfferOperator([offerA, addr.stranger]),
    );
    const [event] = parseEventLogs({
      abi: marketAbi,
      logs: receipt.logs,
      eventName: "OfferOperatorChanged",
    });
    expect(event?.args).toEqual({ offerId: offerA, operator: addr.stranger });
    await expectRevert(
      market("operator").write.setOfferMetadata([offerA, metadata]),
      "Unauthorized",
    );
    await mined(market("stranger").write.setOfferMetadata([offerA, { ...metadata, region: "us" }]));
    expect(await market("stranger").read.getOffer([offerA])).toMatchObject({
      operator: addr.stranger,
      status: 1,
      metadata: { ...metadata, region: "us" },
    });
  });
});

describe("ERC1271Wallet", () => {
  it("accepts its owner's signatures (65-byte and compact) and nothing else", async () => {
    const ownerKey = anvil.accounts[2]?.privateKey;
    const otherKey = anvil.accounts[3]?.privateKey;
    if (!ownerKey || !otherKey) throw new Error("missing anvil accounts");
    const walletAddress = await deployErc1271Wallet(wallets.deployer, pub, {
      owner: addr.creator,
    });
    const contractWallet = getContract({
      address: walletAddress,
      abi: erc1271WalletAbi,
      client: pub,
    });
    const hash = id("message");
    const good = await sign({ hash, privateKey: ownerKey, to: "hex" });
    const compact = serializeCompactSignature(
      signatureToCompactSignature(await sign({ hash, privateKey: ownerKey })),
    );
    const bad = await sign({ hash, privateKey: otherKey, to: "hex" });

    expect(await contractWallet.read.isValidSignature([hash, good])).toBe("0x1626ba7e");
    expect(await contractWallet.read.isValidSignature([hash, compact])).toBe("0x1626ba7e");
    expect(await contractWallet.read.isValidSignature([hash, bad])).toBe("0xffffffff");
    expect(await contractWallet.read.isValidSignature([id("other"), good])).toBe("0xffffffff");
    expect(await contractWallet.read.isValidSignature([hash, "0x1234"])).toBe("0xffffffff");
  });
});
