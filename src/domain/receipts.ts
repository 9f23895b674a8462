import { hashTypedData, type Address, type Hex } from "viem";
import type { UsageFigures, UsageSource } from "./chat/types.js";
import { GatewayError } from "./errors.js";
import { gatewayTypedData, type AuthorizationDomain } from "./permit-authorization/index.js";
import type { TypedDataField } from "./signatures.js";
import type {
  SignedUsageReceipt,
  UsageFiguresMessage,
  UsageReceiptTypedData,
} from "./receipt-types.js";

/**
 * Signed usage receipts: for every closed request with a charge, the gateway signs EIP-712 typed
 * data over what it charged, in the domain of every other signature it asks for (DESIGN.md
 * section 8). A payer holds the gateway to its receipts: what settles on chain for a permit must
 * be the sum of its settled receipts (`gateway permit audit`).
 *
 * A receipt is signed when it is asked for, from the durable closed record, never on the chat
 * path: secp256k1 signatures are deterministic (RFC 6979), so the same record always yields the
 * same receipt and signature, and there is nothing to store (docs/decisions/settlement.md, "Usage
 * receipts").
 */

/**
 * The receipt domain's version: the gateway's one domain (registration's "3") at "4", since the
 * receipt carries the provider's claim, the gateway's count and which one was charged (issue 27).
 * A version "3" receipt has the older `UsageReceipt` ({@link usageReceiptFieldsV3}); the audit
 * still verifies one.
 */
export const receiptDomainVersion = "4";

/**
 * `UsageFigures`, a struct of the receipt: a provider's usage claim or the gateway's count.
 * `present` false: there is none (the provider reported no usage; nothing was counted), and
 * every figure is 0. EIP-712 has no optional member, so absence is said, not left out.
 */
export const usageFiguresFields: TypedDataField[] = [
  { name: "present", type: "bool" },
  { name: "inputTokens", type: "uint64" },
  { name: "outputTokens", type: "uint64" },
  { name: "cachedTokens", type: "uint64" },
  { name: "reasoningTokens", type: "uint64" },
];

/** `UsageReceipt` of domain version "3" (issue 22): what was charged, without claim and count. */
export const usageReceiptFieldsV3: TypedDataField[] = [
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
 * `UsageReceipt` (domain version {@link receiptDomainVersion}): the usage charged (inputTokens
 * to reasoningTokens) and the charge, then whose figures were charged (`usageSource`:
 * `provider`, its claim as reported; `gateway`, its own count plus tolerance), the provider's
 * claim and the gateway's count.
 */
export const usageReceiptFields: TypedDataField[] = [
  ...usageReceiptFieldsV3,
  { name: "usageSource", type: "string" },
  { name: "claimed", type: "UsageFigures" },
  { name: "counted", type: "UsageFigures" },
];

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
  readonly usageSource: UsageSource | null;
  /** The provider's usage claim; null: it reported none (or it was not kept then). */
  readonly claimed: UsageFigures | null;
  /** The gateway's own count; null: nothing was counted (or it was not kept then). */
  readonly counted: UsageFigures | null;
}

const noFigures: UsageFiguresMessage = {
  present: false,
  inputTokens: "0",
  outputTokens: "0",
  cachedTokens: "0",
  reasoningTokens: "0",
};

function figuresMessage(figures: UsageFigures | null): UsageFiguresMessage {
  if (figures === null) return { ...noFigures };
  return {
    present: true,
    inputTokens: figures.inputTokens.toString(),
    outputTokens: figures.outputTokens.toString(),
    cachedTokens: figures.cachedInputTokens.toString(),
    reasoningTokens: figures.reasoningTokens.toString(),
  };
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
  const typed = gatewayTypedData("UsageReceipt", usageReceiptFields, domain, {
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
    usageSource: record.usageSource ?? "",
    claimed: figuresMessage(record.claimed),
    counted: figuresMessage(record.counted),
  });
  return {
    ...typed,
    types: { ...typed.types, UsageFigures: usageFiguresFields.map((f) => ({ ...f })) },
    domain: { ...typed.domain, version: receiptDomainVersion },
  };
}

/** A `UsageFigures` with its integers as bigint. */
export type SignableUsageFigures = {
  present: boolean;
  inputTokens: bigint;
  outputTokens: bigint;
  cachedTokens: bigint;
  reasoningTokens: bigint;
};

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
  /** Absent in a version "3" receipt, as the two below. */
  usageSource?: string;
  claimed?: SignableUsageFigures;
  counted?: SignableUsageFigures;
};

/**
 * The typed data without `EIP712Domain` and with bigint integers, as viem's `signTypedData`,
 * `hashTypedData` and `verifyTypedData` take it. The fields are the receipt domain's version's
 * (a version "3" receipt verifies as version "3" defined it; any other version as the current
 * one), never the receipt's own `types`: a receipt cannot choose what its signature covers.
 * Throws a `RangeError` on a message whose integers are not decimal integers (a receipt read from
 * elsewhere, for the audit).
 */
export function signableReceipt(receipt: {
  domain: AuthorizationDomain;
  message: Record<string, unknown>;
}): {
  types: { UsageReceipt: TypedDataField[]; UsageFigures?: TypedDataField[] };
  primaryType: "UsageReceipt";
  domain: AuthorizationDomain;
  message: SignableUsageReceiptMessage;
} {
  const legacy = receipt.domain.version === "3";
  const int = (m: Record<string, unknown>, key: string, path = key): bigint => {
    const value = m[key];
    if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0)
      return BigInt(value);
    if (typeof value === "string" && /^\d{1,78}$/.test(value)) return BigInt(value);
    throw new RangeError(`receipt message member ${path} is not a decimal integer`);
  };
  const m = receipt.message;
  const text = (key: string): string => {
    const value = m[key];
    if (typeof value !== "string") throw new RangeError(`receipt message member ${key} is missing`);
    return value;
  };
  const figures = (key: string): SignableUsageFigures => {
    const f = m[key];
    if (
      typeof f !== "object" ||
      f === null ||
      typeof (f as { present?: unknown }).present !== "boolean"
    )
      throw new RangeError(`receipt message member ${key} is not a UsageFigures`);
    const struct = f as Record<string, unknown>;
    return {
      present: struct["present"] as boolean,
      inputTokens: int(struct, "inputTokens", `${key}.inputTokens`),
      outputTokens: int(struct, "outputTokens", `${key}.outputTokens`),
      cachedTokens: int(struct, "cachedTokens", `${key}.cachedTokens`),
      reasoningTokens: int(struct, "reasoningTokens", `${key}.reasoningTokens`),
    };
  };
  const charged: SignableUsageReceiptMessage = {
    requestId: text("requestId"),
    permitId: text("permitId") as Hex,
    offerId: text("offerId") as Hex,
    modelId: text("modelId") as Hex,
    tariffVersion: int(m, "tariffVersion"),
    inputTokens: int(m, "inputTokens"),
    outputTokens: int(m, "outputTokens"),
    cachedTokens: int(m, "cachedTokens"),
    reasoningTokens: int(m, "reasoningTokens"),
    charge: int(m, "charge"),
    billing: text("billing"),
    closedAt: int(m, "closedAt"),
  };
  if (legacy) {
    return {
      types: { UsageReceipt: usageReceiptFieldsV3.map((f) => ({ ...f })) },
      primaryType: "UsageReceipt",
      domain: { ...receipt.domain },
      message: charged,
    };
  }
  return {
    types: {
      UsageReceipt: usageReceiptFields.map((f) => ({ ...f })),
      UsageFigures: usageFiguresFields.map((f) => ({ ...f })),
    },
    primaryType: "UsageReceipt",
    domain: { ...receipt.domain },
    message: {
      ...charged,
      usageSource: text("usageSource"),
      claimed: figures("claimed"),
      counted: figures("counted"),
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
