import type { Address, Hex } from "viem";
import type { AuthorizationDomain } from "./permit-authorization/typed-data.js";
import type { TypedDataField } from "./signatures.js";

/**
 * The shapes of a signed usage receipt (receipts.ts builds and signs them): types only, so that
 * what carries a receipt (a completed answer, domain/chat/types.ts) needs nothing of how one is
 * made.
 */

/** A `UsageFigures` as JSON carries it (decimal strings). */
export type UsageFiguresMessage = {
  present: boolean;
  inputTokens: string;
  outputTokens: string;
  cachedTokens: string;
  reasoningTokens: string;
};

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
  usageSource: string;
  claimed: UsageFiguresMessage;
  counted: UsageFiguresMessage;
};

/** Wallet-ready JSON (`eth_signTypedData_v4` wants `EIP712Domain` listed). */
export interface UsageReceiptTypedData {
  types: {
    EIP712Domain: TypedDataField[];
    UsageReceipt: TypedDataField[];
    UsageFigures: TypedDataField[];
  };
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
