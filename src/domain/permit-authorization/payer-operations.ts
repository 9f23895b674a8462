/**
 * The operations a payer signs for without any API key: revoke one authorization, list every
 * authorization of its address, revoke by key, permit or all.
 */
import { getAddress, type Hex } from "viem";
import { readChallengeSignature } from "../challenge-window.js";
import { GatewayError } from "../errors.js";
import { normalizeHex } from "../hex.js";
import type { PermitAuthorization } from "./authorizations.js";
import {
  apiKeyIdShape,
  authorizationIdShape,
  payerListMaxLimit,
  readBefore,
  readDeployment,
  readLimit,
  readPayer,
  readPermitId,
  readSignatureExpiry,
} from "./checks.js";
import type { PayerRevocation, ServiceRequest } from "./service-types.js";
import {
  findAuthorization,
  nowOf,
  stored,
  verifyPayerSignature,
  type PermitAuthorizationServiceDeps,
} from "./service-context.js";
import {
  anyPermit,
  buildListAuthorizationsTypedData,
  buildReadPayerRequestsTypedData,
  buildRevokeAuthorizationsTypedData,
  buildRevokeTypedData,
  revokeBeforeMaxAgeSeconds,
  revokeClockSkewWarningSeconds,
  type RevokeKeyAuthorizationTypedData,
} from "./typed-data.js";

export async function revocationChallenge(
  deps: PermitAuthorizationServiceDeps,
  id: string,
): Promise<RevokeKeyAuthorizationTypedData> {
  const a = await findAuthorization(deps, id);
  return buildRevokeTypedData({
    chainId: deps.chainId,
    market: deps.market,
    message: { payer: getAddress(a.payer), authorizationId: a.id },
  });
}

export async function revokeBySignature(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"revokeBySignature">,
): Promise<PermitAuthorization> {
  const a = await findAuthorization(deps, req.id);
  readChallengeSignature(req.signature);
  const payer = getAddress(a.payer);
  await verifyPayerSignature(
    deps,
    payer,
    buildRevokeTypedData({
      chainId: deps.chainId,
      market: deps.market,
      message: { payer, authorizationId: a.id },
    }),
    req.signature,
  );
  const revoked = await stored("the authorization store", () =>
    deps.store.revoke({ id: a.id, now: nowOf(deps), by: "payer" }),
  );
  if (revoked === undefined) throw new Error(`authorization ${a.id} vanished`);
  deps.authorities.revoked(revoked.apiKeyId, revoked.id);
  return revoked;
}

export async function listForPayer(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"listForPayer">,
): Promise<{ authorizations: PermitAuthorization[]; hasMore: boolean }> {
  // Every check that costs nothing comes before the signature's.
  const payer = readPayer(req.payer);
  const t = nowOf(deps);
  readDeployment(req.deployment, deps.deployment);
  const expiresAt = readSignatureExpiry(req.expiresAt, t);
  const limit = readLimit(req.limit);
  const startingAfter = req.startingAfter ?? "";
  if (startingAfter !== "" && !authorizationIdShape.test(startingAfter)) {
    throw new GatewayError(
      "invalid_request",
      "startingAfter must be an authorization id (pauth_ followed by 24 hex digits)",
    );
  }
  readChallengeSignature(req.signature);
  await verifyPayerSignature(
    deps,
    payer,
    buildListAuthorizationsTypedData({
      chainId: deps.chainId,
      market: deps.market,
      message: { payer, deployment: deps.deployment, expiresAt },
    }),
    req.signature,
  );
  const page = await stored("the authorization store", () =>
    deps.store.listByPayer(normalizeHex(payer), {
      limit: limit + 1,
      ...(startingAfter === "" ? {} : { startingAfter }),
    }),
  );
  return { authorizations: page.slice(0, limit), hasMore: page.length > limit };
}

/**
 * A payer's `ReadPayerRequests` token checked (deployment, expiry, then its signature, an
 * account's or a contract wallet's): the payer, lowercase, whose paid requests it reads.
 */
export async function payerReader(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"payerReader">,
): Promise<Hex> {
  const payer = readPayer(req.payer);
  const t = nowOf(deps);
  readDeployment(req.deployment, deps.deployment);
  const expiresAt = readSignatureExpiry(req.expiresAt, t);
  readChallengeSignature(req.signature);
  await verifyPayerSignature(
    deps,
    payer,
    buildReadPayerRequestsTypedData({
      chainId: deps.chainId,
      market: deps.market,
      message: { payer, deployment: deps.deployment, expiresAt },
    }),
    req.signature,
  );
  return payer.toLowerCase() as Hex;
}

export async function revokeForPayer(
  deps: PermitAuthorizationServiceDeps,
  req: ServiceRequest<"revokeForPayer">,
): Promise<PayerRevocation> {
  const payer = readPayer(req.payer);
  const t = nowOf(deps);
  readDeployment(req.deployment, deps.deployment);
  if (typeof req.keyId !== "string" || (req.keyId !== "" && !apiKeyIdShape.test(req.keyId))) {
    throw new GatewayError(
      "invalid_request",
      'keyId must be an API key id (key_ followed by 24 hex digits), or "" for every key',
    );
  }
  const permitId = readPermitId(req.permitId, false);
  const before = readBefore(req.before, t);
  readChallengeSignature(req.signature);
  await verifyPayerSignature(
    deps,
    payer,
    buildRevokeAuthorizationsTypedData({
      chainId: deps.chainId,
      market: deps.market,
      message: { payer, deployment: deps.deployment, keyId: req.keyId, permitId, before },
    }),
    req.signature,
  );
  // The later of the payer's clock and the gateway's: an AuthorizeKey's issuedAt is the
  // gateway's, so a payer whose clock is behind still revokes what it was shown before now.
  // A replay of the same signature applies to what the first submission did (the store keeps it).
  const proposedBefore = Math.max(before, t);
  const skew = before - t;
  const warning =
    Math.abs(skew) > revokeClockSkewWarningSeconds
      ? `the payer's clock (before ${before}) is ${Math.abs(skew)} seconds ${skew < 0 ? "behind" : "ahead of"} the gateway's (${t}): ` +
        `revoked what was issued at or before ${proposedBefore}`
      : null;
  if (warning !== null)
    deps.warn?.(
      { payer: normalizeHex(payer), before, gatewayNow: t, revokedBefore: proposedBefore },
      "payer revocation: clocks differ",
    );
  const applied = await stored("the authorization store", () =>
    deps.store.revokeByPayer({
      payer: normalizeHex(payer),
      ...(req.keyId === "" ? {} : { apiKeyId: req.keyId }),
      ...(permitId === anyPermit ? {} : { permitId }),
      before: proposedBefore,
      signedBefore: before,
      replayableAfter: t - revokeBeforeMaxAgeSeconds,
      now: t,
    }),
  );
  const { revoked, epoch, revokedBefore } = applied;
  // Refused at once here; other processes learn it from the rows' signals (or their cache
  // time). Every authorization the raised epoch voids is among `revoked`: the store marks them.
  for (const a of revoked) deps.authorities.revoked(a.apiKeyId, a.id);
  return {
    revoked: revoked.length,
    authorizations: revoked.slice(0, payerListMaxLimit),
    epoch,
    revokedBefore,
    warning,
  };
}
