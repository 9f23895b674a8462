import { hash } from "node:crypto";
import { carriesCheck, isApiKeyShaped } from "./api-key-check.js";
import type {
  KeyAuthorities,
  PermitAuthorization,
  SpendingAuthority,
} from "./permit-authorization/index.js";
import { createTtlCache } from "./ttl-cache.js";
import { setBounded } from "./bounded-cache.js";

/** What the database answers about API keys (adapters/pg/api-keys.ts, permit-authorizations.ts). */
export interface ApiKeyLookup {
  /**
   * The active key matching `key` with its authorizations still live at `now` (Unix seconds), in
   * one round trip; null when it is unknown or revoked.
   */
  find(
    key: string,
    now: number,
  ): Promise<{ id: string; authorizations: PermitAuthorization[] } | null>;
  /** The SHA-256 (base64) of every active key issued without a check (before migration 029). */
  uncheckedKeyHashes(): Promise<string[]>;
}

/** An API key found, with its spending authority. */
export interface FoundApiKey {
  readonly id: string;
  readonly authority: SpendingAuthority;
}

export interface ApiKeyStore {
  /** The key with its authority; null when it is not an active key of this gateway. */
  find(key: string): Promise<FoundApiKey | null>;
  /**
   * Whether `key` may be an active key of this gateway, answered from memory: one found and
   * held, or one that carries its check (or, issued before the check, whose hash is held) and
   * was not found missing. Anything else is refused by {@link find} without a query.
   */
  plausible(key: string): boolean;
  /** The key (or one of its authorizations) changed in the database: read it afresh. */
  invalidate(apiKeyId: string): void;
  /** Anything may have changed: every key is read afresh, the unchecked keys' hashes too. */
  invalidateAll(): void;
  /** Reads the hashes of the keys issued without a check (start-up, and after `all`). */
  loadUncheckedKeys(): Promise<void>;
  /** Keys held as missing now (tests: bounded by `maxMissing`). */
  readonly missingSize: number;
}

/**
 * API key lookups (docs/decisions/authority-and-signing.md "Unknown keys cost nothing", "Authority across processes").
 *
 * - A key found is remembered for `ttlMs` (API_KEY_CACHE_MS), with its spending authority (held
 *   by `authorities`): a chat request reads memory only. Keyed by the key's SHA-256, as the
 *   database is: no plaintext key is kept in memory longer than a request.
 * - A key is refused without a query when it does not have the shape of a key, when it carries
 *   no valid check under the deployment's secret and is not one of the keys issued before the
 *   check (whose hashes are held), or when it was already looked up and not found (revoked):
 *   the last are remembered, at most `maxMissing` of them, the least recently asked for going
 *   first. So made-up keys cost no query at all, and a revoked key one.
 * - Concurrent lookups of one key share one query.
 * - `invalidate` and `invalidateAll` (the database's signals) drop what is held, so a
 *   revocation or a new authorization made by any process applies here at once; while the
 *   signals cannot be heard, within `ttlMs`.
 */
export function createApiKeyStore(options: {
  /** The deployment's secret the keys' check is made under. */
  readonly secret: Uint8Array;
  readonly lookup: ApiKeyLookup;
  readonly authorities: KeyAuthorities;
  readonly ttlMs: number;
  /** Unix seconds (authorizations expire by it). */
  readonly clock: () => number;
  /** Keys remembered as missing; default 10 000. */
  readonly maxMissing?: number;
  /** Told when the unchecked keys could not be read again (they stay as they were). */
  readonly onLoadError?: (error: unknown) => void;
}): ApiKeyStore {
  const { authorities, lookup } = options;
  const maxMissing = options.maxMissing ?? 10_000;
  const found = createTtlCache<string, string>({ ttlMs: options.ttlMs });
  // Hashes of keys looked up and not found; insertion order is kept fresh (least recent first).
  const missing = new Map<string, true>();
  let unchecked = new Set<string>();
  // Lookups under way, by hash, shared by whoever asks for the same key meanwhile unless a
  // signal came after it started (the database may have changed since it read).
  const pending = new Map<
    string,
    { readonly epoch: number; readonly answer: Promise<FoundApiKey | null> }
  >();
  let epoch = 0;

  const digestOf = (key: string): string => hash("sha256", key, "base64");

  /** Whether a key of the right shape may be one of ours, `digest` its hash. */
  const plausibleDigest = (key: string, digest: string): boolean => {
    if (found.get(digest) !== undefined) return true;
    if (missing.delete(digest)) {
      missing.set(digest, true); // the most recently asked for now
      return false;
    }
    return unchecked.has(digest) || carriesCheck(key, options.secret);
  };

  const read = async (key: string, digest: string): Promise<FoundApiKey | null> => {
    // Marked before the read: a change this process makes while it runs is applied on top.
    const since = authorities.mark();
    const row = await lookup.find(key, options.clock());
    if (row === null) {
      found.delete(digest);
      unchecked.delete(digest);
      setBounded(missing, digest, true, maxMissing);
      return null;
    }
    found.set(digest, row.id);
    return { id: row.id, authority: authorities.load(row.id, row.authorizations, since) };
  };

  let loading: Promise<void> | undefined;
  let loadAgain = false;
  const loadUncheckedKeys = (): Promise<void> => {
    if (loading !== undefined) {
      loadAgain = true;
      return loading;
    }
    loading = (async () => {
      try {
        do {
          loadAgain = false;
          unchecked = new Set(await lookup.uncheckedKeyHashes());
        } while (loadAgain);
      } finally {
        loading = undefined;
      }
    })();
    return loading;
  };

  return {
    async find(key) {
      if (!isApiKeyShaped(key)) return null;
      const digest = digestOf(key);
      const hit = found.get(digest);
      const held = hit === undefined ? undefined : authorities.get(hit);
      if (hit !== undefined && held !== undefined) return { id: hit, authority: held };
      if (hit === undefined && !plausibleDigest(key, digest)) return null;
      const under = pending.get(digest);
      if (under !== undefined && under.epoch === epoch) return under.answer;
      const answer = read(key, digest);
      const entry = { epoch, answer };
      pending.set(digest, entry);
      try {
        return await answer;
      } finally {
        if (pending.get(digest) === entry) pending.delete(digest);
      }
    },
    plausible(key) {
      return isApiKeyShaped(key) && plausibleDigest(key, digestOf(key));
    },
    invalidate(apiKeyId) {
      epoch++;
      authorities.invalidate(apiKeyId);
    },
    invalidateAll() {
      epoch++;
      found.clear();
      missing.clear();
      authorities.invalidateAll();
      loadUncheckedKeys().catch((error: unknown) => options.onLoadError?.(error));
    },
    loadUncheckedKeys,
    get missingSize() {
      return missing.size;
    },
  };
}
