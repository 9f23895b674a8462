import type { Logger } from "pino";
import type { PublicClient } from "viem";
import { createChainOfferReader } from "../adapters/chain/offers.js";
import type { Database } from "../adapters/pg/database.js";
import { createPgEndpointHealthStore } from "../adapters/pg/endpoint-health.js";
import { createPgRegistrationRecorder } from "../adapters/pg/service-stores.js";
import { canonicalEndpointUrl, createEndpointCheck } from "../adapters/upstream/endpoint-guard.js";
import type { UpstreamClient } from "../adapters/upstream/http.js";
import { createEndpointProber } from "../adapters/upstream/probe.js";
import type { Config } from "../config.js";
import { createHealthMonitor } from "../domain/health.js";
import type { TokenCounters } from "../domain/tokens.js";
import { createRegistrationService, openEndpoint } from "../domain/registration/index.js";
import type { Storage } from "./storage.js";

/** Provider onboarding (EIP-712 registration) and the health monitor of registered endpoints. */
export function wireProviders(
  config: Config,
  deps: {
    readonly db: Database;
    readonly storage: Storage;
    readonly chain: PublicClient;
    readonly upstream: UpstreamClient;
    /** The models' token counters verification counts its probes' usage with. */
    readonly counters: TokenCounters;
    readonly clock: () => number;
    readonly logger: Logger;
  },
) {
  const { db, storage, clock } = deps;
  const registration = createRegistrationService({
    chainId: config.chainId,
    market: config.marketAddress,
    offers: createChainOfferReader({ client: deps.chain, market: config.marketAddress }),
    recordRegistration: createPgRegistrationRecorder(db.pool),
    sealer: storage.sealer,
    canonicalizeUrl: canonicalEndpointUrl,
    checkEndpoint: createEndpointCheck({ allowPrivate: config.allowPrivateEndpoints }),
    clock,
    challengeSecret: storage.challengeSecret,
  });
  const health = createHealthMonitor({
    store: createPgEndpointHealthStore(db.pool),
    open: (offerId, sealed) => openEndpoint(storage.sealer, offerId, sealed),
    prober: createEndpointProber(deps.upstream, { counters: deps.counters }),
    intervalMs: config.probeIntervalMs,
    concurrency: config.probeConcurrency,
    staleMs: config.probeStaleMs,
    verifyMinIntervalSeconds: config.verifyMinIntervalSeconds,
    clock,
    logger: deps.logger.child({ component: "health" }),
  });
  return { registration, health };
}
