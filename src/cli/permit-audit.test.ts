import { getAddress, type Hex } from "viem";
import { generatePrivateKey } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { createReceiptSigner } from "../adapters/crypto/receipt-signer.js";
import { buildUsageReceipt, type ReceiptRecord } from "../domain/receipts.js";
import { judgeReceipts, verdict, type ListedReceipt } from "./permit-audit.js";

const market = getAddress(`0x${"5f".repeat(20)}`);
const chainId = 31337;
const permitId: Hex = `0x${"aa".repeat(32)}`;

function record(n: number, charge: bigint): ReceiptRecord {
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
  };
}

const signer = createReceiptSigner(generatePrivateKey());
const impostor = createReceiptSigner(generatePrivateKey());

async function listed(
  n: number,
  charge: bigint,
  status = "settled",
  by = signer,
): Promise<ListedReceipt> {
  const signed = await by.sign(buildUsageReceipt(record(n, charge), { chainId, market }));
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
});
