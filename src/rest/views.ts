import type { DescEnum } from "@bufbuild/protobuf";
import {
  ModelStatusSchema,
  OfferStatusSchema,
  type Model,
  type Offer,
} from "../../gen/gateway/v1/market_pb.js";
import type { OfferHealth, TypedData, VerificationRun } from "../../gen/gateway/v1/provider_pb.js";
import {
  Billing,
  BillingSchema,
  PermitStateSchema,
  RequestStatusSchema,
  SettlementStatusSchema,
  type InferenceRequest,
  type PermitBalance,
} from "../../gen/gateway/v1/inference_pb.js";
import {
  PermitAuthorizationStatusSchema,
  type AuthorizeKeyTypedData,
  type PermitAuthorization,
  type RevokeKeyAuthorizationTypedData,
} from "../../gen/gateway/v1/permit_pb.js";
import type { Quote } from "../../gen/gateway/v1/quote_pb.js";
import { BatchStatusSchema, type FlushResponse } from "../../gen/gateway/v1/settlement_pb.js";

/**
 * Protobuf messages -> the spec's JSON resources (snake_case, enum values as
 * lower-case words, timestamps as integer Unix seconds, money as decimal
 * strings). Absent optional values are `null`.
 */

/** `MODEL_STATUS_ACTIVE` -> `active`. */
function enumWord(schema: DescEnum, value: number): string {
  return (schema.value[value]?.localName ?? "unspecified").toLowerCase();
}

function seconds(value: bigint | undefined): number | null {
  return value === undefined ? null : Number(value);
}

export function modelView(model: Model) {
  return {
    id: model.id,
    object: "model",
    model_id: model.modelId,
    repository: model.repository,
    revision: model.revision,
    task: model.task,
    creator: model.creator,
    credit_token: model.creditToken,
    pool_id: model.poolId,
    position_token_id: model.positionTokenId,
    provider_count: model.providerCount,
    status: enumWord(ModelStatusSchema, model.status),
    aliases: model.aliases,
  };
}

export function offerView(offer: Offer) {
  return {
    offer_id: offer.offerId,
    model_id: offer.modelId,
    operator: offer.operator,
    payout: offer.payout,
    status: enumWord(OfferStatusSchema, offer.status),
    tariff_version: offer.tariffVersion,
    capabilities: offer.capabilities ?? {},
    verified_at: seconds(offer.verifiedAt),
    verification_expires_at: seconds(offer.verificationExpiresAt),
    region: offer.region,
    hardware: offer.hardware,
    max_concurrency: offer.maxConcurrency,
    verified_features: offer.verifiedFeatures,
    tariff: {
      version: offer.tariff?.version ?? offer.tariffVersion,
      input_price_per_mtok: offer.tariff?.inputPricePerMtok ?? "0",
      output_price_per_mtok: offer.tariff?.outputPricePerMtok ?? "0",
      wake_fee: offer.tariff?.wakeFee ?? "0",
    },
  };
}

/** `?status=active` -> the enum value; undefined when absent; throws a 400 on an unknown word. */
export function parseStatusFilter<T extends number>(
  schema: DescEnum,
  word: string | null,
): T | undefined {
  if (word === null || word === "") return undefined;
  const value = schema.values.find((v) => enumWord(schema, v.number) === word && v.number !== 0);
  return value?.number as T | undefined;
}

export function offerHealthView(health: OfferHealth) {
  return {
    offer_id: health.offerId,
    status: enumWord(OfferStatusSchema, health.status),
    running: health.running,
    verified_at: seconds(health.verifiedAt),
    verification_expires_at: seconds(health.verificationExpiresAt),
    checked_at: seconds(health.checkedAt),
    quarantine_reason: health.quarantineReason ?? null,
  };
}

/** The verification run a verify answer rests on (REST: `verification`). */
export function verificationRunView(run: VerificationRun) {
  return {
    ran_at: Number(run.ranAt),
    replayed: run.replayed,
    next_run_at: Number(run.nextRunAt),
  };
}

/** The challenge as wallet-ready EIP-712 JSON (what eth_signTypedData_v4 takes as is). */
export function typedDataView(typed: TypedData) {
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
function typedDataFrame(typed: AuthorizeKeyTypedData | RevokeKeyAuthorizationTypedData) {
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

export function permitAuthorizationView(a: PermitAuthorization) {
  return {
    id: a.id,
    object: "permit_authorization",
    api_key_id: a.apiKeyId,
    payer: a.payer,
    permit_id: a.permitId,
    status: enumWord(PermitAuthorizationStatusSchema, a.status),
    expires_at: Number(a.expiresAt),
    created_at: Number(a.createdAt),
    revoked_at: seconds(a.revokedAt),
    revoked_by: a.revokedBy === "" ? null : a.revokedBy,
  };
}

export function quoteView(quote: Quote) {
  return {
    quote_id: quote.quoteId,
    model: quote.model,
    model_id: quote.modelId,
    offer_id: quote.offerId,
    tariff_version: quote.tariffVersion,
    input_tokens: quote.inputTokens,
    max_output_tokens: quote.maxOutputTokens,
    wakes_endpoint: quote.wakesEndpoint,
    maximum_credits: quote.maximumCredits,
    expires_at: Number(quote.expiresAt),
  };
}

export function billingWord(billing: Billing): string | null {
  return billing === Billing.UNSPECIFIED ? null : enumWord(BillingSchema, billing);
}

export function requestView(request: InferenceRequest) {
  return {
    id: request.id,
    object: "inference.request",
    model: request.model,
    model_id: request.modelId,
    offer_id: request.offerId,
    permit_id: request.permitId,
    quote_id: request.quoteId,
    stream: request.stream,
    status: enumWord(RequestStatusSchema, request.status),
    input_tokens: request.inputTokens.toString(),
    output_tokens: request.outputTokens.toString(),
    cached_input_tokens: request.cachedInputTokens.toString(),
    reasoning_tokens: request.reasoningTokens.toString(),
    maximum_credits: request.maximumCredits,
    credits_charged: request.creditsCharged,
    tariff_version: request.tariffVersion,
    billing: billingWord(request.billing),
    error: request.error === "" ? null : request.error,
    created_at: Number(request.createdAt),
    completed_at: seconds(request.completedAt),
    settlement: {
      status: enumWord(SettlementStatusSchema, request.settlement?.status ?? 0),
      batch_id: request.settlement?.batchId || null,
      tx_hash: request.settlement?.txHash || null,
      settled_at: seconds(request.settlement?.settledAt),
      reason: request.settlement?.reason || null,
    },
  };
}

export function permitBalanceView(permit: PermitBalance) {
  return {
    permit_id: permit.permitId,
    state: enumWord(PermitStateSchema, permit.state),
    model_id: permit.modelId,
    offer_id: permit.offerId === "" ? null : permit.offerId,
    payer: permit.payer,
    expires_at: Number(permit.expiresAt),
    closable_at: seconds(permit.closableAt),
    deposit: permit.deposit,
    settled: permit.settled,
    charged_unsettled: permit.chargedUnsettled,
    reserved: permit.reserved,
    available: permit.available,
  };
}

/** DESIGN.md's flush body, plus what an operator needs to act on it. */
export function flushView(response: FlushResponse) {
  return {
    batches: response.batches.map((b) => ({
      batch_id: b.batchId,
      requests: Number(b.requests),
      credits: b.credits,
      tx_hash: b.txHash || null,
      status: enumWord(BatchStatusSchema, b.status),
      charges: Number(b.charges),
      gas: b.gas || null,
      error: b.error || null,
    })),
    settled_requests: Number(response.settledRequests),
    settled_credits: response.settledCredits,
    unsettleable: response.unsettleable.map((u) => ({
      permit_id: u.permitId,
      offer_id: u.offerId,
      requests: Number(u.requests),
      credits: u.credits,
      reason: u.reason,
    })),
    busy: response.busy,
  };
}
