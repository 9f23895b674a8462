import { hashTypedData, type Address, type Hex } from "viem";
import { GatewayError } from "./errors.js";
import { gatewayTypedData, type AuthorizationDomain } from "./permit-authorization.js";
import type { TypedDataField } from "./registration.js";

/**
 * Signed usage receipts: for every closed request with a charge, the gateway signs EIP-712 typed
 * data over what it charged, in the domain of every other signature it asks for (DESIGN.md
 * section 8). A payer holds the gateway to its receipts: what settles on chain for a permit must
 * be the sum of its settled receipts (`gateway permit audit`).
 *
 * A receipt is signed when it is asked for, from the durable closed record, never on the chat
 * path: secp256k1 signatures are deterministic (RFC 6979), so the same record always yields the
 * same receipt and signature, and there is nothing to store (docs/decisions.md, "Usage
 * receipts").
 */

export const usageReceiptFields: TypedDataField[] = [
  { name: "requestId", type: "string" },
  { name: "permitId", type: "bytes32" },
  { name: "offerId", type: "bytes32" },
  { name: "modelId", type: "bytes32" },
  { name: "tariffVersion", type: "uint64" },
  { name: "inputTokens", type: "uint64" },
  { name: "outputTokens", type: "uint64" },
  { name: "cachedTokens", type: "uint64" },
  { name: "reasoningTokens", type: "uint64" },
  { name: "charge", type: "uint256" },
  { name: "billing", type: "string" },
  { name: "closedAt", type: "uint64" },
];

/**
 * The receipt's message as JSON carries it: every uint64 and uint256 a decimal string (token
 * counts and the charge may pass 2^53; every EIP-712 implementation reads decimal strings),
 * `closedAt` Unix seconds as a number (as every other timestamp of the API).
 */
export type UsageReceiptMessage = {
  requestId: string;
  permitId: Hex;
  offerId: Hex;
  modelId: Hex;
  tariffVersion: string;
  inputTokens: string;
  outputTokens: string;
  cachedTokens: string;
  reasoningTokens: string;
  charge: string;
  billing: string;
  closedAt: number;
};

/** Wallet-ready JSON (`eth_signTypedData_v4` wants `EIP712Domain` listed). */
export interface UsageReceiptTypedData {
  types: { EIP712Domain: TypedDataField[]; UsageReceipt: TypedDataField[] };
  primaryType: "UsageReceipt";
  domain: AuthorizationDomain;
  message: UsageReceiptMessage;
}

/** A receipt with the gateway's signature over it. */
export interface SignedUsageReceipt {
  readonly receipt: UsageReceiptTypedData;
  readonly signature: Hex;
  readonly signer: Address;
}

/** What a receipt is made of: the closed record's fields it covers. */
export interface ReceiptRecord {
  readonly id: string;
  readonly permitId: Hex;
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly tariffVersion: bigint;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly cachedInputTokens: bigint;
  readonly reasoningTokens: bigint;
  readonly creditsCharged: bigint | null;
  readonly billing: string | null;
  readonly status: string;
  readonly completedAt: number | null;
}

/**
 * The receipt of a closed, charged record. Throws `request_not_closed` for an open request (it
 * may get one when it closes) and `receipt_not_found` for one that closed without a charge (it
 * never will: nothing was charged, nothing settles).
 */
export function buildUsageReceipt(
  record: ReceiptRecord,
  domain: { chainId: number; market: Address },
): UsageReceiptTypedData {
  if (record.status === "pending" || record.status === "streaming" || record.completedAt === null) {
    throw new GatewayError(
      "request_not_closed",
      `request ${record.id} is still open: its receipt exists once it closes`,
    );
  }
  if (record.creditsCharged === null || record.creditsCharged === 0n || record.billing === null) {
    throw new GatewayError(
      "receipt_not_found",
      `request ${record.id} closed without a charge (billing void): it has no receipt`,
    );
  }
  return gatewayTypedData("UsageReceipt", usageReceiptFields, domain, {
    requestId: record.id,
    permitId: record.permitId,
    offerId: record.offerId,
    modelId: record.modelId,
    tariffVersion: record.tariffVersion.toString(),
    inputTokens: record.inputTokens.toString(),
    outputTokens: record.outputTokens.toString(),
    cachedTokens: record.cachedInputTokens.toString(),
    reasoningTokens: record.reasoningTokens.toString(),
    charge: record.creditsCharged.toString(),
    billing: record.billing,
    closedAt: record.completedAt,
  });
}

/** A receipt's message with its integers as bigint: what viem hashes, signs and verifies. */
export type SignableUsageReceiptMessage = {
  requestId: string;
  permitId: Hex;
  offerId: Hex;
  modelId: Hex;
  tariffVersion: bigint;
  inputTokens: bigint;
  outputTokens: bigint;
  cachedTokens: bigint;
  reasoningTokens: bigint;
  charge: bigint;
  billing: string;
  closedAt: bigint;
};

/**
 * The typed data without `EIP712Domain` and with bigint integers, as viem's `signTypedData`,
 * `hashTypedData` and `verifyTypedData` take it. Throws a `RangeError` on a message whose
 * integers are not decimal integers (a receipt read from elsewhere, for the audit).
 */
export function signableReceipt(receipt: {
  domain: AuthorizationDomain;
  message: Record<string, unknown>;
}): {
  types: { UsageReceipt: TypedDataField[] };
  primaryType: "UsageReceipt";
  domain: AuthorizationDomain;
  message: SignableUsageReceiptMessage;
} {
  const m = receipt.message;
  const int = (key: string): bigint => {
    const value = m[key];
    if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0)
      return BigInt(value);
    if (typeof value === "string" && /^\d{1,78}$/.test(value)) return BigInt(value);
    throw new RangeError(`receipt message member ${key} is not a decimal integer`);
  };
  const text = (key: string): string => {
    const value = m[key];
    if (typeof value !== "string") throw new RangeError(`receipt message member ${key} is missing`);
    return value;
  };
  return {
    types: { UsageReceipt: usageReceiptFields.map((f) => ({ ...f })) },
    primaryType: "UsageReceipt",
    domain: { ...receipt.domain },
    message: {
      requestId: text("requestId"),
      permitId: text("permitId") as Hex,
      offerId: text("offerId") as Hex,
      modelId: text("modelId") as Hex,
      tariffVersion: int("tariffVersion"),
      inputTokens: int("inputTokens"),
      outputTokens: int("outputTokens"),
      cachedTokens: int("cachedTokens"),
      reasoningTokens: int("reasoningTokens"),
      charge: int("charge"),
      billing: text("billing"),
      closedAt: int("closedAt"),
    },
  };
}

/** The EIP-712 digest a receipt's signature signs. */
export function receiptDigest(receipt: UsageReceiptTypedData): Hex {
  return hashTypedData(signableReceipt(receipt));
}

/**
 * Signs receipts with the gateway's receipt key. The key stays inside the implementation
 * (adapters/crypto/receipt-signer.ts): nothing here can log, return or serialise it.
 */
export interface ReceiptSigner {
  /** The receipt key's address (published by `GET /v1/gateway`). */
  readonly address: Address;
  sign(receipt: UsageReceiptTypedData): Promise<SignedUsageReceipt>;
}
