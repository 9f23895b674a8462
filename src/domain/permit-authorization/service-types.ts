/** The authorization service's interface and the types its operations share (service.ts). */
import type { PermitAuthorization } from "./authorizations.js";
import type { Hex } from "viem";
import type { AuthorizeKeyTypedData, RevokeKeyAuthorizationTypedData } from "./typed-data.js";

export interface PermitAuthorizationService {
  createChallenge(req: {
    apiKeyId: string;
    payer: string;
    permitId?: string;
    expiresAt?: number | bigint;
    /** Credits, a decimal string; absent or "0": no cap. */
    totalCap?: string;
    perRequestCap?: string;
    /** "day", "week", "month"; absent or "": no periodic cap (then `periodCap` too). */
    period?: string;
    periodCap?: string;
    /** The soft threshold: credits, a decimal string; absent or "0": none. */
    warnAt?: string;
  }): AuthorizeKeyTypedData;
  authorize(req: {
    apiKeyId: string;
    payer: string;
    permitId: string;
    expiresAt: number | bigint;
    issuedAt: number | bigint;
    /** As signed; absent: this deployment (a signature for another then fails to verify). */
    deployment?: string;
    totalCap?: string;
    perRequestCap?: string;
    period?: string;
    periodCap?: string;
    warnAt?: string;
    nonce: string;
    signature: string;
  }): Promise<PermitAuthorization>;
  list(apiKeyId: string): Promise<PermitAuthorization[]>;
  /** Revocation by the key that holds it. */
  revoke(req: { apiKeyId: string; id: string }): Promise<PermitAuthorization>;
  revocationChallenge(id: string): Promise<RevokeKeyAuthorizationTypedData>;
  /** Revocation on the payer's signature, whoever submits it. */
  revokeBySignature(req: { id: string; signature: string }): Promise<PermitAuthorization>;
  /**
   * Every authorization made for the payer's address (every key's), newest first, on the
   * payer's ListAuthorizations signature: no API key needed. `limit` 1 to
   * `payerListMaxLimit` (checks.ts) (absent or 0: `payerListDefaultLimit`).
   */
  listForPayer(req: {
    payer: string;
    deployment: string;
    expiresAt: number | bigint;
    signature: string;
    limit?: number;
    startingAfter?: string;
  }): Promise<{ authorizations: PermitAuthorization[]; hasMore: boolean }>;
  /**
   * The payer a `ReadPayerRequests` token is signed by (lowercase), once its deployment, expiry
   * and signature are checked: it reads the records of the requests the payer paid with x402.
   */
  payerReader(req: {
    payer: string;
    deployment: string;
    expiresAt: number | bigint;
    signature: string;
  }): Promise<Hex>;
  /** Revocation by key, permit or all on the payer's RevokeAuthorizations signature. */
  revokeForPayer(req: {
    payer: string;
    deployment: string;
    /** "": every key. */
    keyId: string;
    /** "" or all zeros: every authorization. */
    permitId: string;
    before: number | bigint;
    signature: string;
  }): Promise<PayerRevocation>;
}

/** What a payer's RevokeAuthorizations did. */
export interface PayerRevocation {
  /** How many authorizations it revoked (none already revoked are counted). */
  readonly revoked: number;
  /** The revoked authorizations, newest first: the first `payerListMaxLimit` (checks.ts). */
  readonly authorizations: readonly PermitAuthorization[];
  /** The payer's epoch after a revoke all (Unix seconds); null for one by key or permit. */
  readonly epoch: number | null;
  /**
   * What was revoked is what was issued at or before this (Unix seconds): the later of the
   * payer's signed `before` and the gateway's clock. It is also the epoch of the revocation's
   * scope (the payer's, a key's, a permit's): what was signed up to it and is submitted later is
   * refused.
   */
  readonly revokedBefore: number;
  /** Set when the payer's clock and the gateway's differ by more than a few seconds. */
  readonly warning: string | null;
}

/** The request of one of the service's operations. */
export type ServiceRequest<K extends keyof PermitAuthorizationService> = Parameters<
  PermitAuthorizationService[K]
>[0];
