/** The storage port of authorizations (implemented in adapters/pg/permit-authorizations.ts). */
import type { Hex } from "viem";
import type { PermitAuthorization } from "./authorizations.js";

/**
 * `revoked`: the payer revoked everything issued at or before a time (its epoch, or the epoch of
 * a scope covering the authorization: its key, its permit) that is at or after the
 * authorization's `issuedAt`; nothing was stored.
 */
export type InsertOutcome = "inserted" | "nonce_used" | "revoked";

/** What a payer's RevokeAuthorizations revokes, as the store applies it. */
export interface PayerRevocationFilter {
  /** Lower-case. */
  readonly payer: Hex;
  /** Only this key's; absent: every key's. */
  readonly apiKeyId?: string;
  /** Only the authorizations naming exactly this permit; absent: every authorization. */
  readonly permitId?: Hex;
  /**
   * Unix seconds: authorizations issued at or before it (the later of the signed `before` and
   * the gateway's clock), unless this signature was applied before (then that time again).
   */
  readonly before: number;
  /** Unix seconds: the `before` the payer signed (default `before`): a replay's key. */
  readonly signedBefore?: number;
  /** Signed `before`s older than this can no longer be submitted: their records are dropped. */
  readonly replayableAfter?: number;
  /** Unix seconds: the revocation's time. */
  readonly now: number;
}

/** The table of authorizations (adapters/pg/permit-authorizations.ts). */
export interface PermitAuthorizationStore {
  /**
   * Stores a new authorization with the nonce and signature it was made with. A nonce is
   * single-use per payer: a second insert with the same (payer, nonce) stores nothing. Nothing is
   * stored either when the payer's epoch is at or after `issuedAt` (`revoked`), read in the
   * statement that stores it so that a concurrent "revoke all" either sees the row or is seen.
   */
  insert(a: PermitAuthorization, proof: { nonce: string; signature: Hex }): Promise<InsertOutcome>;
  get(id: string): Promise<PermitAuthorization | undefined>;
  /** The key's authorizations, newest first. */
  listByKey(apiKeyId: string): Promise<PermitAuthorization[]>;
  /**
   * The payer's authorizations (every key's), newest first: at most `limit`, those made before
   * `startingAfter` (an authorization id of the payer; another: none).
   */
  listByPayer(
    payer: Hex,
    page: { limit: number; startingAfter?: string },
  ): Promise<PermitAuthorization[]>;
  /**
   * Marks revoked by the payer every authorization matching `filter` that is not revoked yet,
   * and answers them newest first. The epoch of the filter's scope is raised to `before` first,
   * in the same transaction (AuthorizeKey signatures issued at or before it are refused when
   * submitted later); the payer's epoch (revoke all: no key, no permit) is answered, null for a
   * scoped revocation.
   */
  revokeByPayer(
    filter: PayerRevocationFilter,
  ): Promise<{ revoked: PermitAuthorization[]; epoch: number | null; revokedBefore: number }>;
  /**
   * Marks it revoked at `now` unless it already is; answers it as it is afterwards, or
   * undefined when there is none (with `apiKeyId`: none held by that key).
   */
  revoke(args: {
    id: string;
    apiKeyId?: string;
    now: number;
    by: "key" | "payer";
  }): Promise<PermitAuthorization | undefined>;
}
