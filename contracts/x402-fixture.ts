/**
 * The chain the x402 contract tests share: anvil with Permit2 and the upto proxy placed, a
 * market with one model (credit token "Llama Credits") and one offer, a second model on another
 * token, and payers. Payloads are made by `@x402/evm`'s own upto client.
 */
import { UptoEvmScheme } from "@x402/evm/upto/client";
import {
  PERMIT2_ADDRESS,
  toClientEvmSigner,
  uptoPermit2WitnessTypes,
  x402UptoPermit2ProxyAddress,
  type UptoPermit2Payload,
} from "@x402/evm";
import {
  BaseError,
  ContractFunctionRevertedError,
  createPublicClient,
  createTestClient,
  createWalletClient,
  decodeAbiParameters,
  decodeErrorResult,
  getAddress,
  defineChain,
  getContract,
  http,
  keccak256,
  maxUint256,
  stringToHex,
  type Address,
  type Hash,
  type Hex,
  type PublicClient,
  type TestClient,
} from "viem";
import { privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { expect } from "vitest";
import { startAnvil, type AnvilInstance } from "../src/adapters/chain/anvil.js";
import {
  deployCreditToken,
  deployMarket,
  type DeployerWallet,
} from "../src/adapters/chain/deploy.js";
import {
  permit2Address,
  placeX402Contracts,
  type PlacedX402Contracts,
} from "../src/adapters/chain/x402-contracts.js";
import {
  creditTokenAbi,
  marketAbi,
  permit2Abi,
  x402UptoPermit2ProxyAbi,
} from "../gen/contracts/artifacts.js";

export const id = (label: string): Hex => keccak256(stringToHex(label));

export const modelId = id("model:llama");
export const otherModelId = id("model:mistral");
export const offerA = id("offer:a");
export const offerOther = id("offer:other");
export const tokenName = "Llama Credits";

export const roles = [
  "deployer",
  "settler",
  "creator",
  "offerOwner",
  "payout",
  "payer",
  "payer2",
  "stranger",
  "receiver",
  "broke",
] as const;
export type Role = (typeof roles)[number];

export interface Fixture {
  anvil: AnvilInstance;
  pub: PublicClient;
  testClient: TestClient<"anvil">;
  wallets: Record<Role, DeployerWallet>;
  accounts: Record<Role, PrivateKeyAccount>;
  addr: Record<Role, Address>;
  market: Address;
  token: Address;
  otherToken: Address;
  placed: PlacedX402Contracts;
}

/** Waits for a transaction and insists it succeeded. */
export async function mined(pub: PublicClient, hash: Promise<Hash>) {
  const receipt = await pub.waitForTransactionReceipt({ hash: await hash });
  expect(receipt.status).toBe("success");
  return receipt;
}

/** Every error the x402 path can revert with: Market's, the proxy's and Permit2's. */
export const errorsAbi = [...marketAbi, ...x402UptoPermit2ProxyAbi, ...permit2Abi].filter(
  (entry) => entry.type === "error",
);

/**
 * The custom error a call reverted with, decoded against Market, proxy and Permit2 errors
 * (fails the test when it did not revert).
 */
export async function revertOf(
  call: Promise<unknown>,
): Promise<{ errorName?: string; args?: readonly unknown[] }> {
  const err = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err, "expected a revert").toBeInstanceOf(BaseError);
  const reverted = (err as BaseError).walk((e) => e instanceof ContractFunctionRevertedError);
  expect(reverted, String(err)).toBeInstanceOf(ContractFunctionRevertedError);
  const { data, raw } = reverted as ContractFunctionRevertedError;
  if (data?.errorName !== undefined) return { errorName: data.errorName, args: data.args };
  expect(raw, String(err)).toBeDefined();
  const decoded = decodeErrorResult({ abi: errorsAbi, data: raw! });
  return { errorName: decoded.errorName, args: decoded.args };
}

/** Decodes a `PaymentFailed` reason. */
export function reasonOf(reason: Hex): { errorName: string; args?: readonly unknown[] } {
  if (reason.startsWith("0x08c379a0")) {
    const [message] = decodeAbiParameters([{ type: "string" }], `0x${reason.slice(10)}`);
    return { errorName: "Error", args: [message] };
  }
  const decoded = decodeErrorResult({ abi: errorsAbi, data: reason });
  return { errorName: decoded.errorName, args: decoded.args };
}

export async function setUp(): Promise<Fixture> {
  const anvil = await startAnvil();
  const chain = defineChain({
    id: anvil.chainId,
    name: "anvil",
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [anvil.rpcUrl] } },
  });
  const transport = http(anvil.rpcUrl);
  const pub = createPublicClient({ chain, transport }) as PublicClient;
  const testClient = createTestClient({ chain, transport, mode: "anvil" });
  const wallets = {} as Record<Role, DeployerWallet>;
  const accounts = {} as Record<Role, PrivateKeyAccount>;
  const addr = {} as Record<Role, Address>;
  roles.forEach((role, i) => {
    const key = anvil.accounts[i]?.privateKey;
    if (!key) throw new Error(`no anvil account ${i}`);
    accounts[role] = privateKeyToAccount(key);
    wallets[role] = createWalletClient({ account: accounts[role], chain, transport });
    addr[role] = accounts[role].address;
  });
  const placed = await placeX402Contracts({
    publicClient: pub,
    wallet: wallets.deployer,
    testClient,
  });

  const market = getAddress(
    await deployMarket(wallets.deployer, pub, {
      settlementOperator: addr.settler,
      closeGracePeriod: 3600n,
    }),
  );
  const token = getAddress(
    await deployCreditToken(wallets.creator, pub, {
      name: tokenName,
      symbol: "LLC",
      owner: addr.creator,
    }),
  );
  const otherToken = getAddress(
    await deployCreditToken(wallets.creator, pub, {
      name: "Mistral Credits",
      symbol: "MIC",
      owner: addr.creator,
    }),
  );
  const m = getContract({ address: market, abi: marketAbi, client: wallets.creator });
  await mined(
    pub,
    m.write.createModel([modelId, token, "meta/llama", "main", "chat", id("pool"), 7n]),
  );
  await mined(
    pub,
    m.write.createModel([otherModelId, otherToken, "mistral", "v1", "chat", id("p2"), 8n]),
  );
  const metadata = { region: "eu-west", hardware: "1xH100", maxConcurrency: 8, capabilities: "{}" };
  const tariff = { version: 1n, inputPricePerMTok: 100n, outputPricePerMTok: 300n, wakeFee: 7n };
  const o = getContract({ address: market, abi: marketAbi, client: wallets.offerOwner });
  await mined(
    pub,
    o.write.createOffer([offerA, modelId, addr.offerOwner, addr.payout, tariff, metadata]),
  );
  await mined(
    pub,
    o.write.createOffer([offerOther, otherModelId, addr.offerOwner, addr.payout, tariff, metadata]),
  );

  for (const payer of ["payer", "payer2"] as const) {
    for (const t of [token, otherToken]) {
      await mined(
        pub,
        wallets.creator.writeContract({
          address: t,
          abi: creditTokenAbi,
          functionName: "mint",
          args: [addr[payer], 1_000_000n],
        }),
      );
    }
  }
  // payer approves Permit2 (the client's own approval); payer2 has no approval at all; broke
  // approves but holds nothing.
  for (const who of ["payer", "broke"] as const) {
    for (const t of [token, otherToken]) {
      await mined(
        pub,
        wallets[who].writeContract({
          address: t,
          abi: creditTokenAbi,
          functionName: "approve",
          args: [permit2Address, maxUint256],
        }),
      );
    }
  }
  return { anvil, pub, testClient, wallets, accounts, addr, market, token, otherToken, placed };
}

export interface UptoRequirements {
  amount: bigint;
  asset: Address;
  payTo: Address;
  facilitator: Address;
  maxTimeoutSeconds?: number;
}

/** What `@x402/evm`'s upto client signs for these requirements (optionally with EIP-2612). */
export async function clientPayload(
  f: Fixture,
  payer: Role,
  req: UptoRequirements,
  opts: { eip2612?: boolean } = {},
): Promise<{ payload: UptoPermit2Payload; extensions?: Record<string, unknown> }> {
  const signer = toClientEvmSigner(f.accounts[payer], f.pub);
  const scheme = new UptoEvmScheme(signer);
  const result = await scheme.createPaymentPayload(
    2,
    {
      scheme: "upto",
      network: `eip155:${f.anvil.chainId}`,
      asset: req.asset,
      amount: req.amount.toString(),
      payTo: req.payTo,
      maxTimeoutSeconds: req.maxTimeoutSeconds ?? 300,
      extra: { name: tokenName, version: "1", facilitatorAddress: req.facilitator },
    },
    opts.eip2612 ? { extensions: { eip2612GasSponsoring: {} } } : undefined,
  );
  return { payload: result.payload as UptoPermit2Payload, extensions: result.extensions };
}

export async function balanceOf(f: Fixture, who: Address, token = f.token): Promise<bigint> {
  return f.pub.readContract({
    address: token,
    abi: creditTokenAbi,
    functionName: "balanceOf",
    args: [who],
  });
}

export async function balances(f: Fixture, ...who: Address[]): Promise<bigint[]> {
  return Promise.all(who.map((w) => balanceOf(f, w)));
}

/** Whether Permit2 has consumed `owner`'s unordered `nonce`. */
export async function nonceUsed(f: Fixture, owner: Address, nonce: bigint): Promise<boolean> {
  const bitmap = await f.pub.readContract({
    address: permit2Address,
    abi: permit2Abi,
    functionName: "nonceBitmap",
    args: [owner, nonce >> 8n],
  });
  return ((bitmap >> (nonce & 0xffn)) & 1n) === 1n;
}

/** A permit as the upto client signs it, signed by hand (for fields the client always fixes). */
export async function signUpto(
  f: Fixture,
  payer: Role,
  p: {
    amount: bigint;
    nonce: bigint;
    deadline: bigint;
    to: Address;
    facilitator: Address;
    validAfter: bigint;
  },
) {
  const permit = {
    permitted: { token: f.token, amount: p.amount },
    nonce: p.nonce,
    deadline: p.deadline,
  };
  const witness = { to: p.to, facilitator: p.facilitator, validAfter: p.validAfter };
  const signature = await f.accounts[payer].signTypedData({
    domain: { name: "Permit2", chainId: f.anvil.chainId, verifyingContract: PERMIT2_ADDRESS },
    types: uptoPermit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message: { ...permit, spender: x402UptoPermit2ProxyAddress, witness },
  });
  return { permit, witness, signature };
}
