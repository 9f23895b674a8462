import { getAddress, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { createReceiptSigner } from "../adapters/crypto/receipt-signer.js";
import {
  buildUsageReceipt,
  signableReceipt,
  usageReceiptFieldsV3,
  type ReceiptRecord,
} from "../domain/receipts.js";
import { eip712DomainFields } from "../domain/registration/index.js";
import { judgeReceipts, reportJson, verdict, type ListedReceipt } from "./permit-audit.js";

const market = getAddress(`0x${"5f".repeat(20)}`);
const chainId = 31337;
const permitId: Hex = `0x${"aa".repeat(32)}`;

const lie = {
  inputTokens: 3_550n,
  outputTokens: 2_000n,
  cachedInputTokens: 0n,
  reasoningTokens: 0n,
};
const count = { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n };

function record(n: number, charge: bigint, figures: Partial<ReceiptRecord> = {}): ReceiptRecord {
  return {
    id: `0x${n.toString(16).padStart(64, "0")}`,
    permitId,
    offerId: `0x${"bb".repeat(32)}`,
    modelId: `0x${"cc".repeat(32)}`,
    tariffVersion: 1n,
    inputTokens: 10n,
    outputTokens: 5n,
    cachedInputTokens: 0n,
    reasoningTokens: 0n,
    creditsCharged: charge,
    billing: "billed",
    status: "completed",
    completedAt: 1_700_000_000 + n,
    usageSource: "provider",
    claimed: { inputTokens: 10n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n },
    counted: { inputTokens: 10n, outputTokens: 6n, cachedInputTokens: 0n, reasoningTokens: 0n },
    ...figures,
  };
}

const signer = createReceiptSigner(generatePrivateKey());
const impostor = createReceiptSigner(generatePrivateKey());

async function listed(
  n: number,
  charge: bigint,
  status = "settled",
  by = signer,
  figures: Partial<ReceiptRecord> = {},
): Promise<ListedReceipt> {
  const signed = await by.sign(buildUsageReceipt(record(n, charge, figures), { chainId, market }));
  return {
    receipt: signed.receipt,
    signature: signed.signature,
    signer: signed.signer,
    settlement: { status, batch_id: `0x${"dd".repeat(32)}` },
  };
}

const judge = (receipts: ListedReceipt[], chainSettled: bigint) =>
  judgeReceipts({ permitId, chainId, market, signer: signer.address, receipts, chainSettled });

describe("permit audit's judgement", () => {
  it("passes when the settled receipts add up to the chain's settled amount (unsettled ones aside)", async () => {
    const report = await judge(
      [await listed(1, 100n), await listed(2, 250n), await listed(3, 7n, "unsettled")],
      350n,
    );
    expect(report).toMatchObject({
      receipts: 3,
      settledReceipts: 2,
      settledCharges: 350n,
      difference: 0n,
      invalid: [],
      ok: true,
    });
  });

  it("fails on a difference either way, naming it", async () => {
    const receipts = [await listed(1, 100n)];
    const more = await judge(receipts, 101n);
    expect(more.ok).toBe(false);
    expect(verdict(more)[0]).toBe(
      `permit ${permitId}: audit FAILED: settled receipts sum to 100, the chain settled 101: difference 1 (the chain settled 1 more than the receipts)`,
    );
    const less = await judge(receipts, 40n);
    expect(verdict(less)[0]).toContain("the receipts claim 60 more than the chain settled");
  });

  it("names every receipt that proves nothing, and leaves its charge out", async () => {
    const good = await listed(1, 100n);
    const tampered = await listed(2, 50n);
    tampered.receipt.message.charge = "49";
    const foreign = await listed(3, 30n, "settled", impostor);
    const signedElsewhere = await listed(4, 20n);
    const otherChain = {
      ...signedElsewhere,
      receipt: {
        ...signedElsewhere.receipt,
        domain: { ...signedElsewhere.receipt.domain, chainId: 1 },
      },
    };
    const report = await judge([good, tampered, foreign, otherChain, good], 100n);
    expect(report.settledCharges).toBe(100n);
    expect(report.difference).toBe(0n);
    expect(report.ok).toBe(false);
    expect(report.invalid).toEqual([
      {
        requestId: tampered.receipt.message.requestId,
        reason: `signature does not verify against the receipt signer ${signer.address}`,
      },
      {
        requestId: foreign.receipt.message.requestId,
        reason: `signature does not verify against the receipt signer ${signer.address}`,
      },
      {
        requestId: otherChain.receipt.message.requestId,
        reason: `signed for another domain (chain 1, market ${market})`,
      },
      { requestId: good.receipt.message.requestId, reason: "listed twice" },
    ]);
    expect(verdict(report)).toContain(
      `receipt ${tampered.receipt.message.requestId}: signature does not verify against the receipt signer ${signer.address}`,
    );
  });

  it("shows, per receipt, the usage charged, whose figures it was, the provider's claim and the gateway's count", async () => {
    const liar = await listed(1, 60n, "settled", signer, {
      inputTokens: 12n,
      outputTokens: 5n,
      usageSource: "gateway",
      claimed: lie,
      counted: count,
    });
    const silent = await listed(2, 40n, "unsettled", signer, {
      usageSource: "gateway",
      claimed: null,
    });
    const report = await judge([liar, silent], 60n);
    expect(report.ok).toBe(true);
    const id = (n: number) => `0x${n.toString(16).padStart(64, "0")}`;
    expect(reportJson(report).requests).toEqual([
      {
        request_id: id(1),
        settled: true,
        charge: "60",
        charged: {
          input_tokens: "12",
          output_tokens: "5",
          cached_tokens: "0",
          reasoning_tokens: "0",
        },
        usage_source: "gateway",
        claimed: {
          input_tokens: "3550",
          output_tokens: "2000",
          cached_tokens: "0",
          reasoning_tokens: "0",
        },
        counted: {
          input_tokens: "12",
          output_tokens: "5",
          cached_tokens: "0",
          reasoning_tokens: "0",
        },
        receipt_version: "4",
      },
      {
        request_id: id(2),
        settled: false,
        charge: "40",
        charged: {
          input_tokens: "10",
          output_tokens: "5",
          cached_tokens: "0",
          reasoning_tokens: "0",
        },
        usage_source: "gateway",
        claimed: null,
        counted: {
          input_tokens: "10",
          output_tokens: "6",
          cached_tokens: "0",
          reasoning_tokens: "0",
        },
        receipt_version: "4",
      },
    ]);
    expect(verdict(report).slice(1)).toEqual([
      `receipt ${id(1)}: charged 60 for 12 in, 5 out (the gateway's count); claimed 3550 in, 2000 out; counted 12 in, 5 out`,
      `receipt ${id(2)}: charged 40 for 10 in, 5 out (the gateway's count); no claim; counted 10 in, 6 out`,
    ]);
  });

  it("a receipt whose claim, count or source was changed does not verify", async () => {
    const tampered: ListedReceipt[] = [];
    for (const [n, change] of [
      [
        1,
        (m: Record<string, unknown>) =>
          (m.claimed = { ...(m.claimed as object), outputTokens: "5" }),
      ],
      [
        2,
        (m: Record<string, unknown>) => (m.counted = { ...(m.counted as object), present: false }),
      ],
      [3, (m: Record<string, unknown>) => (m.usageSource = "provider")],
    ] as const) {
      const one = await listed(n, 10n, "settled", signer, {
        usageSource: "gateway",
        claimed: lie,
        counted: count,
      });
      change(one.receipt.message);
      tampered.push(one);
    }
    const report = await judge(tampered, 0n);
    expect(report.invalid.map((f) => f.reason)).toEqual(
      Array(3).fill(`signature does not verify against the receipt signer ${signer.address}`),
    );
    expect(report.requests).toEqual([]);
  });

  it("still verifies a version 3 receipt (signed before claim and count were kept)", async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    const current = buildUsageReceipt(record(7, 25n), { chainId, market });
    const { usageSource: _s, claimed: _c, counted: _n, ...message } = current.message;
    const v3 = {
      types: { EIP712Domain: eip712DomainFields, UsageReceipt: usageReceiptFieldsV3 },
      primaryType: "UsageReceipt",
      domain: { ...current.domain, version: "3" },
      message,
    };
    const signature = await account.signTypedData(signableReceipt(v3));
    const old: ListedReceipt = {
      receipt: v3,
      signature,
      signer: account.address,
      settlement: { status: "settled", batch_id: null },
    };
    const report = await judgeReceipts({
      permitId,
      chainId,
      market,
      signer: account.address,
      receipts: [old],
      chainSettled: 25n,
    });
    expect(report).toMatchObject({ ok: true, invalid: [], settledCharges: 25n });
    expect(report.requests[0]).toMatchObject({ usageSource: null, claimed: null, version: "3" });
    expect(verdict(report)[1]).toBe(
      `receipt ${message.requestId}: charged 25 for 10 in, 5 out (a version 3 receipt: claim and count not signed)`,
    );
    // The same message under the current version (no claim, no count) does not verify.
    const relabelled = { ...old, receipt: { ...v3, domain: { ...v3.domain, version: "4" } } };
    const again = await judgeReceipts({
      permitId,
      chainId,
      market,
      signer: account.address,
      receipts: [relabelled],
      chainSettled: 0n,
    });
    expect(again.invalid).toEqual([
      { requestId: message.requestId, reason: "signature or message malformed" },
    ]);
  });
});
