import { Type } from "@sinclair/typebox";
import { GatewayInfoSchema } from "../../../gen/gateway/v1/gateway_pb.js";
import { Address, component, Decimal, Hex32, UnixSeconds } from "../../schema/common.js";
import { receiptDomainVersion } from "../../domain/receipts.js";
import { protoView } from "./proto-view.js";
import { settlementOfRequest } from "./resources.js";
import { typedData } from "../../schema/signing.js";

/**
 * Usage receipts (docs/decisions/settlement.md, "Usage receipts") and the gateway's public facts: the
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
    audit_corpus: {
      emptyIsNull: true,
      description:
        "the prompts its blind audits ask: operator (the operator's own corpus, which providers do not read) or shipped (the public corpus shipped with the gateway: a provider that reads it can tell audits by their prompts, so a passing audit status says little, a flag still holds); null: no audits",
    },
  },
});

const count = (description: string) => ({ ...Decimal, description });

/** The gateway's domain at the receipts' version (src/domain/receipts.ts `receiptDomainVersion`). */
const ReceiptDomain = component(
  "UsageReceiptDomain",
  Type.Object({
    name: Type.Literal("Model Market Gateway"),
    version: Type.Literal(receiptDomainVersion),
    chainId: Type.Integer({ minimum: 1 }),
    verifyingContract: Address,
  }),
);

/** The receipt's struct `UsageFigures`: a claim or a count, or (`present` false) none. */
const UsageFigures = component(
  "UsageReceiptFigures",
  Type.Object({
    present: Type.Boolean({
      description: "false: none (the provider reported no usage; nothing was counted), figures 0",
    }),
    inputTokens: count("uint64"),
    outputTokens: count("uint64"),
    cachedTokens: count("uint64: of inputTokens, served from the provider's prompt cache"),
    reasoningTokens: count("uint64: of outputTokens, spent on reasoning"),
  }),
);

export const UsageReceiptTypedData = typedData(
  "UsageReceiptTypedData",
  "UsageReceipt",
  {
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
    usageSource: Type.Unsafe<string>({
      enum: ["provider", "gateway"],
      description:
        "whose figures were charged: provider (its claim, as reported) or gateway (its own count plus tolerance)",
    }),
    claimed: { ...UsageFigures, description: "the provider's usage claim" },
    counted: { ...UsageFigures, description: "the gateway's own count of the answer" },
  },
  { structs: ["UsageFigures"], domain: ReceiptDomain },
);

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
