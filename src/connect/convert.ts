import { create } from "@bufbuild/protobuf";
import {
  AuditReferenceKind,
  AuditState,
  MeteringKind,
  ModelSchema,
  ModelStatus,
  OfferAuditSchema,
  OfferSchema,
  OfferStatus,
  type Model,
  type OfferAudit,
  type Offer,
} from "../../gen/gateway/v1/market_pb.js";
import type { ModelDirectory, ModelRecord, OfferRecord } from "../domain/catalog.js";
import * as domain from "../domain/catalog.js";
import type { Reputation } from "../domain/reputation/reputation.js";
import { decimalString, isModelMismatch } from "../domain/audits/standing.js";
import type * as audits from "../domain/audits/types.js";
import type { TypedDataField } from "../domain/signatures.js";
import type { Metering } from "../domain/tokens.js";

/** Domain records -> protobuf messages (and the status enums both ways). */

const modelStatusToProto: Record<domain.ModelStatus, ModelStatus> = {
  pending: ModelStatus.PENDING,
  active: ModelStatus.ACTIVE,
  paused: ModelStatus.PAUSED,
  retired: ModelStatus.RETIRED,
};

const offerStatusToProto: Record<domain.OfferStatus, OfferStatus> = {
  active: OfferStatus.ACTIVE,
  paused: OfferStatus.PAUSED,
  retired: OfferStatus.RETIRED,
};

export function modelStatusFromProto(status: ModelStatus): domain.ModelStatus | undefined {
  return domain.modelStatuses.find((s) => modelStatusToProto[s] === status);
}

export function offerStatusFromProto(status: OfferStatus): domain.OfferStatus | undefined {
  return domain.offerStatuses.find((s) => offerStatusToProto[s] === status);
}

const auditStateToProto: Record<audits.AuditState, AuditState> = {
  unaudited: AuditState.UNAUDITED,
  passing: AuditState.PASSING,
  flagged: AuditState.FLAGGED,
  excluded: AuditState.EXCLUDED,
};

const referenceKindToProto: Record<
  audits.OfferAuditVerdict["reference"]["kind"],
  AuditReferenceKind
> = {
  anchor: AuditReferenceKind.ANCHOR,
  majority: AuditReferenceKind.MAJORITY,
  data: AuditReferenceKind.DATA,
};

/**
 * An offer's audit standing as the catalog and quotes show it; without one (never judged),
 * `unaudited` with an e-value of 1 and no thresholds.
 */
export function auditToMessage(standing: audits.OfferAuditStanding | undefined): OfferAudit {
  if (standing === undefined)
    return create(OfferAuditSchema, { state: AuditState.UNAUDITED, eValue: "1" });
  return create(OfferAuditSchema, {
    state: auditStateToProto[standing.state],
    eValue: decimalString(standing.eValue),
    flagAt: decimalString(standing.flagAt),
    excludeAt: decimalString(standing.excludeAt),
    referenceKind: referenceKindToProto[standing.reference.kind],
    updatedAt: BigInt(Math.floor(standing.updatedAtMs / 1000)),
    modelMismatch: isModelMismatch(standing.state),
  });
}

export function offerStatusToMessage(status: domain.OfferStatus): OfferStatus {
  return offerStatusToProto[status];
}

/**
 * How a model, offer or quote is metered, as its message's `metering` and `tokenizer` fields;
 * unknown (an answer that is not the catalog's): unspecified, shown as null.
 */
export function meteringToMessage(metering: Metering | undefined): {
  metering: MeteringKind;
  tokenizer: string;
} {
  if (metering === undefined) return { metering: MeteringKind.UNSPECIFIED, tokenizer: "" };
  return metering.kind === "exact"
    ? { metering: MeteringKind.EXACT, tokenizer: metering.tokenizer }
    : { metering: MeteringKind.BOUND, tokenizer: "" };
}

export function modelToMessage(model: ModelRecord, directory: ModelDirectory): Model {
  return create(ModelSchema, {
    id: directory.publicId(model.modelId),
    modelId: model.modelId,
    repository: model.repository,
    revision: model.revision,
    task: model.task,
    creator: model.creator,
    creditToken: model.creditToken,
    ...(model.creditTokenDecimals === undefined
      ? {}
      : { creditTokenDecimals: model.creditTokenDecimals }),
    ...(model.creditTokenSymbol === undefined
      ? {}
      : { creditTokenSymbol: model.creditTokenSymbol }),
    poolId: model.poolId,
    positionTokenId: model.positionTokenId.toString(),
    providerCount: model.activeOffers,
    status: modelStatusToProto[model.status],
    aliases: [...directory.aliases(model.modelId)],
    ...meteringToMessage(model.metering),
  });
}

/**
 * An offer as the catalog shows it; `reputation` (and the usage divergence it carries) and its
 * model's `metering` where the answer is the catalog's.
 */
export function offerToMessage(
  offer: OfferRecord,
  reputation?: Reputation,
  metering?: Metering,
  cooldownUntil?: number,
  audit?: OfferAudit,
): Offer {
  return create(OfferSchema, {
    audit,
    cooldownUntil: cooldownUntil === undefined ? undefined : BigInt(cooldownUntil),
    ...meteringToMessage(metering),
    offerId: offer.offerId,
    modelId: offer.modelId,
    operator: offer.operator,
    payout: offer.payout,
    status: offerStatusToProto[offer.status],
    tariffVersion: offer.tariff.version.toString(),
    capabilities: offer.capabilities,
    verifiedAt: offer.verifiedAt === undefined ? undefined : BigInt(offer.verifiedAt),
    verificationExpiresAt:
      offer.verificationExpiresAt === undefined ? undefined : BigInt(offer.verificationExpiresAt),
    region: offer.region,
    hardware: offer.hardware,
    maxConcurrency: offer.maxConcurrency,
    verifiedFeatures: [...(offer.verifiedFeatures ?? [])],
    tariff: {
      version: offer.tariff.version.toString(),
      inputPricePerMtok: offer.tariff.inputPricePerMTok.toString(),
      outputPricePerMtok: offer.tariff.outputPricePerMTok.toString(),
      wakeFee: offer.tariff.wakeFee.toString(),
    },
    reputation:
      reputation === undefined
        ? undefined
        : {
            score: reputation.score,
            successRateBps: reputation.successRateBps,
            timeToFirstTokenMs: reputation.timeToFirstTokenMs,
            outputTokensPerSecond: reputation.outputTokensPerSecond,
            verificationPassRateBps: reputation.verificationPassRateBps,
            flags: reputation.flags,
            requests: reputation.requests,
            windowSeconds: reputation.windowSeconds,
            modelMismatch: reputation.modelMismatch,
          },
    usageDivergence:
      reputation === undefined
        ? undefined
        : {
            claimed: reputation.usageDivergence.claimed,
            diverged: reputation.usageDivergence.diverged,
            shareBps: reputation.usageDivergence.shareBps,
            flagged: reputation.usageDivergence.flagged,
            excluded: reputation.usageDivergence.excluded,
          },
  });
}

/**
 * The frame every typed data the gateway hands out shares (domain, types, primary type), in the
 * protos' init shape; each RPC adds its own message.
 */
export function typedDataFrame(typed: {
  readonly domain: {
    readonly name: string;
    readonly version: string;
    readonly chainId: number;
    readonly verifyingContract: string;
  };
  readonly types: Readonly<Record<string, readonly TypedDataField[]>>;
  readonly primaryType: string;
}) {
  return {
    domain: {
      name: typed.domain.name,
      version: typed.domain.version,
      chainId: BigInt(typed.domain.chainId),
      verifyingContract: typed.domain.verifyingContract,
    },
    types: Object.entries(typed.types).map(([name, fields]) => ({
      name,
      fields: fields.map((f) => ({ name: f.name, type: f.type })),
    })),
    primaryType: typed.primaryType,
  };
}
