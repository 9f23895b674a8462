import { randomBytes } from "node:crypto";
import { getAddress, isAddress, recoverTypedDataAddress, type Address, type Hex } from "viem";
import {
  challengeExpiry,
  newChallengeNonce,
  readChallengeNonce,
  readChallengeSignature,
  readExpiresAt,
  readUnixSeconds,
} from "./challenge-window.js";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";
import {
  eip712DomainFields,
  parseRegistrationSignature,
  registrationDomainName,
  registrationDomainVersion,
} from "./registration.js";
import {
  verifyParsedSignature,
  type SignatureVerifier,
  type TypedDataField,
} from "./signatures.js";
import { createTtlCache } from "./ttl-cache.js";

/**
 * Spending authority (DESIGN.md section 8): a permit is spent only by API keys its payer
 * authorized. The payer signs `AuthorizeKey` typed data naming the key's public id; the gateway
 * verifies the signature against the payer (ECDSA, or ERC-1271 for a contract wallet) and keeps
 * the authorization. Nothing here lets anyone but the payer create one: the gateway operator
 * holds no key that makes an authorization valid.
 */

// ------------------------------------------------------------------------------ typed data

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
 * `totalCap` and `perRequestCap` are credits in the permit's smallest unit, 0 for none.
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
  { name: "nonce", type: "string" },
];

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

/** The `RevokeAuthorizations` typed data; built alike by the payer's tool and the gateway. */
export function buildRevokeAuthorizationsTypedData(args: {
  chainId: number;
  market: Address;
  message: RevokeAuthorizationsMessage;
}): RevokeAuthorizationsTypedData {
  return gatewayTypedData("RevokeAuthorizations", revokeAuthorizationsFields, args, args.message);
}

// ------------------------------------------------------------------------------ authorizations

export type AuthorizationStatus = "active" | "expired" | "revoked";

/** One API key's authority over a payer's permits. Hex values are lower-case. */
export interface PermitAuthorization {
  readonly id: string;
  readonly apiKeyId: string;
  readonly payer: Hex;
  /** {@link anyPermit}: every permit of the payer. */
  readonly permitId: Hex;
  /** Unix seconds. */
  readonly expiresAt: number;
  /** Unix seconds: when the gateway issued the challenge the payer signed. */
  readonly issuedAt: number;
  /** Credits the key may spend through it in all; 0n: no cap. */
  readonly totalCap: bigint;
  /** Credits one request may reserve through it; 0n: no cap. */
  readonly perRequestCap: bigint;
  /** Unix seconds. */
  readonly createdAt: number;
  /** Unix seconds; null while not revoked. */
  readonly revokedAt: number | null;
  readonly revokedBy: "key" | "payer" | null;
  /** What its key has spent through it, where read (listings); absent elsewhere. */
  readonly use?: AuthorizationUse | undefined;
}

/**
 * An authorization's use (issue 28, item 7): every request records the authorization that
 * admitted it. With a total cap, `used + reserved` never exceeds it.
 */
export interface AuthorizationUse {
  /** Credits charged to the requests it admitted that have closed. */
  readonly creditsUsed: bigint;
  /** Credits its open requests hold (their maxima) until they close. */
  readonly creditsReserved: bigint;
  /** Unix seconds (the database's clock): when it last admitted a request; null: never. */
  readonly lastUsedAt: number | null;
}

export function authorizationStatus(a: PermitAuthorization, now: number): AuthorizationStatus {
  if (a.revokedAt !== null) return "revoked";
  return a.expiresAt <= now ? "expired" : "active";
}

/** Whether `a` lets its key spend `permit` at `now`. */
export function covers(
  a: PermitAuthorization,
  permit: { permitId: Hex; payer: Hex },
  now: number,
): boolean {
  return (
    a.revokedAt === null &&
    a.expiresAt > now &&
    a.payer === permit.payer.toLowerCase() &&
    (a.permitId === anyPermit || a.permitId === permit.permitId.toLowerCase())
  );
}

/** What one API key may spend, answered in memory (the chat path asks it on every request). */
export interface SpendingAuthority {
  allows(permit: { permitId: Hex; payer: Hex }, now: number): boolean;
  /**
   * The authorizations that let the key spend `permit` at `now`, in the order a request is
   * admitted through them ({@link byCapOrder}); empty when none does.
   */
  covering(permit: { permitId: Hex; payer: Hex }, now: number): PermitAuthorization[];
}

/**
 * Refuses (403 `permit_not_authorized`) a permit the authority does not cover; answers the
 * authorizations that cover it, in the order a request is admitted through them.
 */
export function requireAuthority(
  authority: SpendingAuthority,
  permit: { permitId: Hex; payer: Hex },
  now: number,
): PermitAuthorization[] {
  const grants = authority.covering(permit, now);
  if (grants.length === 0) {
    throw new GatewayError(
      "permit_not_authorized",
      `the payer of permit ${permit.permitId} has not authorized this API key to spend it ` +
        "(POST /v1/permit-authorizations/challenge, signed by the payer)",
    );
  }
  return grants;
}

// ------------------------------------------------------------------------------ credit caps

/**
 * The order in which a request is admitted through the authorizations that cover its permit
 * (issue 28, item 7): one without any cap first (nothing to check or reserve), then those with
 * only a per-request cap (checked in memory; the largest first), then those with a total cap
 * (the maximum is reserved against the cap, per request; in the order they were made). So a
 * payer's narrow authorization never spends what a wider one of the same key would cover.
 */
export function byCapOrder(a: PermitAuthorization, b: PermitAuthorization): number {
  const rank = (x: PermitAuthorization) => (x.totalCap !== 0n ? 2 : x.perRequestCap !== 0n ? 1 : 0);
  const byRank = rank(a) - rank(b);
  if (byRank !== 0) return byRank;
  if (rank(a) === 1 && a.perRequestCap !== b.perRequestCap)
    return a.perRequestCap > b.perRequestCap ? -1 : 1;
  return a.createdAt - b.createdAt;
}

/** Whether a request whose maximum is `maximum` credits fits `a`'s per-request cap. */
export function fitsPerRequestCap(a: PermitAuthorization, maximum: bigint): boolean {
  return a.perRequestCap === 0n || maximum <= a.perRequestCap;
}

/**
 * The refusal (403 `authorization_per_request_cap_exceeded`) of a request whose maximum fits no
 * covering authorization's per-request cap: it names the largest cap and the request's maximum,
 * so that the client can lower its output limit.
 */
export function perRequestCapRefusal(
  grants: readonly PermitAuthorization[],
  maximum: bigint,
): GatewayError {
  const widest = grants.reduce((w, a) => (a.perRequestCap > w.perRequestCap ? a : w));
  return new GatewayError(
    "authorization_per_request_cap_exceeded",
    `this request's maximum of ${maximum} credits is above the per-request cap of ` +
      `${widest.perRequestCap} credits that the payer set on authorization ${widest.id}; ` +
      "lower max_tokens (or the input), or ask the payer for a wider authorization",
  );
}

/**
 * The refusal (402 `authorization_cap_exhausted`) of a request whose maximum fits what remains
 * of none of the total caps it could be admitted through.
 */
export function totalCapRefusal(a: PermitAuthorization, maximum: bigint): GatewayError {
  return new GatewayError(
    "authorization_cap_exhausted",
    `this request's maximum of ${maximum} credits does not fit what remains of the total cap ` +
      `of ${a.totalCap} credits that the payer set on authorization ${a.id} (what it has used ` +
      "and holds: GET /v1/permit-authorizations)",
  );
}

/**
 * The authorizations of API keys, held in memory for `ttlMs` after they were loaded (with the
 * API key lookup, which the gateway caches for the same time: API_KEY_CACHE_MS). So a chat
 * costs no database round trip for its authority, and a key without any is refused from memory
 * as well (unauthorized traffic cannot force a read per request). A change made by this process
 * is applied to the held set at once; one made by another gateway process (or any writer) on the
 * same database is signalled by the database (migration 029) and {@link invalidate}s what is
 * held, so it applies at once here too; while those signals cannot be heard, within `ttlMs`.
 */
export interface KeyAuthorities {
  /** The held authority of a key, or undefined when it is not held (or held too long). */
  get(apiKeyId: string): SpendingAuthority | undefined;
  /**
   * A mark to take just before asking the database for a key's authorizations, and to give to
   * {@link load}: what this process changed after it is applied to the answer, which may have
   * been read before the change committed.
   */
  mark(): number;
  /**
   * Holds what the database answered for a key (its authorizations still active then), with
   * this process's changes since `since` (from {@link mark}) applied on top.
   */
  load(
    apiKeyId: string,
    authorizations: readonly PermitAuthorization[],
    since: number,
  ): SpendingAuthority;
  /** An authorization this process just stored: effective at once. */
  added(authorization: PermitAuthorization): void;
  /** An authorization this process just revoked: refused at once. */
  revoked(apiKeyId: string, authorizationId: string): void;
  /**
   * The key or its authorizations changed in the database (a signal): what is held of it is
   * dropped, and a load that read the database before now is answered but not held.
   */
  invalidate(apiKeyId: string): void;
  /** {@link invalidate} of every key. */
  invalidateAll(): void;
}

/**
 * One key's live authorizations, by payer: a request's check looks at the authorizations of its
 * permit's payer only, however many payers the key works for.
 */
class HeldAuthority implements SpendingAuthority {
  private readonly byPayer = new Map<string, PermitAuthorization[]>();

  constructor(entries: readonly PermitAuthorization[]) {
    for (const a of entries) this.add(a);
  }

  allows(permit: { permitId: Hex; payer: Hex }, now: number): boolean {
    const entries = this.byPayer.get(permit.payer.toLowerCase());
    if (entries === undefined) return false;
    for (const a of entries) if (covers(a, permit, now)) return true;
    return false;
  }

  covering(permit: { permitId: Hex; payer: Hex }, now: number): PermitAuthorization[] {
    const entries = this.byPayer.get(permit.payer.toLowerCase());
    if (entries === undefined) return [];
    // Kept in byCapOrder (add), so this is a filter.
    return entries.filter((a) => covers(a, permit, now));
  }

  add(a: PermitAuthorization): void {
    const others = (this.byPayer.get(a.payer) ?? []).filter((e) => e.id !== a.id);
    this.byPayer.set(a.payer, [...others, a].sort(byCapOrder));
  }

  remove(id: string): void {
    for (const [payer, entries] of this.byPayer) {
      const kept = entries.filter((e) => e.id !== id);
      if (kept.length === 0) this.byPayer.delete(payer);
      else if (kept.length !== entries.length) this.byPayer.set(payer, kept);
    }
  }
}

/** One change this process made to a key's authorizations, numbered in the order made. */
interface LocalChange {
  readonly seq: number;
  /** Milliseconds (the options' clock), for pruning. */
  readonly at: number;
  readonly add?: PermitAuthorization;
  readonly revoke?: string;
  /** The database said the key changed: a load from before it is not held. */
  readonly invalidate?: true;
}

/**
 * Local changes are kept this long for loads that started before them. A load is one query,
 * bounded by DB_QUERY_TIMEOUT_MS (at most an hour by config; 10 s by default), and its answer is
 * dropped when older than the cache's time anyway; a change older than both cannot matter.
 */
const localChangeKeepMs = 60_000;

export function createKeyAuthorities(options: {
  readonly ttlMs: number;
  readonly maxEntries?: number;
  /** Milliseconds clock (tests inject one). */
  readonly now?: () => number;
}): KeyAuthorities {
  const now = options.now ?? Date.now;
  const held = createTtlCache<string, HeldAuthority>(options);
  // A load that read the database before one of these committed would otherwise bring back an
  // authorization this process just revoked (or drop one it just made) for up to ttlMs.
  const changes = new Map<string, LocalChange[]>();
  let seq = 0;
  // The last {@link KeyAuthorities.invalidateAll}: a load marked before it is not held.
  let allInvalidatedAt = 0;
  const keepMs = Math.max(localChangeKeepMs, options.ttlMs);
  // Pruned at most once a second: signals from the whole fleet are recorded here.
  let prunedAt = Number.NEGATIVE_INFINITY;
  const record = (apiKeyId: string, change: Omit<LocalChange, "seq" | "at">): void => {
    const t = now();
    if (t - prunedAt >= 1000) {
      prunedAt = t;
      for (const [key, list] of changes) {
        const kept = list.filter((c) => t - c.at < keepMs);
        if (kept.length === 0) changes.delete(key);
        else if (kept.length !== list.length) changes.set(key, kept);
      }
    }
    const list = changes.get(apiKeyId) ?? [];
    list.push({ ...change, seq: ++seq, at: t });
    changes.set(apiKeyId, list);
  };
  return {
    get: (apiKeyId) => held.get(apiKeyId),
    mark: () => seq,
    load(apiKeyId, authorizations, since) {
      const authority = new HeldAuthority(authorizations);
      const t = now();
      // A load that read the database before a signal may have missed what it announced.
      let hold = allInvalidatedAt <= since;
      for (const change of changes.get(apiKeyId) ?? []) {
        if (change.seq <= since || t - change.at >= keepMs) continue;
        if (change.add !== undefined) authority.add(change.add);
        if (change.revoke !== undefined) authority.remove(change.revoke);
        if (change.invalidate === true) hold = false;
      }
      if (hold) held.set(apiKeyId, authority);
      return authority;
    },
    added(a) {
      record(a.apiKeyId, { add: a });
      held.get(a.apiKeyId)?.add(a);
    },
    revoked(apiKeyId, id) {
      record(apiKeyId, { revoke: id });
      held.get(apiKeyId)?.remove(id);
    },
    invalidate(apiKeyId) {
      record(apiKeyId, { invalidate: true });
      held.delete(apiKeyId);
    },
    invalidateAll() {
      allInvalidatedAt = ++seq;
      held.clear();
    },
  };
}

// ------------------------------------------------------------------------------ storage port

/**
 * `revoked`: the payer revoked everything issued at or before a time (its epoch) that is at or
 * after the authorization's `issuedAt`; nothing was stored.
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
  /** Unix seconds: authorizations issued at or before it. */
  readonly before: number;
  /** Unix seconds: the revocation's time. */
  readonly now: number;
  /** Also raise the payer's epoch to `before` (never lowers it): revoke all. */
  readonly raiseEpoch: boolean;
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
   * and answers them newest first; with `raiseEpoch` the payer's epoch is raised first, in the
   * same transaction, and answered (null without).
   */
  revokeByPayer(
    filter: PayerRevocationFilter,
  ): Promise<{ revoked: PermitAuthorization[]; epoch: number | null }>;
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

// ------------------------------------------------------------------------------ service

export interface PermitAuthorizationServiceDeps {
  chainId: number;
  market: Address;
  /** This gateway deployment's id (GET /v1/gateway), named in every AuthorizeKey. */
  deployment: string;
  /** The longest an authorization may last, in seconds (AUTHORIZATION_MAX_EXPIRY_SECONDS). */
  maxLifetimeSeconds: number;
  store: PermitAuthorizationStore;
  verifier: SignatureVerifier;
  authorities: KeyAuthorities;
  /** Unix seconds. */
  clock: () => number;
}

export interface PermitAuthorizationService {
  createChallenge(req: {
    apiKeyId: string;
    payer: string;
    permitId?: string;
    expiresAt?: number | bigint;
    /** Credits, a decimal string; absent or "0": no cap. */
    totalCap?: string;
    perRequestCap?: string;
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
   * {@link payerListMaxLimit} (absent or 0: {@link payerListDefaultLimit}).
   */
  listForPayer(req: {
    payer: string;
    deployment: string;
    expiresAt: number | bigint;
    signature: string;
    limit?: number;
    startingAfter?: string;
  }): Promise<{ authorizations: PermitAuthorization[]; hasMore: boolean }>;
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
  /** The revoked authorizations, newest first: the first {@link payerListMaxLimit}. */
  readonly authorizations: readonly PermitAuthorization[];
  /** The payer's epoch after a revoke all (Unix seconds); null for one by key or permit. */
  readonly epoch: number | null;
}

/** A payer's listing: authorizations per page by default, and at most. */
export const payerListDefaultLimit = 50;
export const payerListMaxLimit = 100;

/** An API key's public id (adapters/pg/api-keys.ts makes them). */
const apiKeyIdShape = /^key_[0-9a-f]{24}$/;

const authorizationIdShape = /^pauth_[0-9a-f]{24}$/;

export function createPermitAuthorizationService(
  deps: PermitAuthorizationServiceDeps,
): PermitAuthorizationService {
  const now = (): number => Math.floor(deps.clock());

  const verify = async (
    payer: Address,
    typedData:
      | AuthorizeKeyTypedData
      | RevokeKeyAuthorizationTypedData
      | ListAuthorizationsTypedData
      | RevokeAuthorizationsTypedData,
    signatureText: string,
  ): Promise<Hex> => {
    const signature = parseRegistrationSignature(signatureText);
    const data = signable(typedData);
    // The payer's own key (an account) is answered here, without asking the chain; anything
    // else may be a contract wallet's (ERC-1271), which only the chain can answer.
    const valid =
      (await signedByAccount(payer, data, signature.full)) ||
      (await verifyParsedSignature(deps.verifier, payer, data, signature));
    if (!valid) {
      // Altered fields and a wrong signer look the same to recovery; either way the payer did
      // not sign this.
      throw new GatewayError("invalid_signature", `the signature is not the payer's (${payer})`);
    }
    return signature.compact ?? signature.full;
  };

  const stored = async <T>(what: string, run: () => Promise<T>): Promise<T> => {
    try {
      return await run();
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      throw new GatewayError("database_unavailable", `${what} could not be reached`, {
        cause: err,
      });
    }
  };

  const find = async (id: string): Promise<PermitAuthorization> => {
    const a = authorizationIdShape.test(id)
      ? await stored("the authorization store", () => deps.store.get(id))
      : undefined;
    if (a === undefined) {
      throw new GatewayError(
        "authorization_not_found",
        `authorization ${id.slice(0, 64)} does not exist`,
      );
    }
    return a;
  };

  return {
    createChallenge(req) {
      const payer = readPayer(req.payer);
      const permitId = readPermitId(req.permitId, false);
      const t = now();
      const expiresAt = challengeExpiry(
        req.expiresAt,
        t,
        Math.min(defaultAuthorizationLifetimeSeconds, deps.maxLifetimeSeconds),
        (value) => readAuthorizationExpiry(value, t, t, deps.maxLifetimeSeconds),
      );
      const caps = readCaps(req.totalCap, req.perRequestCap, permitId);
      return buildAuthorizeKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: {
          payer,
          keyId: req.apiKeyId,
          permitId,
          expiresAt,
          issuedAt: t,
          deployment: deps.deployment,
          totalCap: caps.totalCap.toString(),
          perRequestCap: caps.perRequestCap.toString(),
          nonce: newChallengeNonce(),
        },
      });
    },

    async authorize(req) {
      const payer = readPayer(req.payer);
      const permitId = readPermitId(req.permitId, true);
      const t = now();
      if (req.deployment !== undefined && req.deployment !== deps.deployment) {
        throw new GatewayError(
          "wrong_deployment",
          `this authorization was signed for gateway deployment ${String(req.deployment).slice(0, 80)}; ` +
            `this is ${deps.deployment} (GET /v1/gateway)`,
        );
      }
      const issuedAt = readIssuedAt(req.issuedAt, t);
      const expiresAt = readAuthorizationExpiry(
        req.expiresAt,
        t,
        issuedAt,
        deps.maxLifetimeSeconds,
      );
      const caps = readCaps(req.totalCap, req.perRequestCap, permitId);
      readChallengeNonce(req.nonce);
      readChallengeSignature(req.signature);
      // The key id is the caller's, never the body's: a signature made for another key does
      // not verify for this one.
      const typedData = buildAuthorizeKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: {
          payer,
          keyId: req.apiKeyId,
          permitId,
          expiresAt,
          issuedAt,
          deployment: deps.deployment,
          totalCap: caps.totalCap.toString(),
          perRequestCap: caps.perRequestCap.toString(),
          nonce: req.nonce,
        },
      });
      const signature = await verify(payer, typedData, req.signature);
      const authorization: PermitAuthorization = {
        id: `pauth_${randomBytes(12).toString("hex")}`,
        apiKeyId: req.apiKeyId,
        payer: normalizeHex(payer),
        permitId,
        expiresAt,
        issuedAt,
        totalCap: caps.totalCap,
        perRequestCap: caps.perRequestCap,
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
    },

    list: (apiKeyId) => stored("the authorization store", () => deps.store.listByKey(apiKeyId)),

    async revoke(req) {
      const revoked = authorizationIdShape.test(req.id)
        ? await stored("the authorization store", () =>
            deps.store.revoke({ id: req.id, apiKeyId: req.apiKeyId, now: now(), by: "key" }),
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
    },

    async revocationChallenge(id) {
      const a = await find(id);
      return buildRevokeTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: { payer: getAddress(a.payer), authorizationId: a.id },
      });
    },

    async revokeBySignature(req) {
      const a = await find(req.id);
      readChallengeSignature(req.signature);
      const payer = getAddress(a.payer);
      await verify(
        payer,
        buildRevokeTypedData({
          chainId: deps.chainId,
          market: deps.market,
          message: { payer, authorizationId: a.id },
        }),
        req.signature,
      );
      const revoked = await stored("the authorization store", () =>
        deps.store.revoke({ id: a.id, now: now(), by: "payer" }),
      );
      if (revoked === undefined) throw new Error(`authorization ${a.id} vanished`);
      deps.authorities.revoked(revoked.apiKeyId, revoked.id);
      return revoked;
    },

    async listForPayer(req) {
      // Every check that costs nothing comes before the signature's.
      const payer = readPayer(req.payer);
      const t = now();
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
      await verify(
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
    },

    async revokeForPayer(req) {
      const payer = readPayer(req.payer);
      const t = now();
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
      await verify(
        payer,
        buildRevokeAuthorizationsTypedData({
          chainId: deps.chainId,
          market: deps.market,
          message: { payer, deployment: deps.deployment, keyId: req.keyId, permitId, before },
        }),
        req.signature,
      );
      const all = req.keyId === "" && permitId === anyPermit;
      const { revoked, epoch } = await stored("the authorization store", () =>
        deps.store.revokeByPayer({
          payer: normalizeHex(payer),
          ...(req.keyId === "" ? {} : { apiKeyId: req.keyId }),
          ...(permitId === anyPermit ? {} : { permitId }),
          before,
          now: t,
          raiseEpoch: all,
        }),
      );
      // Refused at once here; other processes learn it from the rows' signals (or their cache
      // time). Every authorization the epoch voids is among `revoked`: the store marks them all.
      for (const a of revoked) deps.authorities.revoked(a.apiKeyId, a.id);
      return {
        revoked: revoked.length,
        authorizations: revoked.slice(0, payerListMaxLimit),
        epoch,
      };
    },
  };
}

/** Whether `address`'s own key (an account's, ECDSA) made `signature` over `typedData`. */
async function signedByAccount(
  address: Address,
  typedData: ReturnType<typeof signable>,
  signature: Hex,
): Promise<boolean> {
  try {
    const signer = await recoverTypedDataAddress({
      ...(typedData as unknown as Parameters<typeof recoverTypedDataAddress>[0]),
      signature,
    });
    return signer.toLowerCase() === address.toLowerCase();
  } catch {
    return false;
  }
}

/** The deployment a payer signed for: this one, else 403 `wrong_deployment`. */
function readDeployment(value: unknown, deployment: string): void {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError(
      "invalid_request",
      "deployment is required: the gateway deployment signed for (GET /v1/gateway)",
    );
  }
  if (value !== deployment) {
    throw new GatewayError(
      "wrong_deployment",
      `this signature was made for gateway deployment ${value.slice(0, 80)}; ` +
        `this is ${deployment} (GET /v1/gateway)`,
    );
  }
}

/** A ListAuthorizations `expiresAt`: in the future, at most 10 minutes ahead. */
function readSignatureExpiry(value: unknown, now: number): number {
  const n = readUnixSeconds(value, "expiresAt");
  if (n <= now) {
    throw new GatewayError(
      "signature_expired",
      `this signature expired at ${n} (the gateway's clock says ${now}): sign a new one`,
    );
  }
  if (n > now + listSignatureMaxLifetimeSeconds) {
    throw new GatewayError(
      "invalid_request",
      `expiresAt may be at most ${listSignatureMaxLifetimeSeconds} seconds ahead (${now + listSignatureMaxLifetimeSeconds})`,
    );
  }
  return n;
}

/** A RevokeAuthorizations `before`: at most a minute ahead of the gateway's clock. */
function readBefore(value: unknown, now: number): number {
  const n = readUnixSeconds(value, "before");
  if (n <= 0) throw new GatewayError("invalid_request", "before must be positive (Unix seconds)");
  if (n > now + revokeBeforeSkewSeconds) {
    throw new GatewayError(
      "invalid_request",
      `before may be at most ${revokeBeforeSkewSeconds} seconds ahead of the gateway's clock (${now})`,
    );
  }
  return n;
}

function readLimit(value: number | undefined): number {
  if (value === undefined || value === 0) return payerListDefaultLimit;
  if (!Number.isInteger(value) || value < 1 || value > payerListMaxLimit) {
    throw new GatewayError(
      "invalid_request",
      `limit must be an integer from 1 to ${payerListMaxLimit}`,
    );
  }
  return value;
}

function readPayer(value: unknown): Address {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError("invalid_request", "payer is required");
  }
  if (!isAddress(value, { strict: false })) {
    throw new GatewayError(
      "invalid_hex",
      "payer must be an address (0x followed by 40 hex digits)",
    );
  }
  return getAddress(value);
}

function readPermitId(value: unknown, required: boolean): Hex {
  if (value === undefined || value === null || value === "") {
    if (required) throw new GatewayError("invalid_request", "permitId is required");
    return anyPermit;
  }
  if (typeof value !== "string" || !isHex32(value)) {
    throw new GatewayError(
      "invalid_hex",
      "permitId must be a Hex32 (0x followed by 64 hex digits)",
    );
  }
  return normalizeHex(value);
}

/**
 * How far in the future a challenge's `issuedAt` may be (clocks of gateway processes differ by
 * a little), and how old it may be when submitted: a challenge is answered in minutes, and an
 * old unsubmitted signature is a liability to its payer.
 */
export const issuedAtSkewSeconds = 60;
export const challengeMaxAgeSeconds = 24 * 3600;

function readIssuedAt(value: unknown, now: number): number {
  let n = Number.NaN;
  if (typeof value === "number") n = value;
  else if (typeof value === "bigint") n = Number(value);
  if (!Number.isSafeInteger(n) || n <= 0) {
    throw new GatewayError(
      "invalid_request",
      "issuedAt must be the challenge's issuedAt (Unix seconds)",
    );
  }
  if (n > now + issuedAtSkewSeconds) {
    throw new GatewayError("invalid_request", "issuedAt is in the future");
  }
  if (n < now - challengeMaxAgeSeconds) {
    throw new GatewayError(
      "challenge_expired",
      `this challenge was issued more than ${challengeMaxAgeSeconds / 3600} hours ago: ask for a new one`,
    );
  }
  return n;
}

/**
 * An authorization's expiry: in the future, and at most `maxLifetime` seconds after it was
 * issued (400 `authorization_expiry_too_far` otherwise, naming the cap).
 */
export function readAuthorizationExpiry(
  value: unknown,
  now: number,
  issuedAt: number,
  maxLifetime: number,
): number {
  const expiresAt = readExpiresAt(value, now);
  if (expiresAt > issuedAt + maxLifetime) {
    throw new GatewayError(
      "authorization_expiry_too_far",
      `expiresAt may be at most ${maxLifetime} seconds after the challenge (${issuedAt + maxLifetime}); ` +
        "this gateway's AUTHORIZATION_MAX_EXPIRY_SECONDS",
    );
  }
  return expiresAt;
}

const uint256Max = (1n << 256n) - 1n;

function readCredits(value: unknown, name: string): bigint {
  if (value === undefined || value === null || value === "") return 0n;
  if (typeof value !== "string" || !/^(0|[1-9][0-9]{0,77})$/.test(value)) {
    throw new GatewayError(
      "invalid_request",
      `${name} must be a decimal string of credits (the permit's smallest unit; "0": no cap)`,
    );
  }
  const n = BigInt(value);
  if (n > uint256Max) throw new GatewayError("invalid_request", `${name} is above 2^256 - 1`);
  return n;
}

/**
 * An authorization's caps (issue 28, item 7): credits in the permit's smallest unit, 0 for none.
 * A cap names one permit, whose token is its unit; a per-request cap above the total is the total.
 */
export function readCaps(
  totalValue: unknown,
  perRequestValue: unknown,
  permitId: Hex,
): { totalCap: bigint; perRequestCap: bigint } {
  const totalCap = readCredits(totalValue, "totalCap");
  const perRequestCap = readCredits(perRequestValue, "perRequestCap");
  if ((totalCap !== 0n || perRequestCap !== 0n) && permitId === anyPermit) {
    throw new GatewayError(
      "authorization_cap_invalid",
      "a credit cap needs one permit (permitId): its token is the cap's unit",
    );
  }
  if (totalCap !== 0n && perRequestCap > totalCap) {
    throw new GatewayError("authorization_cap_invalid", "perRequestCap is above totalCap");
  }
  return { totalCap, perRequestCap };
}
