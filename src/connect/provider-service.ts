import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Hex } from "viem";
import {
  BindKeyResponseSchema,
  CreateKeyBindingChallengeResponseSchema,
  CreateRegistrationChallengeResponseSchema,
  GetOfferEarningsResponseSchema,
  ListKeyBindingsResponseSchema,
  GetOfferHealthResponseSchema,
  OfferKeyBindingSchema,
  OfferKeyBindingStatus,
  ProviderService,
  RegisterEndpointResponseSchema,
  RevokeKeyBindingResponseSchema,
  VerifyOfferResponseSchema,
  type OfferKeyBinding as OfferKeyBindingMessage,
  type VerifyOfferRequest,
  type VerifyOfferResponse,
} from "../../gen/gateway/v1/provider_pb.js";
import { BatchStatus } from "../../gen/gateway/v1/settlement_pb.js";
import type { Catalog, OfferRecord } from "../domain/catalog.js";
import { reasoningPolicyOf } from "../domain/chat/usage.js";
import { GatewayError } from "../domain/errors.js";
import type { HealthMonitor, VerificationOutcome } from "../domain/health-types.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import type {
  EarningsBatch,
  EarningsTotals,
  OfferEarnings,
  OfferEarningsService,
} from "../domain/offer-earnings.js";
import {
  keyBindingStatus,
  type EarningsReader,
  type KeyBindingStatus,
  type OfferKeyBinding,
  type OfferKeyBindingService,
} from "../domain/offer-key-binding.js";
import type { RegistrationService } from "../domain/registration/index.js";
import { callerKey, settlementOperatorKey } from "./context.js";
import { offerStatusToMessage, offerToMessage, typedDataFrame } from "./convert.js";

export interface ProviderServiceDeps {
  readonly catalog: Catalog;
  readonly registration: RegistrationService;
  readonly health: HealthMonitor;
  readonly verificationTtlSeconds: number;
  /**
   * Whether a model hides its reasoning (its tokenizer registry entry): a probe's claimed hidden
   * reasoning is allowed only then. Absent: no model does.
   */
  readonly hidesReasoning?: (model: { repository: string; revision: string }) => boolean;
  /** HIDDEN_REASONING_RATIO_MAX; absent: the default. */
  readonly hiddenReasoningRatioMax?: bigint;
  /** Told when an endpoint or its verification changed (routing caches drop their copies). */
  readonly onEndpointChange?: () => void;
  /** Key bindings and earnings (absent: those RPCs answer `unimplemented`). */
  readonly keyBindings?: OfferKeyBindingService;
  readonly earnings?: OfferEarningsService;
  /** Unix seconds (a binding's status depends on it). */
  readonly clock?: () => number;
}

const bindingStatus: Record<KeyBindingStatus, OfferKeyBindingStatus> = {
  active: OfferKeyBindingStatus.ACTIVE,
  expired: OfferKeyBindingStatus.EXPIRED,
  revoked: OfferKeyBindingStatus.REVOKED,
};

const batchStatus: Record<EarningsBatch["status"], BatchStatus> = {
  pending: BatchStatus.PENDING,
  submitted: BatchStatus.SUBMITTED,
  settled: BatchStatus.SETTLED,
  failed: BatchStatus.FAILED,
};

function apiKeyOf(ctx: HandlerContext): string {
  const caller = ctx.values.get(callerKey);
  if (caller === undefined) throw new GatewayError("missing_api_key", "missing API key");
  return caller.apiKeyId;
}

/** Who reads earnings: the settlement operator's token, or the calling API key. */
function earningsReaderOf(ctx: HandlerContext): EarningsReader {
  if (ctx.values.get(settlementOperatorKey)) return { kind: "settlement_operator" };
  return { kind: "api_key", apiKeyId: apiKeyOf(ctx) };
}

const totalsMessage = (t: EarningsTotals) => ({
  requests: BigInt(t.requests),
  inputTokens: t.inputTokens.toString(),
  outputTokens: t.outputTokens.toString(),
  credits: t.credits.toString(),
});

function need<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw new GatewayError("not_implemented", `${what} is not served here`);
  return value;
}

function offerIdOf(raw: string): Hex {
  if (!isHex32(raw))
    throw new GatewayError("invalid_hex", "offer id must be a Hex32 (0x + 64 hex digits)");
  return normalizeHex(raw);
}

async function indexedOffer(catalog: Catalog, offerId: Hex): Promise<OfferRecord> {
  const offer = await catalog.getOffer(offerId);
  if (offer === undefined)
    throw new GatewayError("offer_not_found", `offer ${offerId} does not exist`);
  return offer;
}

/**
 * A failed run as the caller sees it: the failed check's code, and in words when the run was
 * (a replayed outcome is not news), what it left standing, and when a new run may start.
 */
function verificationFailed(outcome: Extract<VerificationOutcome, { ok: false }>): GatewayError {
  const when = outcome.replayed ? `the last verification (at ${outcome.ranAt})` : "verification";
  const standing =
    outcome.outcome === "unreachable" && outcome.expiresAt !== undefined
      ? `; the standing verification (until ${outcome.expiresAt}) is kept`
      : "";
  return new GatewayError(
    outcome.check,
    `${when} failed: ${outcome.message}${standing}; the next run may start at ${outcome.nextRunAt}`,
  );
}

const seconds = (value: number | undefined): bigint | undefined =>
  value === undefined ? undefined : BigInt(value);

/** An offer's earnings as the RPC answers them. */
const earningsMessage = (e: OfferEarnings) => ({
  offerId: e.offerId,
  modelId: e.modelId,
  payout: e.payout,
  from: BigInt(e.from),
  to: BigInt(e.to),
  unsettled: totalsMessage(e.totals.unsettled),
  settling: totalsMessage(e.totals.settling),
  settled: totalsMessage(e.totals.settled),
  unsettleable: totalsMessage(e.totals.unsettleable),
  unsettleableReasons: e.unsettleableReasons.map((r) => ({
    reason: r.reason,
    requests: BigInt(r.requests),
    credits: r.credits.toString(),
  })),
  batches: e.batches.map((b) => ({
    batchId: b.batchId,
    status: batchStatus[b.status],
    txHash: b.txHash ?? "",
    createdAt: BigInt(b.createdAt),
    settledAt: b.settledAt === null ? undefined : BigInt(b.settledAt),
    requests: BigInt(b.requests),
    credits: b.credits.toString(),
  })),
  batchesTruncated: e.batchesTruncated,
  days: e.days.map((d) => ({
    startsAt: BigInt(d.startsAt),
    requests: BigInt(d.requests),
    credits: d.credits.toString(),
    settledCredits: d.settledCredits.toString(),
  })),
});

/**
 * Runs (or replays) the offer's verification with the names its model answers to; a failed
 * run is its check's error.
 */
async function verifyOffer(
  deps: ProviderServiceDeps,
  req: VerifyOfferRequest,
): Promise<VerifyOfferResponse> {
  const { catalog, health } = deps;
  const offerId = offerIdOf(req.offerId);
  const offer = await indexedOffer(catalog, offerId);
  const model = await catalog.getModel(offer.modelId);
  const names = [
    catalog.directory.publicId(model.modelId),
    model.modelId,
    ...catalog.directory.aliases(model.modelId),
  ];
  // The probes' usage is counted with the model's tokenizer, the offer's declared hidden
  // reasoning allowed (DESIGN.md section 10).
  const outcome = await health.verify(offerId, [...new Set(names)], deps.verificationTtlSeconds, {
    model: { repository: model.repository, revision: model.revision },
    reasoning: reasoningPolicyOf(
      offer.tariff,
      { hidesReasoning: deps.hidesReasoning?.(model) },
      deps.hiddenReasoningRatioMax,
    ),
  });
  // A run that changed the verification drops this process's routing copies at once.
  if (!outcome.replayed && outcome.outcome !== "unreachable") deps.onEndpointChange?.();
  if (!outcome.ok) throw verificationFailed(outcome);
  return create(VerifyOfferResponseSchema, {
    offer: offerToMessage(await indexedOffer(catalog, offerId)),
    verification: {
      ranAt: BigInt(outcome.ranAt),
      replayed: outcome.replayed,
      nextRunAt: BigInt(outcome.nextRunAt),
    },
  });
}

export function createProviderService(
  deps: ProviderServiceDeps,
): ServiceImpl<typeof ProviderService> {
  const { catalog, registration, health } = deps;
  const clock = deps.clock ?? (() => Math.floor(Date.now() / 1000));
  const bindingMessage = (b: OfferKeyBinding): OfferKeyBindingMessage =>
    create(OfferKeyBindingSchema, {
      id: b.id,
      offerId: b.offerId,
      apiKeyId: b.apiKeyId,
      operator: b.operator,
      expiresAt: BigInt(b.expiresAt),
      createdAt: BigInt(b.createdAt),
      revokedAt: b.revokedAt === null ? undefined : BigInt(b.revokedAt),
      status: bindingStatus[keyBindingStatus(b, clock())],
    });
  return {
    async createRegistrationChallenge(req) {
      const typed = await registration.createChallenge({
        offerId: req.offerId,
        endpointUrl: req.endpointUrl,
        nonce: req.nonce === "" ? undefined : req.nonce,
        expiresAt: req.expiresAt,
        endpointToken: req.endpointToken === "" ? undefined : req.endpointToken,
      });
      return create(CreateRegistrationChallengeResponseSchema, {
        typedData: {
          ...typedDataFrame(typed),
          message: {
            offerId: typed.message.offerId,
            operator: typed.message.operator,
            endpointUrlHash: typed.message.endpointUrlHash,
            endpointTokenHash: typed.message.endpointTokenHash,
            nonce: typed.message.nonce,
            expiresAt: BigInt(typed.message.expiresAt),
          },
        },
      });
    },

    async registerEndpoint(req) {
      const offerId = await registration.register({
        offerId: req.offerId,
        endpointUrl: req.endpointUrl,
        nonce: req.nonce,
        expiresAt: req.expiresAt,
        signature: req.signature,
        endpointToken: req.endpointToken === "" ? undefined : req.endpointToken,
      });
      deps.onEndpointChange?.();
      return create(RegisterEndpointResponseSchema, {
        offer: offerToMessage(await indexedOffer(catalog, offerId)),
      });
    },

    async getOfferHealth(req) {
      const offerId = offerIdOf(req.offerId);
      const offer = await indexedOffer(catalog, offerId);
      const endpoint = await health.probeIfStale(offerId);
      return create(GetOfferHealthResponseSchema, {
        health: {
          offerId,
          status: offerStatusToMessage(offer.status),
          running: endpoint?.running ?? false,
          verifiedAt: seconds(endpoint?.verifiedAt),
          verificationExpiresAt: seconds(endpoint?.verificationExpiresAt),
          checkedAt: seconds(endpoint?.checkedAt),
          quarantineReason: offer.quarantineReason,
        },
      });
    },

    async verifyOffer(req) {
      return verifyOffer(deps, req);
    },

    async createKeyBindingChallenge(req, ctx) {
      const typed = await need(deps.keyBindings, "key binding").createChallenge({
        apiKeyId: apiKeyOf(ctx),
        offerId: req.offerId,
        ...(req.expiresAt === undefined ? {} : { expiresAt: req.expiresAt }),
      });
      return create(CreateKeyBindingChallengeResponseSchema, {
        typedData: {
          ...typedDataFrame(typed),
          message: {
            offerId: typed.message.offerId,
            operator: typed.message.operator,
            keyId: typed.message.keyId,
            expiresAt: BigInt(typed.message.expiresAt),
            nonce: typed.message.nonce,
            deployment: typed.message.deployment,
          },
        },
      });
    },

    async bindKey(req, ctx) {
      const binding = await need(deps.keyBindings, "key binding").bind({
        apiKeyId: apiKeyOf(ctx),
        offerId: req.offerId,
        expiresAt: req.expiresAt,
        nonce: req.nonce,
        signature: req.signature,
        ...(req.deployment === undefined ? {} : { deployment: req.deployment }),
      });
      return create(BindKeyResponseSchema, { binding: bindingMessage(binding) });
    },

    async revokeKeyBinding(req, ctx) {
      const binding = await need(deps.keyBindings, "key binding").revoke({
        apiKeyId: apiKeyOf(ctx),
        offerId: req.offerId,
        id: req.id,
      });
      return create(RevokeKeyBindingResponseSchema, { binding: bindingMessage(binding) });
    },

    async listKeyBindings(_req, ctx) {
      const bindings = await need(deps.keyBindings, "key binding").list({
        apiKeyId: apiKeyOf(ctx),
      });
      return create(ListKeyBindingsResponseSchema, { bindings: bindings.map(bindingMessage) });
    },

    async getOfferEarnings(req, ctx) {
      const e = await need(deps.earnings, "earnings").get({
        reader: earningsReaderOf(ctx),
        offerId: req.offerId,
        from: req.from,
        to: req.to,
      });
      return create(GetOfferEarningsResponseSchema, { earnings: earningsMessage(e) });
    },
  };
}
