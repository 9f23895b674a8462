import { randomBytes } from "node:crypto";
import { getAddress, isAddress, type Address, type Hex } from "viem";
import { GatewayError } from "./errors.js";
import { isHex32, normalizeHex } from "./hex.js";
import {
  eip712DomainFields,
  parseRegistrationSignature,
  registrationDomainName,
  registrationDomainVersion,
  type TypedDataField,
} from "./registration.js";
import { verifyParsedSignature, type SignatureVerifier } from "./signatures.js";
import { createTtlCache } from "./ttl-cache.js";
import { noncePattern } from "../schema/signing.js";

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

export const authorizeKeyFields: TypedDataField[] = [
  { name: "payer", type: "address" },
  { name: "keyId", type: "string" },
  { name: "permitId", type: "bytes32" },
  { name: "expiresAt", type: "uint64" },
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
  nonce: string;
};

export type RevokeKeyAuthorizationMessage = {
  payer: Address;
  authorizationId: string;
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
  /** Unix seconds. */
  readonly createdAt: number;
  /** Unix seconds; null while not revoked. */
  readonly revokedAt: number | null;
  readonly revokedBy: "key" | "payer" | null;
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
}

/** Refuses (403 `permit_not_authorized`) a permit the authority does not cover. */
export function requireAuthority(
  authority: SpendingAuthority,
  permit: { permitId: Hex; payer: Hex },
  now: number,
): void {
  if (!authority.allows(permit, now)) {
    throw new GatewayError(
      "permit_not_authorized",
      `the payer of permit ${permit.permitId} has not authorized this API key to spend it ` +
        "(POST /v1/permit-authorizations/challenge, signed by the payer)",
    );
  }
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

  add(a: PermitAuthorization): void {
    const others = (this.byPayer.get(a.payer) ?? []).filter((e) => e.id !== a.id);
    this.byPayer.set(a.payer, [...others, a]);
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

export type InsertOutcome = "inserted" | "nonce_used";

/** The table of authorizations (adapters/pg/permit-authorizations.ts). */
export interface PermitAuthorizationStore {
  /**
   * Stores a new authorization with the nonce and signature it was made with. A nonce is
   * single-use per payer: a second insert with the same (payer, nonce) stores nothing.
   */
  insert(a: PermitAuthorization, proof: { nonce: string; signature: Hex }): Promise<InsertOutcome>;
  get(id: string): Promise<PermitAuthorization | undefined>;
  /** The key's authorizations, newest first. */
  listByKey(apiKeyId: string): Promise<PermitAuthorization[]>;
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
  }): AuthorizeKeyTypedData;
  authorize(req: {
    apiKeyId: string;
    payer: string;
    permitId: string;
    expiresAt: number | bigint;
    nonce: string;
    signature: string;
  }): Promise<PermitAuthorization>;
  list(apiKeyId: string): Promise<PermitAuthorization[]>;
  /** Revocation by the key that holds it. */
  revoke(req: { apiKeyId: string; id: string }): Promise<PermitAuthorization>;
  revocationChallenge(id: string): Promise<RevokeKeyAuthorizationTypedData>;
  /** Revocation on the payer's signature, whoever submits it. */
  revokeBySignature(req: { id: string; signature: string }): Promise<PermitAuthorization>;
}

const authorizationIdShape = /^pauth_[0-9a-f]{24}$/;

export function createPermitAuthorizationService(
  deps: PermitAuthorizationServiceDeps,
): PermitAuthorizationService {
  const now = (): number => Math.floor(deps.clock());

  const verify = async (
    payer: Address,
    typedData: AuthorizeKeyTypedData | RevokeKeyAuthorizationTypedData,
    signatureText: string,
  ): Promise<Hex> => {
    const signature = parseRegistrationSignature(signatureText);
    const valid = await verifyParsedSignature(deps.verifier, payer, signable(typedData), signature);
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
      const expiresAt =
        req.expiresAt === undefined
          ? t + defaultAuthorizationLifetimeSeconds
          : readExpiresAt(req.expiresAt, t);
      return buildAuthorizeKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: {
          payer,
          keyId: req.apiKeyId,
          permitId,
          expiresAt,
          nonce: `0x${randomBytes(32).toString("hex")}`,
        },
      });
    },

    async authorize(req) {
      const payer = readPayer(req.payer);
      const permitId = readPermitId(req.permitId, true);
      const t = now();
      const expiresAt = readExpiresAt(req.expiresAt, t);
      if (typeof req.nonce !== "string" || !noncePattern.test(req.nonce)) {
        throw new GatewayError(
          "invalid_request",
          "nonce must be 1 to 128 printable ASCII characters",
        );
      }
      if (typeof req.signature !== "string" || req.signature === "") {
        throw new GatewayError("invalid_request", "signature is required");
      }
      // The key id is the caller's, never the body's: a signature made for another key does
      // not verify for this one.
      const typedData = buildAuthorizeKeyTypedData({
        chainId: deps.chainId,
        market: deps.market,
        message: { payer, keyId: req.apiKeyId, permitId, expiresAt, nonce: req.nonce },
      });
      const signature = await verify(payer, typedData, req.signature);
      const authorization: PermitAuthorization = {
        id: `pauth_${randomBytes(12).toString("hex")}`,
        apiKeyId: req.apiKeyId,
        payer: normalizeHex(payer),
        permitId,
        expiresAt,
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
      if (typeof req.signature !== "string" || req.signature === "") {
        throw new GatewayError("invalid_request", "signature is required");
      }
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
  };
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
 * A signed request's `expiresAt`: Unix seconds, a safe integer, in the future; 400
 * `invalid_request` otherwise. Permit authorizations and offer key bindings read it alike.
 */
export function readExpiresAt(value: unknown, now: number): number {
  let n = Number.NaN;
  if (typeof value === "number") n = value;
  else if (typeof value === "bigint") n = Number(value);
  if (!Number.isSafeInteger(n)) {
    throw new GatewayError("invalid_request", "expiresAt must be an integer (Unix seconds)");
  }
  if (n <= now) throw new GatewayError("invalid_request", "expiresAt is in the past");
  return n;
}
