import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Hex } from "viem";
import {
  CreateRegistrationChallengeResponseSchema,
  GetOfferHealthResponseSchema,
  ProviderService,
  RegisterEndpointResponseSchema,
  VerifyOfferResponseSchema,
} from "../../gen/gateway/v1/provider_pb.js";
import type { Catalog, OfferRecord } from "../domain/catalog.js";
import { GatewayError } from "../domain/errors.js";
import type { HealthMonitor, VerificationOutcome } from "../domain/health.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import type { RegistrationService } from "../domain/registration.js";
import { offerStatusToMessage, offerToMessage } from "./convert.js";

export interface ProviderServiceDeps {
  readonly catalog: Catalog;
  readonly registration: RegistrationService;
  readonly health: HealthMonitor;
  readonly verificationTtlSeconds: number;
  /** Told when an endpoint or its verification changed (routing caches drop their copies). */
  readonly onEndpointChange?: () => void;
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

export function createProviderService(
  deps: ProviderServiceDeps,
): ServiceImpl<typeof ProviderService> {
  const { catalog, registration, health } = deps;
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
          domain: {
            name: typed.domain.name,
            version: typed.domain.version,
            chainId: BigInt(typed.domain.chainId),
            verifyingContract: typed.domain.verifyingContract,
          },
          types: Object.entries(typed.types).map(([name, fields]) => ({ name, fields })),
          primaryType: typed.primaryType,
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
      const offerId = offerIdOf(req.offerId);
      const offer = await indexedOffer(catalog, offerId);
      const model = await catalog.getModel(offer.modelId);
      const names = [
        catalog.directory.publicId(model.modelId),
        model.modelId,
        ...catalog.directory.aliases(model.modelId),
      ];
      const outcome = await health.verify(
        offerId,
        [...new Set(names)],
        deps.verificationTtlSeconds,
      );
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
    },
  };
}
