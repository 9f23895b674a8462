import type { DescEnum } from "@bufbuild/protobuf";
import type { BindOfferKeyTypedData, TypedData } from "../../../gen/gateway/v1/provider_pb.js";
import type {
  UsageReceiptFigures,
  UsageReceiptTypedData,
} from "../../../gen/gateway/v1/inference_pb.js";
import type {
  AuthorizeKeyTypedData,
  RevokeKeyAuthorizationTypedData,
} from "../../../gen/gateway/v1/permit_pb.js";
import { enumWord } from "./proto-view.js";

/**
 * What REST shows that is not the view of one protobuf message (those are derived:
 * src/rest/views/resources.ts): the EIP-712 challenges as wallets take them (camelCase, the types
 * as a map), a `?status=` filter.
 */

/** `?status=active` -> the enum value; undefined when absent; throws a 400 on an unknown word. */
export function parseStatusFilter<T extends number>(
  schema: DescEnum,
  word: string | null,
): T | undefined {
  if (word === null || word === "") return undefined;
  const value = schema.values.find((v) => enumWord(schema, v.number) === word && v.number !== 0);
  return value?.number as T | undefined;
}

/** The challenge as wallet-ready EIP-712 JSON (what eth_signTypedData_v4 takes as is). */
export function typedDataView(typed: TypedData) {
  return {
    ...typedDataFrame(typed),
    message: {
      offerId: typed.message?.offerId,
      operator: typed.message?.operator,
      endpointUrlHash: typed.message?.endpointUrlHash,
      endpointTokenHash: typed.message?.endpointTokenHash,
      nonce: typed.message?.nonce,
      expiresAt: Number(typed.message?.expiresAt ?? 0n),
    },
  };
}

/** The typed data's domain and types as eth_signTypedData_v4 takes them. */
function typedDataFrame(
  typed:
    | TypedData
    | AuthorizeKeyTypedData
    | RevokeKeyAuthorizationTypedData
    | BindOfferKeyTypedData
    | UsageReceiptTypedData,
) {
  return {
    types: Object.fromEntries(
      typed.types.map((t) => [t.name, t.fields.map((f) => ({ name: f.name, type: f.type }))]),
    ),
    primaryType: typed.primaryType,
    domain: {
      name: typed.domain?.name,
      version: typed.domain?.version,
      chainId: Number(typed.domain?.chainId ?? 0n),
      verifyingContract: typed.domain?.verifyingContract,
    },
  };
}

/** `AuthorizeKey` typed data, wallet-ready (camelCase, as the payer's wallet signs it). */
export function authorizeKeyTypedDataView(typed: AuthorizeKeyTypedData) {
  return {
    ...typedDataFrame(typed),
    message: {
      payer: typed.message?.payer,
      keyId: typed.message?.keyId,
      permitId: typed.message?.permitId,
      expiresAt: Number(typed.message?.expiresAt ?? 0n),
      issuedAt: Number(typed.message?.issuedAt ?? 0n),
      deployment: typed.message?.deployment,
      totalCap: typed.message?.totalCap,
      perRequestCap: typed.message?.perRequestCap,
      period: typed.message?.period,
      periodCap: typed.message?.periodCap,
      warnAt: typed.message?.warnAt,
      nonce: typed.message?.nonce,
    },
  };
}

export function revokeTypedDataView(typed: RevokeKeyAuthorizationTypedData) {
  return {
    ...typedDataFrame(typed),
    message: {
      payer: typed.message?.payer,
      authorizationId: typed.message?.authorizationId,
    },
  };
}

/** `BindOfferKey` typed data, wallet-ready (camelCase, as the operator's wallet signs it). */
export function bindOfferKeyTypedDataView(typed: BindOfferKeyTypedData) {
  return {
    ...typedDataFrame(typed),
    message: {
      offerId: typed.message?.offerId,
      operator: typed.message?.operator,
      keyId: typed.message?.keyId,
      expiresAt: Number(typed.message?.expiresAt ?? 0n),
      nonce: typed.message?.nonce,
      deployment: typed.message?.deployment,
    },
  };
}

/**
 * A usage receipt as `eth_signTypedData_v4` (and ethers' `verifyTypedData`) verifies it: every
 * uint64 and the uint256 charge as decimal strings (JSON numbers lose precision past 2^53),
 * `closedAt` Unix seconds.
 */
export function usageReceiptView(typed: UsageReceiptTypedData) {
  const m = typed.message;
  return {
    ...typedDataFrame(typed),
    message: {
      requestId: m?.requestId,
      permitId: m?.permitId,
      offerId: m?.offerId,
      modelId: m?.modelId,
      tariffVersion: (m?.tariffVersion ?? 0n).toString(),
      inputTokens: (m?.inputTokens ?? 0n).toString(),
      outputTokens: (m?.outputTokens ?? 0n).toString(),
      cachedTokens: (m?.cachedTokens ?? 0n).toString(),
      reasoningTokens: (m?.reasoningTokens ?? 0n).toString(),
      charge: m?.charge,
      billing: m?.billing,
      closedAt: Number(m?.closedAt ?? 0n),
      usageSource: m?.usageSource,
      claimed: receiptFiguresView(m?.claimed),
      counted: receiptFiguresView(m?.counted),
    },
  };
}

/** A receipt's `UsageFigures` (its integers as decimal strings). */
function receiptFiguresView(f: UsageReceiptFigures | undefined) {
  return {
    present: f?.present ?? false,
    inputTokens: (f?.inputTokens ?? 0n).toString(),
    outputTokens: (f?.outputTokens ?? 0n).toString(),
    cachedTokens: (f?.cachedTokens ?? 0n).toString(),
    reasoningTokens: (f?.reasoningTokens ?? 0n).toString(),
  };
}
