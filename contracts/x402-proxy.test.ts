import { PERMIT2_ADDRESS, x402UptoPermit2ProxyABI, x402UptoPermit2ProxyAddress } from "@x402/evm";
import {
  getContract,
  hashDomain,
  keccak256,
  parseEventLogs,
  parseSignature,
  stringToHex,
  zeroAddress,
  type Address,
  type Hex,
} from "viem";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { creditTokenAbi, marketAbi, x402UptoPermit2ProxyAbi } from "../gen/contracts/artifacts.js";
import {
  permit2Address,
  permit2DomainSeparator,
  placeX402Contracts,
  x402UptoProxyAddress,
} from "../src/adapters/chain/x402-contracts.js";
import {
  balanceOf,
  clientPayload,
  mined,
  nonceUsed,
  revertOf,
  setUp,
  signUpto,
  tokenName,
  type Fixture,
  type Role,
} from "./x402-fixture.js";

let f: Fixture;
let snapshot: Hex;

beforeAll(async () => {
  f = await setUp();
});
afterAll(async () => {
  await f?.anvil.stop();
});
beforeEach(async () => {
  snapshot = await f.testClient.snapshot();
});
afterEach(async () => {
  await f.testClient.revert({ id: snapshot });
});

function proxy(as: Role) {
  return getContract({
    address: x402UptoProxyAddress,
    abi: x402UptoPermit2ProxyAbi,
    client: f.wallets[as],
  });
}

async function now(): Promise<bigint> {
  return (await f.pub.getBlock()).timestamp;
}

describe("placement on anvil", () => {
  it("puts Permit2 and the upto proxy at their canonical addresses, signing for this chain", async () => {
    expect(permit2Address).toBe("0x000000000022D473030F116dDEE9F6B43aC78BA3");
    expect(x402UptoProxyAddress).toBe("0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002");
    expect(f.placed).toEqual({
      permit2: permit2Address,
      uptoProxy: x402UptoProxyAddress,
      placedPermit2: true,
      placedUptoProxy: true,
    });
    expect((await f.pub.getCode({ address: permit2Address }))?.length).toBe(2 + 9152 * 2);
    expect((await f.pub.getCode({ address: x402UptoProxyAddress }))?.length).toBeGreaterThan(2);
    expect(await f.pub.getChainId()).toBe(31337);

    const separator = await f.pub.readContract({
      address: permit2Address,
      abi: [
        {
          type: "function",
          name: "DOMAIN_SEPARATOR",
          inputs: [],
          outputs: [{ type: "bytes32" }],
          stateMutability: "view",
        },
      ],
      functionName: "DOMAIN_SEPARATOR",
    });
    const expected = hashDomain({
      domain: { name: "Permit2", chainId: 31337n, verifyingContract: PERMIT2_ADDRESS },
      types: {
        EIP712Domain: [
          { name: "name", type: "string" },
          { name: "chainId", type: "uint256" },
          { name: "verifyingContract", type: "address" },
        ],
      },
    });
    expect(separator).toBe(expected);
    expect(permit2DomainSeparator(31337)).toBe(expected);

    const p = proxy("stranger");
    expect(await p.read.PERMIT2()).toBe(PERMIT2_ADDRESS);
    expect(await p.read.WITNESS_TYPE_STRING()).toBe(
      "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)",
    );
    expect(await p.read.WITNESS_TYPEHASH()).toBe(
      keccak256(stringToHex("Witness(address to,address facilitator,uint256 validAfter)")),
    );
    const market = getContract({ address: f.market, abi: marketAbi, client: f.pub });
    expect(await market.read.X402_UPTO_PROXY()).toBe(x402UptoPermit2ProxyAddress);
  });

  it("is idempotent: a second placement deploys nothing", async () => {
    const nonce = await f.pub.getTransactionCount({ address: f.addr.deployer });
    const again = await placeX402Contracts({
      publicClient: f.pub,
      wallet: f.wallets.deployer,
      testClient: f.testClient,
    });
    expect(again).toEqual({
      permit2: permit2Address,
      uptoProxy: x402UptoProxyAddress,
      placedPermit2: false,
      placedUptoProxy: false,
    });
    expect(await f.pub.getTransactionCount({ address: f.addr.deployer })).toBe(nonce);
  });

  it("has exactly the ABI of @x402/evm's x402UptoPermit2ProxyABI (constructor aside)", () => {
    const canonical = (abi: readonly object[]): string[] =>
      abi
        .filter((entry) => (entry as { type: string }).type !== "constructor")
        .map((entry) => JSON.stringify(sortKeys(entry)))
        .sort();
    expect(canonical(x402UptoPermit2ProxyAbi)).toEqual(canonical(x402UptoPermit2ProxyABI));
  });
});

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, sortKeys((value as Record<string, unknown>)[k])]),
  );
}

describe("CreditToken", () => {
  it("is EIP-2612 with the EIP-712 domain {name: the token's name, version 1}", async () => {
    const domain = await f.pub.readContract({
      address: f.token,
      abi: creditTokenAbi,
      functionName: "eip712Domain",
    });
    expect(domain).toEqual(["0x0f", tokenName, "1", 31337n, f.token, `0x${"00".repeat(32)}`, []]);
    expect(
      await f.pub.readContract({
        address: f.token,
        abi: creditTokenAbi,
        functionName: "nonces",
        args: [f.addr.payer2],
      }),
    ).toBe(0n);
  });
});

describe("the upto proxy", () => {
  const amount = 5000n;

  it("settles up to the signed maximum for the facilitator only, once", async () => {
    const { payload } = await clientPayload(f, "payer", {
      amount,
      asset: f.token,
      payTo: f.addr.receiver,
      facilitator: f.addr.stranger,
    });
    const a = payload.permit2Authorization;
    const permit = {
      permitted: { token: a.permitted.token, amount: BigInt(a.permitted.amount) },
      nonce: BigInt(a.nonce),
      deadline: BigInt(a.deadline),
    };
    const witness = { to: a.witness.to, facilitator: a.witness.facilitator, validAfter: 0n };
    const args = [permit, 1234n, f.addr.payer, witness, payload.signature] as const;

    expect(await revertOf(proxy("payer").write.settle(args))).toEqual({
      errorName: "UnauthorizedFacilitator",
      args: undefined,
    });
    expect(
      (
        await revertOf(
          proxy("stranger").write.settle([
            permit,
            amount + 1n,
            f.addr.payer,
            witness,
            payload.signature,
          ]),
        )
      ).errorName,
    ).toBe("AmountExceedsPermitted");
    expect(
      (
        await revertOf(
          proxy("stranger").write.settle([permit, 1234n, zeroAddress, witness, payload.signature]),
        )
      ).errorName,
    ).toBe("InvalidOwner");

    const receipt = await mined(f.pub, proxy("stranger").write.settle(args));
    expect(
      parseEventLogs({ abi: x402UptoPermit2ProxyAbi, logs: receipt.logs }).map((l) => l.eventName),
    ).toEqual(["Settled"]);
    expect(await balanceOf(f, f.addr.payer)).toBe(1_000_000n - 1234n);
    expect(await balanceOf(f, f.addr.receiver)).toBe(1234n);
    expect(await nonceUsed(f, f.addr.payer, permit.nonce)).toBe(true);

    expect(await revertOf(proxy("stranger").write.settle(args))).toEqual({
      errorName: "InvalidNonce",
      args: undefined,
    });
  });

  it("refuses a payment before validAfter and one to the zero address", async () => {
    const t = await now();
    const early = await signUpto(f, "payer", {
      amount,
      nonce: 7n,
      deadline: t + 600n,
      to: f.addr.receiver,
      facilitator: f.addr.stranger,
      validAfter: t + 300n,
    });
    expect(
      (
        await revertOf(
          proxy("stranger").write.settle([
            early.permit,
            1n,
            f.addr.payer,
            early.witness,
            early.signature,
          ]),
        )
      ).errorName,
    ).toBe("PaymentTooEarly");
    const nowhere = await signUpto(f, "payer", {
      amount,
      nonce: 8n,
      deadline: t + 600n,
      to: zeroAddress,
      facilitator: f.addr.stranger,
      validAfter: 0n,
    });
    expect(
      (
        await revertOf(
          proxy("stranger").write.settle([
            nowhere.permit,
            1n,
            f.addr.payer,
            nowhere.witness,
            nowhere.signature,
          ]),
        )
      ).errorName,
    ).toBe("InvalidDestination");

    await f.testClient.increaseTime({ seconds: 400 });
    await f.testClient.mine({ blocks: 1 });
    await mined(
      f.pub,
      proxy("stranger").write.settle([
        early.permit,
        99n,
        f.addr.payer,
        early.witness,
        early.signature,
      ]),
    );
    expect(await balanceOf(f, f.addr.receiver)).toBe(99n);
  });

  it("settleWithPermit: a first payment without any approval transaction (EIP-2612)", async () => {
    const req = { amount, asset: f.token, payTo: f.addr.receiver, facilitator: f.addr.stranger };
    const { payload, extensions } = await clientPayload(f, "payer2", req, { eip2612: true });
    const info = (extensions?.eip2612GasSponsoring as { info: Record<string, string> }).info;
    expect(info).toMatchObject({
      from: f.addr.payer2,
      asset: f.token,
      spender: PERMIT2_ADDRESS,
      amount: "5000",
      nonce: "0",
      version: "1",
    });
    const sig = parseSignature(info.signature as Hex);
    const permit2612 = {
      value: BigInt(info.amount!),
      deadline: BigInt(info.deadline!),
      r: sig.r,
      s: sig.s,
      v: Number(sig.v),
    };
    const a = payload.permit2Authorization;
    const permit = {
      permitted: { token: f.token, amount },
      nonce: BigInt(a.nonce),
      deadline: BigInt(a.deadline),
    };
    const witness = { to: f.addr.receiver, facilitator: f.addr.stranger, validAfter: 0n };

    expect(
      (
        await revertOf(
          proxy("stranger").write.settleWithPermit([
            { ...permit2612, value: amount - 1n },
            permit,
            3000n,
            f.addr.payer2,
            witness,
            payload.signature,
          ]),
        )
      ).errorName,
    ).toBe("Permit2612AmountMismatch");

    const receipt = await mined(
      f.pub,
      proxy("stranger").write.settleWithPermit([
        permit2612,
        permit,
        3000n,
        f.addr.payer2,
        witness,
        payload.signature,
      ]),
    );
    expect(
      parseEventLogs({ abi: x402UptoPermit2ProxyAbi, logs: receipt.logs }).map((l) => l.eventName),
    ).toEqual(["SettledWithPermit"]);
    expect(await balanceOf(f, f.addr.payer2)).toBe(1_000_000n - 3000n);
    expect(await balanceOf(f, f.addr.receiver)).toBe(3000n);
    const allowance = (owner: Address) =>
      f.pub.readContract({
        address: f.token,
        abi: creditTokenAbi,
        functionName: "allowance",
        args: [owner, PERMIT2_ADDRESS],
      });
    expect(await allowance(f.addr.payer2)).toBe(2000n);
    expect(
      await f.pub.readContract({
        address: f.token,
        abi: creditTokenAbi,
        functionName: "nonces",
        args: [f.addr.payer2],
      }),
    ).toBe(1n);

    // The same EIP-2612 signature again (already used): tolerated, the payment stands on the
    // allowance left.
    const second = await clientPayload(f, "payer2", { ...req, amount: 2000n });
    const a2 = second.payload.permit2Authorization;
    await mined(
      f.pub,
      proxy("stranger").write.settleWithPermit([
        { ...permit2612, value: 2000n },
        {
          permitted: { token: f.token, amount: 2000n },
          nonce: BigInt(a2.nonce),
          deadline: BigInt(a2.deadline),
        },
        2000n,
        f.addr.payer2,
        witness,
        second.payload.signature,
      ]),
    );
    expect(await balanceOf(f, f.addr.receiver)).toBe(5000n);
    expect(await allowance(f.addr.payer2)).toBe(0n);
  });
});
