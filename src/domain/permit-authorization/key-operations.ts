/** The operations of an API key on its own authorizations: challenge, authorize, list, revoke. */
import { randomBytes } from "node:crypto";
import {
  challengeExpiry,
  newChallengeNonce,
  readChallengeNonce,
  readChallengeSignature,
} from "../challenge-window.js";
import { GatewayError } from "../errors.js";
import { normalizeHex } from "../hex.js";
import type { PermitAuthorization } from "./authorizations.js";
import {
  authorizationIdShape,
  readAuthorizationExpiry,
  readCaps,
  readIssuedAt,
  readPayer,
  readPermitId,
} from "./checks.js";
import type { ServiceRequest } from "./service-types.js";
import {
  nowOf,
  stored,
  verifyPayerSignature,
  type PermitAuthorizationServiceDeps,
} from "./service-context.js";
import {
  buildAuthorizeKeyTypedData,
  defaultAuthorizationLifetimeSeconds,
  type AuthorizeKeyTypedData,
} from "./typed-data.js";

export function createChallenge(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"createChallenge">,
): AuthorizeKeyTypedData {
  const payer = readPayer(req.payer);
  const permitId = readPermitId(req.permitId, false);
  const t = nowOf(deps);
  const expiresAt = challengeExpiry(
    req.expiresAt,
    t,
    Math.min(defaultAuthorizationLifetimeSeconds, deps.maxLifetimeSeconds),
    (value) => readAuthorizationExpiry(value, t, t, deps.maxLifetimeSeconds),
  );
  const caps = readCaps(
    req.totalCap,
    req.perRequestCap,
    permitId,
    req.period,
    req.periodCap,
    req.warnAt,
  );
  return authorizeKeyTypedData(deps, caps, {
    payer,
    keyId: req.apiKeyId,
    permitId,
    expiresAt,
    issuedAt: t,
    nonce: newChallengeNonce(),
  });
}

/** The `AuthorizeKey` a payer signs, on this market and for this gateway deployment. */
function authorizeKeyTypedData(
  deps: PermitAuthorizationServiceDeps,
  caps: ReturnType<typeof readCaps>,
  message: Omit<
    Parameters<typeof buildAuthorizeKeyTypedData>[0]["message"],
    "deployment" | "totalCap" | "perRequestCap" | "period" | "periodCap" | "warnAt"
  >,
): AuthorizeKeyTypedData {
  return buildAuthorizeKeyTypedData({
    chainId: deps.chainId,
    market: deps.market,
    message: {
      payer: message.payer,
      keyId: message.keyId,
      permitId: message.permitId,
      expiresAt: message.expiresAt,
      issuedAt: message.issuedAt,
      deployment: deps.deployment,
      totalCap: caps.totalCap.toString(),
      perRequestCap: caps.perRequestCap.toString(),
      period: caps.period,
      periodCap: caps.periodCap.toString(),
      warnAt: caps.warnAt.toString(),
      nonce: message.nonce,
    },
  });
}

export async function authorize(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"authorize">,
): Promise<PermitAuthorization> {
  const payer = readPayer(req.payer);
  const permitId = readPermitId(req.permitId, true);
  const t = nowOf(deps);
  if (req.deployment !== undefined && req.deployment !== deps.deployment) {
    throw new GatewayError(
      "wrong_deployment",
      `this authorization was signed for gateway deployment ${String(req.deployment).slice(0, 80)}; ` +
        `this is ${deps.deployment} (GET /v1/gateway)`,
    );
  }
  const issuedAt = readIssuedAt(req.issuedAt, t);
  const expiresAt = readAuthorizationExpiry(req.expiresAt, t, issuedAt, deps.maxLifetimeSeconds);
  const caps = readCaps(
    req.totalCap,
    req.perRequestCap,
    permitId,
    req.period,
    req.periodCap,
    req.warnAt,
  );
  readChallengeNonce(req.nonce);
  readChallengeSignature(req.signature);
  // The key id is the caller's, never the body's: a signature made for another key does
  // not verify for this one.
  const typedData = authorizeKeyTypedData(deps, caps, {
    payer,
    keyId: req.apiKeyId,
    permitId,
    expiresAt,
    issuedAt,
    nonce: req.nonce,
  });
  const signature = await verifyPayerSignature(deps, payer, typedData, req.signature);
  const authorization: PermitAuthorization = {
    id: `pauth_${randomBytes(12).toString("hex")}`,
    apiKeyId: req.apiKeyId,
    payer: normalizeHex(payer),
    permitId,
    expiresAt,
    issuedAt,
    totalCap: caps.totalCap,
    perRequestCap: caps.perRequestCap,
    period: caps.period,
    periodCap: caps.periodCap,
    warnAt: caps.warnAt,
    createdAt: t,
    revokedAt: null,
    revokedBy: null,
  };
  const outcome = await stored("the authorization store", () =>
    deps.store.insert(authorization, { nonce: req.nonce, signature }),
  );
  if (outcome === "nonce_used") {
    throw new GatewayError("nonce_used", "this authorization nonce has already been used");
  }
  if (outcome === "revoked") {
    throw new GatewayError(
      "authorization_revoked",
      `the payer revoked every authorization it signed up to a time at or after this one's issuedAt (${issuedAt}): ` +
        "ask for a new challenge and sign it again",
    );
  }
  deps.authorities.added(authorization);
  return authorization;
}

export function listForKey(
  deps: PermitAuthorizationServiceDeps,
  apiKeyId: string,
): Promise<PermitAuthorization[]> {
  return stored("the authorization store", () => deps.store.listByKey(apiKeyId));
}

export async function revokeByKey(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"revoke">,
): Promise<PermitAuthorization> {
  const revoked = authorizationIdShape.test(req.id)
    ? await stored("the authorization store", () =>
        deps.store.revoke({ id: req.id, apiKeyId: req.apiKeyId, now: nowOf(deps), by: "key" }),
      )
    : undefined;
  if (revoked === undefined) {
    throw new GatewayError(
      "authorization_not_found",
      `this API key holds no authorization ${req.id.slice(0, 64)}`,
    );
  }
  deps.authorities.revoked(revoked.apiKeyId, revoked.id);
  return revoked;
}
