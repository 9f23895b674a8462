import { verifyTypedData } from "ethers";
import { getAddress, type Hex } from "viem";
import { generatePrivateKey } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { createReceiptSigner } from "../adapters/crypto/receipt-signer.js";
import type { UsageReceiptTypedData } from "./receipt-types.js";
import { buildUsageReceipt, receiptDomainVersion, type ReceiptRecord } from "./receipts.js";

const market = getAddress(`0x${"5f".repeat(20)}`);
const chainId = 31337;
const requestId: Hex = `0x${"01".repeat(32)}`;

/** A liar's answer: five words, claimed as the quote's maximum and 50 times the input. */
const record: ReceiptRecord = {
  id: requestId,
  permitId: `0x${"aa".repeat(32)}`,
  offerId: `0x${"bb".repeat(32)}`,
  modelId: `0x${"cc".repeat(32)}`,
  tariffVersion: 2n,
  inputTokens: 12n,
  outputTokens: 5n,
  cachedInputTokens: 0n,
  reasoningTokens: 0n,
  creditsCharged: 42_000n,
  billing: "billed",
  status: "completed",
  completedAt: 1_700_000_123,
  usageSource: "gateway",
  claimed: {
    inputTokens: 3_550n,
    outputTokens: 2_000n,
    cachedInputTokens: 9n,
    reasoningTokens: 1n,
  },
  counted: { inputTokens: 12n, outputTokens: 5n, cachedInputTokens: 0n, reasoningTokens: 0n },
};

/** ethers' verification, as a payer's own tools would do it (EIP712Domain left to ethers). */
function recover(receipt: UsageReceiptTypedData, signature: string): string {
  const { EIP712Domain: _domain, ...types } = receipt.types;
  return verifyTypedData(receipt.domain, types, receipt.message, signature);
}

describe("usage receipt typed data (domain version 4: claim and count)", () => {
  it("signs the usage charged, whose figures it was, the provider's claim and the gateway's count", () => {
    const receipt = buildUsageReceipt(record, { chainId, market });
    expect(receiptDomainVersion).toBe("4");
    expect(receipt.domain).toEqual({
      name: "Model Market Gateway",
      version: "4",
      chainId,
      verifyingContract: market,
    });
    expect(receipt.primaryType).toBe("UsageReceipt");
    expect(receipt.types.UsageReceipt.map((f) => `${f.type} ${f.name}`)).toEqual([
      "string requestId",
      "bytes32 permitId",
      "bytes32 offerId",
      "bytes32 modelId",
      "uint64 tariffVersion",
      "uint64 inputTokens",
      "uint64 outputTokens",
      "uint64 cachedTokens",
      "uint64 reasoningTokens",
      "uint256 charge",
      "string billing",
      "uint64 closedAt",
      "string usageSource",
      "UsageFigures claimed",
      "UsageFigures counted",
    ]);
    expect(receipt.types.UsageFigures.map((f) => `${f.type} ${f.name}`)).toEqual([
      "bool present",
      "uint64 inputTokens",
      "uint64 outputTokens",
      "uint64 cachedTokens",
      "uint64 reasoningTokens",
    ]);
    expect(receipt.message).toEqual({
      requestId,
      permitId: record.permitId,
      offerId: record.offerId,
      modelId: record.modelId,
      tariffVersion: "2",
      inputTokens: "12",
      outputTokens: "5",
      cachedTokens: "0",
      reasoningTokens: "0",
      charge: "42000",
      billing: "billed",
      closedAt: 1_700_000_123,
      usageSource: "gateway",
      claimed: {
        present: true,
        inputTokens: "3550",
        outputTokens: "2000",
        cachedTokens: "9",
        reasoningTokens: "1",
      },
      counted: {
        present: true,
        inputTokens: "12",
        outputTokens: "5",
        cachedTokens: "0",
        reasoningTokens: "0",
      },
    });
  });

  it("says that there is no claim (or no count) rather than leaving it out", () => {
    const receipt = buildUsageReceipt(
      { ...record, claimed: null, counted: null },
      { chainId, market },
    );
    const none = {
      present: false,
      inputTokens: "0",
      outputTokens: "0",
      cachedTokens: "0",
      reasoningTokens: "0",
    };
    expect(receipt.message.claimed).toEqual(none);
    expect(receipt.message.counted).toEqual(none);
  });

  it("verifies with ethers to the signer; any change to the claim, the count, the source or the version does not", async () => {
    const signer = createReceiptSigner(generatePrivateKey());
    const { receipt, signature } = await signer.sign(
      buildUsageReceipt(record, { chainId, market }),
    );
    expect(recover(receipt, signature)).toBe(signer.address);
    const m = receipt.message;
    const changes: [string, UsageReceiptTypedData][] = [
      ["usageSource", { ...receipt, message: { ...m, usageSource: "provider" } }],
      [
        "claimed.outputTokens",
        { ...receipt, message: { ...m, claimed: { ...m.claimed, outputTokens: "5" } } },
      ],
      [
        "claimed.present",
        { ...receipt, message: { ...m, claimed: { ...m.claimed, present: false } } },
      ],
      [
        "counted.inputTokens",
        { ...receipt, message: { ...m, counted: { ...m.counted, inputTokens: "3550" } } },
      ],
      [
        "counted.reasoningTokens",
        { ...receipt, message: { ...m, counted: { ...m.counted, reasoningTokens: "1" } } },
      ],
      [
        "claimed <-> counted",
        { ...receipt, message: { ...m, claimed: m.counted, counted: m.claimed } },
      ],
      ["domain version 3", { ...receipt, domain: { ...receipt.domain, version: "3" } }],
    ];
    for (const [what, tampered] of changes) {
      expect(recover(tampered, signature), what).not.toBe(signer.address);
    }
  });
});
