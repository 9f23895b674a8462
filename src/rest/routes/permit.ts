import {
  PermitAuthorizationStatusSchema,
  PermitService,
} from "../../../gen/gateway/v1/permit_pb.js";
import { payerRequestMaxBytes } from "../../connect/routes.js";
import { enumWords } from "../views/proto-view.js";
import {
  PayerAuthorizationList,
  PayerRevocation,
  PermitAuthorizationEnvelope,
  PermitAuthorizationList,
  permitAuthorizationResource,
} from "../views/resources.js";
import {
  AuthorizationChallengeRequest,
  AuthorizeKeyRequest,
  AuthorizeKeyTypedData,
  ListPayerAuthorizationsRequest,
  RevokeBySignatureRequest,
  RevokeKeyAuthorizationTypedData,
  RevokePayerAuthorizationsRequest,
} from "../../schema/signing.js";
import { statusFilter } from "../document.js";
import type { Parameter } from "../route-spec.js";
import { seconds, statusOf, typedDataAnswer, withBody, type Route } from "../route-kit.js";
import { authorizeKeyTypedDataView, revokeTypedDataView } from "../views/challenges.js";

/** The PermitService routes: a payer's authorizations of API keys and their revocation. */

const authorizationId = { description: "authorization id (`pauth_...`)" };

const payerParameter: Parameter = {
  name: "payer",
  in: "path",
  required: true,
  description: "the payer's address (0x + 40 hex digits)",
  schema: { type: "string" },
};

export const permitRoutes: readonly Route[] = [
  withBody(AuthorizationChallengeRequest, {
    method: "POST",
    path: "/v1/permit-authorizations/challenge",
    operationId: "createAuthorizationChallenge",
    summary: "EIP-712 AuthorizeKey typed data for a payer to sign for the calling API key",
    description:
      "The calling key's public id is filled in as `keyId`, with a random single-use nonce. `permitId` absent or all zeros: every permit of the payer.",
    tag: "permits",
    answer: typedDataAnswer(AuthorizeKeyTypedData),
    errors: { 400: ["invalid_hex", "authorization_expiry_too_far", "authorization_cap_invalid"] },
    handle: async ({ unary, body }) => {
      const { typedData } = await unary(PermitService.method.createAuthorizationChallenge, {
        payer: body.payer,
        permitId: body.permitId ?? "",
        expiresAt: seconds(body.expiresAt),
        totalCap: body.totalCap ?? "",
        perRequestCap: body.perRequestCap ?? "",
        period: body.period ?? "",
        periodCap: body.periodCap ?? "",
        warnAt: body.warnAt ?? "",
      });
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: authorizeKeyTypedDataView(typedData) };
    },
  }),
  withBody(AuthorizeKeyRequest, {
    method: "POST",
    path: "/v1/permit-authorizations",
    operationId: "authorizeKey",
    summary: "Store a payer's signed AuthorizeKey for the calling API key",
    description:
      "Verified against the payer (ECDSA, or ERC-1271 for a contract wallet); the nonce is consumed atomically. Refused 403 authorization_revoked when the payer has since revoked everything it signed up to a time at or after its issuedAt (POST /v1/payers/{payer}/authorizations/revoke). Effective at once on every gateway sharing its database (within API_KEY_CACHE_MS on one that cannot hear the database's signals: gateway_authority_listener_up 0).",
    tag: "permits",
    answer: { description: "The authorization", schema: PermitAuthorizationEnvelope },
    errors: {
      400: ["invalid_hex", "authorization_expiry_too_far", "authorization_cap_invalid"],
      401: ["invalid_signature"],
      403: ["wrong_deployment", "authorization_revoked"],
      409: ["nonce_used", "challenge_expired"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, body }) => {
      const { authorization } = await unary(PermitService.method.authorizeKey, {
        payer: body.payer,
        permitId: body.permitId,
        expiresAt: BigInt(body.expiresAt),
        issuedAt: BigInt(body.issuedAt),
        deployment: body.deployment ?? "",
        totalCap: body.totalCap ?? "",
        perRequestCap: body.perRequestCap ?? "",
        period: body.period ?? "",
        periodCap: body.periodCap ?? "",
        warnAt: body.warnAt ?? "",
        nonce: body.nonce,
        signature: body.signature,
      });
      if (authorization === undefined) throw new Error("AuthorizeKey answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  }),
  {
    method: "GET",
    path: "/v1/permit-authorizations",
    operationId: "listAuthorizations",
    summary: "The authorizations the calling API key holds, newest first",
    tag: "permits",
    parameters: [statusFilter(enumWords(PermitAuthorizationStatusSchema))],
    answer: { description: "The authorizations", schema: PermitAuthorizationList },
    errors: { 400: ["invalid_request"] },
    handle: async ({ unary, query }) => {
      const { authorizations } = await unary(PermitService.method.listAuthorizations, {
        status: statusOf(PermitAuthorizationStatusSchema, query),
      });
      return {
        body: { object: "list", data: authorizations.map(permitAuthorizationResource.view) },
      };
    },
  },
  {
    method: "DELETE",
    path: "/v1/permit-authorizations/{id}",
    operationId: "revokeAuthorization",
    summary: "Revoke an authorization the calling API key holds",
    description:
      "Refused at once on every gateway sharing its database (within API_KEY_CACHE_MS on one that cannot hear the database's signals). Revoking again answers it unchanged.",
    tag: "permits",
    pathId: authorizationId,
    answer: { description: "The authorization, revoked", schema: PermitAuthorizationEnvelope },
    errors: { 404: ["authorization_not_found"] },
    handle: async ({ unary, params, req }) => {
      req.resume(); // a DELETE takes no body
      const { authorization } = await unary(PermitService.method.revokeAuthorization, {
        id: params[0],
      });
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  },
  {
    method: "POST",
    path: "/v1/permit-authorizations/{id}/revocation-challenge",
    operationId: "createRevocationChallenge",
    summary: "EIP-712 RevokeKeyAuthorization typed data for the payer to sign (no body)",
    tag: "permits",
    pathId: authorizationId,
    answer: typedDataAnswer(RevokeKeyAuthorizationTypedData),
    errors: { 404: ["authorization_not_found"] },
    handle: async ({ unary, params, req }) => {
      req.resume(); // the typed data is fixed by the authorization: no body
      const { typedData } = await unary(PermitService.method.createRevocationChallenge, {
        id: params[0],
      });
      if (typedData === undefined) throw new Error("challenge answered without typed data");
      return { body: revokeTypedDataView(typedData) };
    },
  },
  withBody(RevokeBySignatureRequest, {
    method: "POST",
    path: "/v1/permit-authorizations/{id}/revoke",
    operationId: "revokeAuthorizationBySignature",
    summary: "Revoke an authorization with the payer's signature (any API key may submit it)",
    tag: "permits",
    pathId: authorizationId,
    answer: { description: "The authorization, revoked", schema: PermitAuthorizationEnvelope },
    errors: {
      401: ["invalid_signature"],
      404: ["authorization_not_found"],
      503: ["chain_unavailable"],
    },
    handle: async ({ unary, params, body }) => {
      const { authorization } = await unary(PermitService.method.revokeAuthorizationBySignature, {
        id: params[0],
        signature: body.signature,
      });
      if (authorization === undefined) throw new Error("revocation answered without one");
      return { body: { authorization: permitAuthorizationResource.view(authorization) } };
    },
  }),
  withBody(ListPayerAuthorizationsRequest, {
    method: "POST",
    path: "/v1/payers/{payer}/authorizations",
    operationId: "listPayerAuthorizations",
    summary:
      "Every authorization made for a payer's address, on the payer's signature (no API key)",
    description: [
      "Whichever key holds them, newest first, revoked and expired ones included. The credential is",
      "the payer's EIP-712 signature over `ListAuthorizations(address payer, string deployment,",
      "uint64 expiresAt)` in the gateway's domain, which the payer's tool builds itself (there is no",
      "challenge): a read token usable by whoever holds it until `expiresAt`, at most 10 minutes",
      "ahead. Pages: `limit` (1 to 100, default 50) and `startingAfter` (the last id of the previous",
      "page); `has_more` says whether another page follows. Bodies above 4096 bytes are refused.",
    ].join("\n"),
    tag: "permits",
    auth: "none",
    pathParams: [payerParameter],
    bodyLimitBytes: payerRequestMaxBytes,
    answer: { description: "The payer's authorizations", schema: PayerAuthorizationList },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature", "signature_expired"],
      403: ["wrong_deployment"],
      503: ["chain_unavailable", "database_unavailable"],
    },
    handle: async ({ unary, params, body }) => {
      const { authorizations, hasMore } = await unary(
        PermitService.method.listPayerAuthorizations,
        {
          payer: params[0],
          deployment: body.deployment,
          expiresAt: BigInt(body.expiresAt),
          signature: body.signature,
          limit: body.limit ?? 0,
          startingAfter: body.startingAfter ?? "",
        },
      );
      return {
        body: {
          object: "list",
          data: authorizations.map(permitAuthorizationResource.view),
          has_more: hasMore,
        },
      };
    },
  }),
  withBody(RevokePayerAuthorizationsRequest, {
    method: "POST",
    path: "/v1/payers/{payer}/authorizations/revoke",
    operationId: "revokePayerAuthorizations",
    summary:
      "Revoke a payer's authorizations by key, by permit or all, on its signature (no API key)",
    description: [
      "The payer's EIP-712 signature over `RevokeAuthorizations(address payer, string deployment,",
      "string keyId, bytes32 permitId, uint64 before)` in the gateway's domain, built by the payer's",
      "tool (no challenge): revokes every authorization of the payer issued at or before the later",
      "of `before` (at most a minute ahead of the gateway's clock, at most 5 minutes behind it:",
      "401 `signature_expired`) and the gateway's clock (`revoked_before`; `warning` when the clocks",
      "differ by more than 5 seconds) of the key `keyId` (empty: any) naming the permit `permitId`",
      "(zero: any). The epoch of that scope (the key, the permit, both, or the payer's: revoke all)",
      "is raised to it: an `AuthorizeKey` of the scope issued at or before it, signed but not yet",
      "submitted, is refused 403 `authorization_revoked` when submitted. A replay applies up to what",
      "its first submission did: it revokes nothing issued since. Refused at once on this gateway. Bodies above",
      "4096 bytes are refused.",
    ].join("\n"),
    tag: "permits",
    auth: "none",
    pathParams: [payerParameter],
    bodyLimitBytes: payerRequestMaxBytes,
    answer: { description: "What was revoked", schema: PayerRevocation },
    errors: {
      400: ["invalid_hex"],
      401: ["invalid_signature", "signature_expired"],
      403: ["wrong_deployment"],
      503: ["chain_unavailable", "database_unavailable"],
    },
    handle: async ({ unary, params, body }) => {
      const outcome = await unary(PermitService.method.revokePayerAuthorizations, {
        payer: params[0],
        deployment: body.deployment,
        keyId: body.keyId ?? "",
        permitId: body.permitId ?? "",
        before: BigInt(body.before),
        signature: body.signature,
      });
      return {
        body: {
          object: "payer_revocation",
          revoked: Number(outcome.revoked),
          authorizations: outcome.authorizations.map(permitAuthorizationResource.view),
          epoch: outcome.epoch === undefined ? null : Number(outcome.epoch),
          revoked_before: Number(outcome.revokedBefore),
          warning: outcome.warning ?? null,
        },
      };
    },
  }),
];
