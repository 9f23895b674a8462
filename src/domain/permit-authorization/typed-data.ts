/**
 * The typed data a payer signs about its API keys (issue 28): AuthorizeKey, RevokeKeyAuthorization,
 * ListAuthorizations and RevokeAuthorizations, in the gateway's one EIP-712 domain.
 */
import type { Address, Hex } from "viem";
import {
  eip712DomainFields,
  registrationDomainName,
  registrationDomainVersion,
} from "../registration/typed-data.js";
import type { TypedDataField } from "../signatures.js";

/**
 * The domain's version: registration's (DESIGN.md section 8), one domain for every signature the
 * gateway asks for.
 */
export const authorizationDomainVersion = registrationDomainVersion;

/** `permitId` of an authorization that covers every permit of its payer. */
export const anyPermit = `0x${"00".repeat(32)}` as Hex;

/** An authorization whose challenge names no `expiresAt` lasts this long (DESIGN.md: 30 days). */
export const defaultAuthorizationLifetimeSeconds = 30 * 24 * 3600;

/**
 * The longest an authorization may last unless the operator says otherwise
 * (AUTHORIZATION_MAX_EXPIRY_SECONDS): 90 days.
 */
export const defaultMaxAuthorizationLifetimeSeconds = 90 * 24 * 3600;

/**
 * What a payer signs to let one API key spend (issue 28). Every field is something the payer's
 * own tool can build or check before signing: the key id (derived from the key), the permit, the
 * expiry and the caps (the command's arguments), the deployment (published at GET /v1/gateway,
 * shown before signing); only `nonce` and `issuedAt` come from the gateway's challenge.
 * `totalCap` and `perRequestCap` are credits in the permit's smallest unit, 0 for none; `period`
 * ("day", "week", "month": UTC calendar periods; "" none) and `periodCap` (credits per period, 0
 * none) are the periodic cap (issue 38). Adding fields changes the type hash, as the caps did in
 * issue 28, with no new domain version: the struct's field list is what a signature is over, so a
 * signature of the older list never verifies as the newer one. Rows stored before migration 039
 * keep their proof, which verifies under the field list without `period` and `periodCap`
 * ({@link authorizeKeyFieldsBeforePeriods}); they read as having no periodic cap.
 */
export const authorizeKeyFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "keyId", type: "string" },
  { name: "permitId", type: "bytes32" },
  { name: "expiresAt", type: "uint64" },
  { name: "issuedAt", type: "uint64" },
  { name: "deployment", type: "string" },
  { name: "totalCap", type: "uint256" },
  { name: "perRequestCap", type: "uint256" },
  { name: "period", type: "string" },
  { name: "periodCap", type: "uint256" },
  { name: "warnAt", type: "uint256" },
  { name: "nonce", type: "string" },
];

/** `AuthorizeKey` as signed before issue 38: the proof of an authorization stored before 039. */
export const authorizeKeyFieldsBeforePeriods: readonly TypedDataField[] = authorizeKeyFields.filter(
  (f) => f.name !== "period" && f.name !== "periodCap" && f.name !== "warnAt",
);

/** `AuthorizeKey` as signed before the soft threshold: the proof of a row stored before 041. */
export const authorizeKeyFieldsBeforeWarnAt: readonly TypedDataField[] = authorizeKeyFields.filter(
  (f) => f.name !== "warnAt",
);

/**
 * A payer's revocation names one authorization by id. It needs no nonce or expiry: revoking is
 * final and idempotent, so replaying the signature can only repeat what it already did.
 */
export const revokeKeyAuthorizationFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "authorizationId", type: "string" },
];

/**
 * A payer's read token (issue 28): whoever holds this signature may list every authorization
 * made for the payer's address until `expiresAt`, at most {@link listSignatureMaxLifetimeSeconds}
 * ahead of the gateway's clock. No nonce: it grants a read, and only for a short while.
 */
export const listAuthorizationsFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "deployment", type: "string" },
  { name: "expiresAt", type: "uint64" },
];

/**
 * A payer's read token for the records of the requests it paid itself with x402 (issue 37):
 * `GET /v1/requests/{id}` and its receipt, as `Authorization: Payer ...` (connect/authenticate.ts
 * `payerCredential`). The same shape as `ListAuthorizations` and the same lifetime bound, but a
 * type of its own: a token given to list authorizations reads no request, and this one lists
 * no authorization.
 */
export const readPayerRequestsFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "deployment", type: "string" },
  { name: "expiresAt", type: "uint64" },
];

/**
 * A payer's revocation without the key (issue 28): every authorization of the payer issued at or
 * before `before` whose key is `keyId` ("" any key) and whose permit is `permitId` (zero: any
 * permit, including the authorizations of every permit). With neither (revoke all) it also
 * raises the payer's epoch to `before`: AuthorizeKey signatures issued at or before it are
 * refused when submitted later. No nonce: replaying it revokes nothing issued after `before`.
 */
export const revokeAuthorizationsFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "deployment", type: "string" },
  { name: "keyId", type: "string" },
  { name: "permitId", type: "bytes32" },
  { name: "before", type: "uint64" },
];

/** How far ahead of the gateway's clock a ListAuthorizations signature may expire: 10 minutes. */
export const listSignatureMaxLifetimeSeconds = 600;

/** How far ahead of the gateway's clock a RevokeAuthorizations `before` may be: a minute. */
export const revokeBeforeSkewSeconds = 60;

/**
 * How far behind the gateway's clock a RevokeAuthorizations `before` may be (issue 37): five
 * minutes. The revocation applies up to the later of `before` and the gateway's clock, so an
 * AuthorizeKey the gateway issued by its own clock after the payer's `before` dies too.
 */
export const revokeBeforeMaxAgeSeconds = 300;

/** Clocks further apart than this are warned about when a payer revokes: five seconds. */
export const revokeClockSkewWarningSeconds = 5;

export interface AuthorizationDomain {
  name: string;
  version: string;
  chainId: number;
  verifyingContract: Address;
}

// Type aliases, not interfaces: a message must be assignable to the verifier's record type.
export type AuthorizeKeyMessage = {
  payer: Address;
  keyId: string;
  permitId: Hex;
  /** Unix seconds (a JSON number: wallets read uint64 from numbers, and it is far below 2^53). */
  expiresAt: number;
  /** Unix seconds: when the gateway issued the challenge. */
  issuedAt: number;
  /** The gateway deployment (GET /v1/gateway `deployment`). */
  deployment: string;
  /** Credits, a decimal string (uint256); "0": no cap. */
  totalCap: string;
  /** Credits, a decimal string (uint256); "0": no cap. */
  perRequestCap: string;
  /** "day", "week", "month" (UTC calendar periods); "": no periodic cap. */
  period: string;
  /** Credits per period, a decimal string (uint256); "0": none. */
  periodCap: string;
  /** The soft threshold: credits, a decimal string (uint256); "0": none. */
  warnAt: string;
  nonce: string;
};

export type RevokeKeyAuthorizationMessage = {
  payer: Address;
  authorizationId: string;
};

export type ListAuthorizationsMessage = {
  payer: Address;
  /** The gateway deployment (GET /v1/gateway `deployment`). */
  deployment: string;
  /** Unix seconds. */
  expiresAt: number;
};

export type RevokeAuthorizationsMessage = {
  payer: Address;
  /** The gateway deployment (GET /v1/gateway `deployment`). */
  deployment: string;
  /** An API key's public id (`key_...`); "": every key. */
  keyId: string;
  /** {@link anyPermit}: every permit (and every authorization, whatever permit it names). */
  permitId: Hex;
  /** Unix seconds: what was issued at or before it is revoked. */
  before: number;
};

/** Wallet-ready JSON (`eth_signTypedData_v4` wants `EIP712Domain` listed). */
export interface AuthorizeKeyTypedData {
  types: { EIP712Domain: TypedDataField[]; AuthorizeKey: TypedDataField[] };
  primaryType: "AuthorizeKey";
  domain: AuthorizationDomain;
  message: AuthorizeKeyMessage;
}

export interface RevokeKeyAuthorizationTypedData {
  types: { EIP712Domain: TypedDataField[]; RevokeKeyAuthorization: TypedDataField[] };
  primaryType: "RevokeKeyAuthorization";
  domain: AuthorizationDomain;
  message: RevokeKeyAuthorizationMessage;
}

export interface ListAuthorizationsTypedData {
  types: { EIP712Domain: TypedDataField[]; ListAuthorizations: TypedDataField[] };
  primaryType: "ListAuthorizations";
  domain: AuthorizationDomain;
  message: ListAuthorizationsMessage;
}

export interface ReadPayerRequestsTypedData {
  types: { EIP712Domain: TypedDataField[]; ReadPayerRequests: TypedDataField[] };
  primaryType: "ReadPayerRequests";
  domain: AuthorizationDomain;
  message: ListAuthorizationsMessage;
}

export interface RevokeAuthorizationsTypedData {
  types: { EIP712Domain: TypedDataField[]; RevokeAuthorizations: TypedDataField[] };
  primaryType: "RevokeAuthorizations";
  domain: AuthorizationDomain;
  message: RevokeAuthorizationsMessage;
}

/**
 * The typed data without `EIP712Domain`: what viem's and ethers' `signTypedData` take (ethers
 * refuses an extra `EIP712Domain`), and what the verifier hashes.
 */
export function signable<
  T extends {
    types: { EIP712Domain: TypedDataField[] };
    primaryType: string;
    domain: AuthorizationDomain;
    message: object;
  },
>(
  typedData: T,
): {
  types: Omit<T["types"], "EIP712Domain">;
  primaryType: T["primaryType"];
  domain: AuthorizationDomain;
  message: T["message"];
} {
  const { EIP712Domain: _domain, ...types } = typedData.types;
  return {
    types: types as unknown as Omit<T["types"], "EIP712Domain">,
    primaryType: typedData.primaryType,
    domain: { ...typedData.domain },
    message: { ...typedData.message },
  };
}

/**
 * The one EIP-712 domain of every typed data the gateway asks for or signs (DESIGN.md section 8:
 * registration, permit authorizations, offer key bindings, usage receipts; receipts at their own
 * version, receipts.ts `receiptDomainVersion`): always its own chain
 * and market, never taken from a request, so a signature made for another chain or market is
 * worthless here.
 */
export function gatewaySigningDomain(chainId: number, market: Address): AuthorizationDomain {
  return {
    name: registrationDomainName,
    version: authorizationDomainVersion,
    chainId,
    verifyingContract: market,
  };
}

/**
 * Typed data in the gateway's one domain ({@link gatewaySigningDomain}): the primary type's
 * fields and the message copied, so that no caller can change another's. Every typed data the
 * gateway asks for or signs is built here (registration keeps its own builder, whose domain
 * predates this one).
 */
export function gatewayTypedData<P extends string, M extends object>(
  primaryType: P,
  fields: readonly TypedDataField[],
  at: { readonly chainId: number; readonly market: Address },
  message: M,
): {
  types: { EIP712Domain: TypedDataField[] } & { [K in P]: TypedDataField[] };
  primaryType: P;
  domain: AuthorizationDomain;
  message: M;
} {
  const types = {
    EIP712Domain: eip712DomainFields.map((f) => ({ ...f })),
    [primaryType]: fields.map((f) => ({ ...f })),
  } as { EIP712Domain: TypedDataField[] } & { [K in P]: TypedDataField[] };
  return {
    types,
    primaryType,
    domain: gatewaySigningDomain(at.chainId, at.market),
    message: { ...message },
  };
}

/** The `AuthorizeKey` typed data; the domain is always the gateway's own chain and market. */
export function buildAuthorizeKeyTypedData(args: {
  chainId: number;
  market: Address;
  message: AuthorizeKeyMessage;
}): AuthorizeKeyTypedData {
  return gatewayTypedData("AuthorizeKey", authorizeKeyFields, args, args.message);
}

export function buildRevokeTypedData(args: {
  chainId: number;
  market: Address;
  message: RevokeKeyAuthorizationMessage;
}): RevokeKeyAuthorizationTypedData {
  return gatewayTypedData(
    "RevokeKeyAuthorization",
    revokeKeyAuthorizationFields,
    args,
    args.message,
  );
}

/**
 * The `ListAuthorizations` typed data. The payer's tool builds it from its own arguments (the
 * chain and market it is configured with, the deployment it was shown), and so does the gateway
 * to verify it: there is no challenge.
 */
export function buildListAuthorizationsTypedData(args: {
  chainId: number;
  market: Address;
  message: ListAuthorizationsMessage;
}): ListAuthorizationsTypedData {
  return gatewayTypedData("ListAuthorizations", listAuthorizationsFields, args, args.message);
}

/** The `ReadPayerRequests` typed data; built alike by the payer's tool and the gateway. */
export function buildReadPayerRequestsTypedData(args: {
  chainId: number;
  market: Address;
  message: ListAuthorizationsMessage;
}): ReadPayerRequestsTypedData {
  return gatewayTypedData("ReadPayerRequests", readPayerRequestsFields, args, args.message);
}

/** The `RevokeAuthorizations` typed data; built alike by the payer's tool and the gateway. */
export function buildRevokeAuthorizationsTypedData(args: {
  chainId: number;
  market: Address;
  message: RevokeAuthorizationsMessage;
}): RevokeAuthorizationsTypedData {
  return gatewayTypedData("RevokeAuthorizations", revokeAuthorizationsFields, args, args.message);
}
