import type pg from "pg";
import type { Hex } from "viem";
import type { EndpointLookup } from "../../domain/chat/ports.js";
import type { EndpointSecret } from "../../domain/health-types.js";
import { openEndpoint } from "../../domain/registration/index.js";
import type { TtlCache } from "../../domain/ttl-cache.js";
import type { Sealer } from "../crypto/sealer.js";
import { getRegisteredEndpoint } from "./endpoint-health.js";

/**
 * The routing's endpoint lookup (src/domain/chat/ports.ts `EndpointLookup`): an offer's
 * registered endpoint, read from the database and opened with the endpoint key, then held in
 * `cache` (ROUTING_CACHE_MS; the composition root clears it when routing changes).
 */
export function createPgEndpointLookup(deps: {
  readonly pool: pg.Pool;
  readonly sealer: Sealer;
  readonly cache: TtlCache<Hex, EndpointSecret>;
}): EndpointLookup {
  const { pool, sealer, cache } = deps;
  const lookup = async (offerId: Hex): Promise<EndpointSecret | undefined> => {
    const registered = await getRegisteredEndpoint(pool, offerId);
    return registered === undefined ? undefined : openEndpoint(sealer, offerId, registered.sealed);
  };
  return async (offerId) => {
    // `undefined` (no endpoint) is not remembered: a registration is picked up at once.
    const hit = cache.get(offerId);
    if (hit !== undefined) return hit;
    const endpoint = await lookup(offerId);
    if (endpoint !== undefined) cache.set(offerId, endpoint);
    return endpoint;
  };
}
