/** What an API key may spend, answered in memory: the key-authority cache of the chat path. */
import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { createTtlCache } from "../ttl-cache.js";
import { byCapOrder, covers, type PermitAuthorization } from "./authorizations.js";

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
