import { Type } from "@sinclair/typebox";
import { GatewayInfoSchema } from "../../gen/gateway/v1/gateway_pb.js";
import { Address, component, Decimal, Hex32, UnixSeconds } from "./common.js";
import { protoView } from "./proto-view.js";
import { settlementOfRequest } from "./resources.js";
import { typedData } from "./signing.js";

/**
 * Usage receipts (docs/decisions.md, "Usage receipts") and the gateway's public facts: the
 * typed data as `eth_signTypedData_v4` verifies it (camelCase, integers beyond 2^53 as decimal
 * strings), with the receipt key's signature.
 */

export const gatewayResource = protoView(GatewayInfoSchema, "Gateway", {
  constants: { object: "gateway" },
  fields: {
    chain_id: { integer: true },
    market: { schema: Address, description: "the market contract (verifyingContract)" },
    settlement_account: {
      emptyIsNull: true,
      schema: Address,
      description: "the account that settles charges on chain; null: none configured",
    },
    receipt_signer: {
      emptyIsNull: true,
      schema: Address,
      description:
        "the address that signs usage receipts; null: this gateway signs none (RECEIPT_PRIVATE_KEY unset)",
    },
  },
});

const count = (description: string) => ({ ...Decimal, description });

export const UsageReceiptTypedData = typedData("UsageReceiptTypedData", "UsageReceipt", {
  requestId: Hex32,
  permitId: Hex32,
  offerId: Hex32,
  modelId: Hex32,
  tariffVersion: count("uint64"),
  inputTokens: count("uint64"),
  outputTokens: count("uint64"),
  cachedTokens: count("uint64: of inputTokens, served from the provider's prompt cache"),
  reasoningTokens: count("uint64: of outputTokens, spent on reasoning"),
  charge: count("uint256: the credits charged, in the credit token's base units"),
  billing: Type.Unsafe<string>({ enum: ["billed", "partial"] }),
  closedAt: UnixSeconds,
});

const Signature = Type.String({
  pattern: "^0x[0-9a-f]{130}$",
  description: "the receipt key's 65-byte signature over `receipt`",
});

export const SignedUsageReceipt = component(
  "SignedUsageReceipt",
  Type.Object({
    receipt: UsageReceiptTypedData,
    signature: Signature,
    signer: { ...Address, description: "the receipt key's address (GET /v1/gateway)" },
  }),
);

export const PermitReceipt = component(
  "PermitReceipt",
  Type.Object({
    object: Type.Literal("usage_receipt"),
    receipt: UsageReceiptTypedData,
    signature: Signature,
    signer: Address,
    settlement: {
      ...settlementOfRequest.schema,
      description:
        "what became of the charge; batch_id is the settlement batch that settled it (or is settling it)",
    },
  }),
);

export const PermitReceiptList = component(
  "PermitReceiptList",
  Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(PermitReceipt),
    has_more: Type.Boolean({
      description: "more receipts follow: ask again with `starting_after` = the last request_id",
    }),
  }),
);
