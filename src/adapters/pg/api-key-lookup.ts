import type pg from "pg";
import type { ApiKeyLookup } from "../../domain/api-key-store.js";
import { uncheckedApiKeyHashes } from "./api-keys.js";
import { findApiKeyWithAuthorizations } from "./permit-authorizations.js";

/**
 * The API key store's reads (src/domain/api-key-store.ts `ApiKeyLookup`): a key with its live
 * authorizations in one round trip, and the hashes of the keys issued without a check.
 */
export function createPgApiKeyLookup(pool: pg.Pool): ApiKeyLookup {
  return {
    find: (key, now) => findApiKeyWithAuthorizations(pool, key, now),
    uncheckedKeyHashes: () => uncheckedApiKeyHashes(pool),
  };
}
