import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  AuthorizeKeyResponseSchema,
  CreateAuthorizationChallengeResponseSchema,
  CreateRevocationChallengeResponseSchema,
  ListAuthorizationsResponseSchema,
  ListPayerAuthorizationsResponseSchema,
  PermitAuthorizationSchema,
  PermitAuthorizationStatus,
  PermitService,
  RevokeAuthorizationBySignatureResponseSchema,
  RevokeAuthorizationResponseSchema,
  RevokePayerAuthorizationsResponseSchema,
  type PermitAuthorization as PermitAuthorizationMessage,
} from "../../gen/gateway/v1/permit_pb.js";
import { GatewayError } from "../domain/errors.js";
import {
  authorizationStatus,
  periodUse,
  warnUse,
  type AuthorizationStatus,
  type PermitAuthorization,
  type PermitAuthorizationService,
} from "../domain/permit-authorization/index.js";
import { callerKey } from "./context.js";
import { typedDataFrame } from "./convert.js";

export interface PermitServiceDeps {
  readonly authorizations: PermitAuthorizationService;
  /** Unix seconds (an authorization's status depends on it). */
  readonly clock: () => number;
}

const statusToProto: Record<AuthorizationStatus, PermitAuthorizationStatus> = {
  active: PermitAuthorizationStatus.ACTIVE,
  expired: PermitAuthorizationStatus.EXPIRED,
  revoked: PermitAuthorizationStatus.REVOKED,
};

function apiKeyOf(ctx: HandlerContext): string {
  const caller = ctx.values.get(callerKey);
  if (caller === undefined) throw new GatewayError("missing_api_key", "missing API key");
  return caller.apiKeyId;
}

/** PermitService: the transport of domain/permit-authorization.ts, nothing more. */
export function createPermitService(deps: PermitServiceDeps): ServiceImpl<typeof PermitService> {
  const { authorizations } = deps;
  const toMessage = (a: PermitAuthorization) => authorizationMessage(a, deps.clock());

  return {
    createAuthorizationChallenge(req, ctx) {
      const typed = authorizations.createChallenge({
        apiKeyId: apiKeyOf(ctx),
        payer: req.payer,
        permitId: req.permitId,
        ...(req.expiresAt === undefined ? {} : { expiresAt: req.expiresAt }),
        totalCap: req.totalCap,
        perRequestCap: req.perRequestCap,
        period: req.period,
        periodCap: req.periodCap,
        warnAt: req.warnAt,
      });
      return create(CreateAuthorizationChallengeResponseSchema, {
        typedData: {
          ...typedDataFrame(typed),
          message: {
            payer: typed.message.payer,
            keyId: typed.message.keyId,
            permitId: typed.message.permitId,
            expiresAt: BigInt(typed.message.expiresAt),
            issuedAt: BigInt(typed.message.issuedAt),
            deployment: typed.message.deployment,
            totalCap: typed.message.totalCap,
            perRequestCap: typed.message.perRequestCap,
            period: typed.message.period,
            periodCap: typed.message.periodCap,
            warnAt: typed.message.warnAt,
            nonce: typed.message.nonce,
          },
        },
      });
    },

    async authorizeKey(req, ctx) {
      const authorization = await authorizations.authorize({
        apiKeyId: apiKeyOf(ctx),
        payer: req.payer,
        permitId: req.permitId,
        expiresAt: req.expiresAt,
        issuedAt: req.issuedAt,
        ...(req.deployment === "" ? {} : { deployment: req.deployment }),
        totalCap: req.totalCap,
        perRequestCap: req.perRequestCap,
        period: req.period,
        periodCap: req.periodCap,
        warnAt: req.warnAt,
        nonce: req.nonce,
        signature: req.signature,
      });
      return create(AuthorizeKeyResponseSchema, { authorization: toMessage(authorization) });
    },

    async listAuthorizations(req, ctx) {
      const all = (await authorizations.list(apiKeyOf(ctx))).map(toMessage);
      return create(ListAuthorizationsResponseSchema, {
        authorizations:
          req.status === PermitAuthorizationStatus.UNSPECIFIED
            ? all
            : all.filter((a) => a.status === req.status),
      });
    },

    async revokeAuthorization(req, ctx) {
      const authorization = await authorizations.revoke({ apiKeyId: apiKeyOf(ctx), id: req.id });
      return create(RevokeAuthorizationResponseSchema, { authorization: toMessage(authorization) });
    },

    async createRevocationChallenge(req) {
      const typed = await authorizations.revocationChallenge(req.id);
      return create(CreateRevocationChallengeResponseSchema, {
        typedData: {
          ...typedDataFrame(typed),
          message: {
            payer: typed.message.payer,
            authorizationId: typed.message.authorizationId,
          },
        },
      });
    },

    // A payer's own calls: no API key (the auth interceptor lets them through), the signature is
    // the credential.
    async listPayerAuthorizations(req) {
      const { authorizations: page, hasMore } = await authorizations.listForPayer({
        payer: req.payer,
        deployment: req.deployment,
        expiresAt: req.expiresAt,
        signature: req.signature,
        limit: req.limit,
        startingAfter: req.startingAfter,
      });
      return create(ListPayerAuthorizationsResponseSchema, {
        authorizations: page.map(toMessage),
        hasMore,
      });
    },

    async revokePayerAuthorizations(req) {
      const outcome = await authorizations.revokeForPayer({
        payer: req.payer,
        deployment: req.deployment,
        keyId: req.keyId,
        permitId: req.permitId,
        before: req.before,
        signature: req.signature,
      });
      return create(RevokePayerAuthorizationsResponseSchema, {
        revoked: BigInt(outcome.revoked),
        authorizations: outcome.authorizations.map(toMessage),
        ...(outcome.epoch === null ? {} : { epoch: BigInt(outcome.epoch) }),
        revokedBefore: BigInt(outcome.revokedBefore),
        ...(outcome.warning === null ? {} : { warning: outcome.warning }),
      });
    },

    async revokeAuthorizationBySignature(req) {
      const authorization = await authorizations.revokeBySignature({
        id: req.id,
        signature: req.signature,
      });
      return create(RevokeAuthorizationBySignatureResponseSchema, {
        authorization: toMessage(authorization),
      });
    },
  };
}

/** The current period's use of a periodic cap (issue 38): none without one. */
function periodFields(
  a: PermitAuthorization,
  now: number,
): { periodUsed: string; periodRenewsAt?: bigint } {
  const use = periodUse(a, now);
  return use === undefined
    ? { periodUsed: "0" }
    : { periodUsed: use.used.toString(), periodRenewsAt: BigInt(use.renewsAt) };
}

/** An authorization as the wire has it, its status and its period's use read at `now`. */
function authorizationMessage(a: PermitAuthorization, now: number): PermitAuthorizationMessage {
  return create(PermitAuthorizationSchema, {
    id: a.id,
    apiKeyId: a.apiKeyId,
    payer: a.payer,
    permitId: a.permitId,
    expiresAt: BigInt(a.expiresAt),
    issuedAt: BigInt(a.issuedAt),
    totalCap: a.totalCap.toString(),
    perRequestCap: a.perRequestCap.toString(),
    createdAt: BigInt(a.createdAt),
    revokedAt: a.revokedAt === null ? undefined : BigInt(a.revokedAt),
    status: statusToProto[authorizationStatus(a, now)],
    revokedBy: a.revokedBy ?? "",
    // A new authorization has no use; a listing reads it (permit-authorizations.ts).
    creditsUsed: (a.use?.creditsUsed ?? 0n).toString(),
    creditsReserved: (a.use?.creditsReserved ?? 0n).toString(),
    period: a.period,
    periodCap: a.periodCap.toString(),
    ...periodFields(a, now),
    warnAt: a.warnAt.toString(),
    warnReached: warnUse(a, now)?.reached ?? false,
    lastUsedAt:
      a.use?.lastUsedAt === undefined || a.use.lastUsedAt === null
        ? undefined
        : BigInt(a.use.lastUsedAt),
  });
}
