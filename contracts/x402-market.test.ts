import {
  getContract,
  maxUint256,
  maxUint64,
  parseEventLogs,
  parseSignature,
  zeroHash,
  type Address,
  type Hex,
} from "viem";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  creditTokenAbi,
  marketAbi,
  permit2Abi,
  x402UptoPermit2ProxyAbi,
} from "../gen/contracts/artifacts.js";
import {
  permit2Address,
  x402PaymentFromPayload,
  x402PermitId,
  type X402Payment,
} from "../src/adapters/chain/x402-contracts.js";
import {
  balanceOf,
  balances,
  clientPayload,
  id,
  mined,
  modelId,
  nonceUsed,
  offerA,
  offerOther,
  reasonOf,
  revertOf,
  setUp,
  signUpto,
  type Fixture,
  type Role,
} from "./x402-fixture.js";

let f: Fixture;
let snapshot: Hex;
const permitId = id("permit:classic");

beforeAll(async () => {
  f = await setUp();
  // The payer also holds a classic permit (deposit 1000) for the batch's permit charge.
  await mined(
    f.pub,
    f.wallets.payer.writeContract({
      address: f.token,
      abi: creditTokenAbi,
      functionName: "approve",
      args: [f.market, 1000n],
    }),
  );
  const expiresAt = (await f.pub.getBlock()).timestamp + 86_400n;
  await mined(
    f.pub,
    market("payer").write.openPermit([permitId, modelId, zeroHash, 1000n, expiresAt]),
  );
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

function market(as: Role) {
  return getContract({ address: f.market, abi: marketAbi, client: f.wallets[as] });
}

/** A payment the upto client signs to the market for `max`, charged `amount` on `offerId`. */
async function payment(
  payer: Role,
  max: bigint,
  amount: bigint,
  opts: {
    offerId?: Hex;
    asset?: Address;
    payTo?: Address;
    facilitator?: Address;
    timeout?: number;
  } = {},
): Promise<X402Payment> {
  const { payload } = await clientPayload(f, payer, {
    amount: max,
    asset: opts.asset ?? f.token,
    payTo: opts.payTo ?? f.market,
    facilitator: opts.facilitator ?? f.market,
    maxTimeoutSeconds: opts.timeout,
  });
  return x402PaymentFromPayload(payload, { offerId: opts.offerId ?? offerA, amount });
}

function settleWithPayments(
  batchId: Hex,
  charges: { permitId: Hex; offerId: Hex; amount: bigint }[],
  payments: X402Payment[],
  as: Role = "settler",
) {
  return market(as).write.settleWithPayments([batchId, charges, payments]);
}

/** A payer's EIP-2612 approval of Permit2 as the Market takes it, from the client's extension. */
function approvalOf(extensions: Record<string, unknown> | undefined) {
  const info = (extensions?.eip2612GasSponsoring as { info: Record<string, string> }).info;
  const sig = parseSignature(info.signature as Hex);
  return {
    value: BigInt(info.amount!),
    deadline: BigInt(info.deadline!),
    v: Number(sig.v ?? BigInt(27 + sig.yParity)),
    r: sig.r,
    s: sig.s,
  };
}

const noApproval: { value: bigint; deadline: bigint; v: number; r: Hex; s: Hex } = {
  value: 0n,
  deadline: 0n,
  v: 0,
  r: zeroHash,
  s: zeroHash,
};

/** Asserts the batch reverts with PaymentFailed(permitId, reason) and decodes the reason. */
async function paymentFailure(call: Promise<unknown>, p: X402Payment) {
  const { errorName, args } = await revertOf(call);
  expect(errorName).toBe("PaymentFailed");
  expect(args?.[0]).toBe(p.permitId);
  return reasonOf(args?.[1] as Hex);
}

describe("settleWithPayments", () => {
  it("settles a permit charge and two x402 payments in one batch", async () => {
    const first = await payment("payer", 5000n, 1200n);
    const second = await payment("payer", 3000n, 3000n);
    expect(first.permitId).toBe(x402PermitId(f.addr.payer, first.permit.nonce));
    expect(await balances(f, f.addr.payer, f.addr.payout, f.market)).toEqual([999_000n, 0n, 1000n]);

    const batchId = id("batch:1");
    const receipt = await mined(
      f.pub,
      settleWithPayments(batchId, [{ permitId, offerId: offerA, amount: 250n }], [first, second]),
    );
    // Only what was charged moves: 1200 of the 5000 signed, all 3000 of the second.
    expect(await balances(f, f.addr.payer, f.addr.payout, f.market)).toEqual([
      999_000n - 1200n - 3000n,
      250n + 1200n + 3000n,
      1000n - 250n,
    ]);
    expect(await nonceUsed(f, f.addr.payer, first.permit.nonce)).toBe(true);
    expect(await nonceUsed(f, f.addr.payer, second.permit.nonce)).toBe(true);

    const events = parseEventLogs({ abi: marketAbi, logs: receipt.logs }).map((l) => [
      l.eventName,
      l.args,
    ]);
    expect(events).toEqual([
      ["ChargeSettled", { batchId, permitId, offerId: offerA, amount: 250n }],
      [
        "X402PaymentSettled",
        {
          batchId,
          permitId: first.permitId,
          payer: f.addr.payer,
          offerId: offerA,
          amount: 1200n,
          nonce: first.permit.nonce,
        },
      ],
      ["ChargeSettled", { batchId, permitId: first.permitId, offerId: offerA, amount: 1200n }],
      [
        "X402PaymentSettled",
        {
          batchId,
          permitId: second.permitId,
          payer: f.addr.payer,
          offerId: offerA,
          amount: 3000n,
          nonce: second.permit.nonce,
        },
      ],
      ["ChargeSettled", { batchId, permitId: second.permitId, offerId: offerA, amount: 3000n }],
      ["BatchSettled", { batchId, charges: 3n, total: 4450n }],
    ]);
    expect(
      parseEventLogs({ abi: x402UptoPermit2ProxyAbi, logs: receipt.logs }).map((l) => l.eventName),
    ).toEqual(["Settled", "Settled"]);

    const m = market("stranger");
    expect(await m.read.getX402Payment([first.permitId])).toEqual({
      payer: f.addr.payer,
      modelId,
      offerId: offerA,
      deposit: 1200n,
      settled: 1200n,
      expiresAt: first.permit.deadline,
      state: 3,
      closableAt: 0n,
    });
    // The x402 id space is the market's own: no classic permit of that id exists.
    expect((await m.read.getPermit([first.permitId])).state).toBe(0);
    expect((await m.read.getPermit([permitId])).settled).toBe(250n);
    expect(await m.read.isBatchSettled([batchId])).toBe(true);
  });

  it("settles payments without permit charges, once per batch id and once per payment", async () => {
    const p = await payment("payer", 5000n, 700n);
    await mined(f.pub, settleWithPayments(id("batch:1"), [], [p]));
    expect(await balances(f, f.addr.payer, f.addr.payout)).toEqual([999_000n - 700n, 700n]);

    expect(await revertOf(settleWithPayments(id("batch:1"), [], [p]))).toEqual({
      errorName: "BatchAlreadySettled",
      args: [id("batch:1")],
    });
    // One batch-id space for both entry points.
    expect(
      await revertOf(
        market("settler").write.settle([
          id("batch:1"),
          [{ permitId, offerId: offerA, amount: 1n }],
        ]),
      ),
    ).toEqual({ errorName: "BatchAlreadySettled", args: [id("batch:1")] });
    // The same payment again in a new batch: its record exists.
    expect((await revertOf(settleWithPayments(id("batch:2"), [], [p]))).errorName).toBe(
      "AlreadyExists",
    );
    expect(await balances(f, f.addr.payer, f.addr.payout)).toEqual([999_000n - 700n, 700n]);
  });

  it("names the payment whose Permit2 nonce was spent elsewhere: PaymentFailed(permitId, InvalidNonce)", async () => {
    const p = await payment("payer", 5000n, 700n);
    // The payer cancels the nonce at Permit2 between the gateway's verification and settlement.
    const nonce = p.permit.nonce;
    await mined(
      f.pub,
      f.wallets.payer.writeContract({
        address: permit2Address,
        abi: permit2Abi,
        functionName: "invalidateUnorderedNonces",
        args: [nonce >> 8n, 1n << (nonce & 0xffn)],
      }),
    );
    const call = settleWithPayments(
      id("batch:1"),
      [{ permitId, offerId: offerA, amount: 1n }],
      [p],
    );
    expect(await paymentFailure(call, p)).toEqual({ errorName: "InvalidNonce", args: undefined });
    // The whole batch reverted, its permit charge with it.
    expect(await balances(f, f.addr.payer, f.addr.payout, f.market)).toEqual([999_000n, 0n, 1000n]);
    expect(await market("stranger").read.isBatchSettled([id("batch:1")])).toBe(false);
  });

  it("refuses a payment made out to someone else, or settled by someone else", async () => {
    const toOther = await payment("payer", 5000n, 700n, { payTo: f.addr.receiver });
    expect(await paymentFailure(settleWithPayments(id("b"), [], [toOther]), toOther)).toEqual({
      errorName: "WrongPaymentWitness",
      args: [f.addr.receiver, f.market],
    });
    const otherFacilitator = await payment("payer", 5000n, 700n, { facilitator: f.addr.stranger });
    expect(
      await paymentFailure(settleWithPayments(id("b"), [], [otherFacilitator]), otherFacilitator),
    ).toEqual({
      errorName: "WrongPaymentWitness",
      args: [f.market, f.addr.stranger],
    });
  });

  it("refuses a payment in another token than the offer's model's", async () => {
    const p = await payment("payer", 5000n, 700n, { asset: f.otherToken });
    expect(await paymentFailure(settleWithPayments(id("b"), [], [p]), p)).toEqual({
      errorName: "WrongPaymentToken",
      args: [f.token, f.otherToken],
    });
    // ... and settles it against an offer of the model that token pays for.
    await mined(f.pub, settleWithPayments(id("b"), [], [{ ...p, offerId: offerOther }]));
    expect(await balanceOf(f, f.addr.payout, f.otherToken)).toBe(700n);
    expect((await market("stranger").read.getX402Payment([p.permitId])).modelId).not.toBe(modelId);
  });

  it("refuses more than the signed maximum, an expired permit, a tampered one", async () => {
    const over = await payment("payer", 5000n, 5001n);
    expect(await paymentFailure(settleWithPayments(id("b"), [], [over]), over)).toEqual({
      errorName: "AmountExceedsPermitted",
      args: undefined,
    });

    const expiring = await payment("payer", 5000n, 700n, { timeout: 60 });
    await f.testClient.increaseTime({ seconds: 120 });
    await f.testClient.mine({ blocks: 1 });
    expect(await paymentFailure(settleWithPayments(id("b"), [], [expiring]), expiring)).toEqual({
      errorName: "SignatureExpired",
      args: [expiring.permit.deadline],
    });

    const fresh = await payment("payer", 5000n, 700n);
    const raised = {
      ...fresh,
      amount: 6000n,
      permit: { ...fresh.permit, permitted: { ...fresh.permit.permitted, amount: 6000n } },
    };
    expect(await paymentFailure(settleWithPayments(id("b"), [], [raised]), raised)).toEqual({
      errorName: "InvalidSigner",
      args: undefined,
    });
  });

  it("refuses a payer without Permit2 allowance or without balance", async () => {
    const noAllowance = await payment("payer2", 5000n, 700n);
    expect(
      await paymentFailure(settleWithPayments(id("b"), [], [noAllowance]), noAllowance),
    ).toEqual({
      errorName: "Error",
      args: ["TRANSFER_FROM_FAILED"],
    });
    const noBalance = await payment("broke", 5000n, 700n);
    const reason = await paymentFailure(settleWithPayments(id("b"), [], [noBalance]), noBalance);
    expect(reason).toEqual({ errorName: "Error", args: ["TRANSFER_FROM_FAILED"] });
  });

  it("checks the caller, the batch, the permit id, the offer and the amount", async () => {
    const p = await payment("payer", 5000n, 700n);
    expect(await revertOf(settleWithPayments(id("b"), [], [p], "stranger"))).toEqual({
      errorName: "NotSettlementOperator",
      args: undefined,
    });
    expect((await revertOf(settleWithPayments(id("b"), [], []))).errorName).toBe("InvalidArgument");
    expect((await revertOf(settleWithPayments(zeroHash, [], [p]))).errorName).toBe(
      "InvalidArgument",
    );
    const badId = { ...p, permitId: x402PermitId(f.addr.payer, p.permit.nonce + 1n) };
    expect((await revertOf(settleWithPayments(id("b"), [], [badId]))).errorName).toBe(
      "InvalidArgument",
    );
    expect(
      (await revertOf(settleWithPayments(id("b"), [], [{ ...p, amount: 0n }]))).errorName,
    ).toBe("InvalidArgument");
    expect(
      (await revertOf(settleWithPayments(id("b"), [], [{ ...p, offerId: id("nope") }]))).errorName,
    ).toBe("NotFound");
    expect(await balances(f, f.addr.payer, f.addr.payout)).toEqual([999_000n, 0n]);
  });

  it("settles a payer without Permit2 allowance through its EIP-2612 approval, in the batch", async () => {
    const signed = await clientPayload(
      f,
      "payer2",
      { amount: 5000n, asset: f.token, payTo: f.market, facilitator: f.market },
      { eip2612: true },
    );
    const p = x402PaymentFromPayload(signed.payload, { offerId: offerA, amount: 700n });
    const approval = approvalOf(signed.extensions);
    // Without the approval: no allowance.
    expect(await paymentFailure(settleWithPayments(id("b"), [], [p]), p)).toEqual({
      errorName: "Error",
      args: ["TRANSFER_FROM_FAILED"],
    });
    const withApprovals = (payments: X402Payment[], approvals: (typeof noApproval)[]) =>
      market("settler").write.settleWithPaymentsAndApprovals([id("b"), [], payments, approvals]);
    // One approval per payment, or none: the arrays must match.
    expect((await revertOf(withApprovals([p], []))).errorName).toBe("InvalidArgument");
    // Only the operator, as for any batch.
    expect(
      (
        await revertOf(
          market("stranger").write.settleWithPaymentsAndApprovals([id("b"), [], [p], [approval]]),
        )
      ).errorName,
    ).toBe("NotSettlementOperator");
    // A tampered approval is ignored by the token: the payment fails as without it.
    expect(
      await paymentFailure(withApprovals([p], [{ ...approval, value: approval.value + 1n }]), p),
    ).toEqual({ errorName: "Error", args: ["TRANSFER_FROM_FAILED"] });

    await mined(f.pub, withApprovals([p], [approval]));
    expect(await balances(f, f.addr.payer2, f.addr.payout)).toEqual([1_000_000n - 700n, 700n]);
    const allowance = await f.pub.readContract({
      address: f.token,
      abi: creditTokenAbi,
      functionName: "allowance",
      args: [f.addr.payer2, permit2Address],
    });
    expect(allowance).toBe(5000n - 700n);

    // The same approval again (its EIP-2612 nonce spent): the token refuses it, the batch goes
    // on with the allowance given; where that allowance is short, only the payment fails.
    const next = await clientPayload(f, "payer2", {
      amount: 4000n,
      asset: f.token,
      payTo: f.market,
      facilitator: f.market,
    });
    const q = x402PaymentFromPayload(next.payload, { offerId: offerA, amount: 300n });
    await mined(
      f.pub,
      market("settler").write.settleWithPaymentsAndApprovals([id("b2"), [], [q], [approval]]),
    );
    expect(await balanceOf(f, f.addr.payer2)).toBe(1_000_000n - 1000n);
    const last = await clientPayload(f, "payer2", {
      amount: 5000n,
      asset: f.token,
      payTo: f.market,
      facilitator: f.market,
    });
    const r = x402PaymentFromPayload(last.payload, { offerId: offerA, amount: 4500n });
    expect(
      await paymentFailure(
        market("settler").write.settleWithPaymentsAndApprovals([id("b3"), [], [r], [approval]]),
        r,
      ),
    ).toEqual({ errorName: "Error", args: ["TRANSFER_FROM_FAILED"] });
    // No approval for a payment (deadline 0) leaves it as settleWithPayments would.
    const s2 = x402PaymentFromPayload(last.payload, { offerId: offerA, amount: 3700n });
    await mined(
      f.pub,
      market("settler").write.settleWithPaymentsAndApprovals([id("b4"), [], [s2], [noApproval]]),
    );
    expect(await balanceOf(f, f.addr.payer2)).toBe(1_000_000n - 4700n);
  });

  it("records a deadline beyond uint64 as the largest uint64; its id is the contract's", async () => {
    expect(await market("stranger").read.x402PermitId([f.addr.payer, 42n])).toBe(
      x402PermitId(f.addr.payer, 42n),
    );
    const signed = await signUpto(f, "payer", {
      amount: 5000n,
      nonce: 42n,
      deadline: maxUint256,
      to: f.market,
      facilitator: f.market,
      validAfter: 0n,
    });
    const p: X402Payment = {
      permitId: x402PermitId(f.addr.payer, 42n),
      offerId: offerA,
      amount: 5000n,
      owner: f.addr.payer,
      ...signed,
    };
    await mined(f.pub, settleWithPayments(id("b"), [], [p]));
    expect((await market("stranger").read.getX402Payment([p.permitId])).expiresAt).toBe(maxUint64);
    expect(await balances(f, f.addr.payer, f.addr.payout)).toEqual([999_000n - 5000n, 5000n]);
  });
});
