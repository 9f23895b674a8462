import type { TokenCounters } from "../domain/tokens.js";
import type { Logger } from "pino";
import type { Hex, PublicClient } from "viem";
import { x402Active } from "./x402.js";
import { privateKeyToAccount } from "viem/accounts";
import { createReceiptSigner } from "../adapters/crypto/receipt-signer.js";
import { createChainSignatureVerifier } from "../adapters/chain/signatures.js";
import type { ChainPermitReader } from "../adapters/chain/permits.js";
import { createPgApiKeyLookup } from "../adapters/pg/api-key-lookup.js";
import { apiKeyCheckSecret } from "../adapters/pg/api-keys.js";
import { createPgAuthoritySignals } from "../adapters/pg/authority-signals.js";
import type { Database } from "../adapters/pg/database.js";
import { createPgPermitAuthorizationStore } from "../adapters/pg/permit-authorizations.js";
import { createPgServiceReads } from "../adapters/pg/service-stores.js";
import { createChainOfferReader } from "../adapters/chain/offers.js";
import { createPgEarningsStore } from "../adapters/pg/earnings.js";
import { createPgOfferKeyBindingStore } from "../adapters/pg/offer-key-bindings.js";
import { createOfferEarningsService } from "../domain/offer-earnings.js";
import { createOfferKeyBindingService } from "../domain/offer-key-binding.js";
import type { Config } from "../config.js";
import { auditCorpusSource } from "../config/audits.js";
import { createCatalogService } from "../connect/catalog-service.js";
import { createGatewayService } from "../connect/gateway-service.js";
import { createInferenceService } from "../connect/inference-service.js";
import { createPermitService } from "../connect/permit-service.js";
import { createProviderService } from "../connect/provider-service.js";
import { createQuoteService } from "../connect/quote-service.js";
import { createAuditService } from "../connect/audit-service.js";
import { createPgAuditStandingStore } from "../adapters/pg/audits.js";
import type { AuditStandings } from "../domain/audits/standing.js";
import { createSettlementService } from "../connect/settlement-service.js";
import type { Catalog } from "../domain/catalog.js";
import type { Inference } from "../domain/chat/index.js";
import type { HealthMonitor } from "../domain/health-types.js";
import { createApiKeyStore, type ApiKeyStore } from "../domain/api-key-store.js";
import {
  createKeyAuthorities,
  createPermitAuthorizationService,
  type KeyAuthorities,
} from "../domain/permit-authorization/index.js";
import type { RegistrationService } from "../domain/registration/index.js";
import type { Reputation } from "../domain/reputation/reputation.js";
import type { OfferCooldowns } from "../domain/reputation/cooldowns.js";
import type { createMetrics } from "../runtime/metrics.js";
import { createPgRateLimitStore } from "../adapters/pg/rate-limits.js";
import { createFleetRateLimiter, type RateLimiter } from "../domain/rate-limit.js";
import { createFailureBudget } from "../domain/failure-budget.js";
import type { Readiness } from "../rest/route-kit.js";
import { createGatewayHandler } from "../server.js";
import type { Settlement } from "./settlement.js";

/**
 * Per-API-key limits across the whole fleet, the database the arbiter (docs/decisions/errors-and-rate-limits.md,
 * "Rate limits"); while it fails, each process enforces the whole limit alone.
 */
export function wireRateLimiter(
  config: Config,
  deps: { readonly db: Database; readonly instanceId: string; readonly logger: Logger },
) {
  if (config.gatewayReplicasIgnored) {
    deps.logger.warn(
      "GATEWAY_REPLICAS is deprecated and ignored: the rate limits are fleet-wide through the database",
    );
  }
  return createFleetRateLimiter({
    rps: config.rateLimitRps,
    burst: config.rateLimitBurst,
    maxStreams: config.maxStreamsPerKey,
    streamTtlMs: config.rateLimitStreamTtlMs,
    store: createPgRateLimitStore(deps.db.pool, deps.instanceId),
    onFallback: (error) =>
      deps.logger.warn(
        { err: error instanceof Error ? error.message : String(error) },
        "rate limit store unavailable: this process enforces the whole limits alone",
      ),
  });
}

/** The API keys, their spending authority, and the database's signals that keep them current. */
export interface ApiKeyWiring {
  readonly authorities: KeyAuthorities;
  readonly keys: ApiKeyStore;
  /** Stops listening (shutdown). */
  close(): Promise<void>;
}

/**
 * API key lookups and the spending authority held with them (DESIGN.md section 8; docs/
 * decisions/authority-and-signing.md "Unknown keys cost nothing", "Authority across processes"). The deployment's
 * check secret and the hashes of keys issued before it are read once here. On PostgreSQL one
 * connection listens to the database's authority signals (migration 029), so a change made by
 * any process applies here at once; the embedded PGlite serves one connection and one process,
 * which applies its own changes at once: there the listener gauge stays 0.
 */
export async function wireApiKeys(
  config: Config,
  deps: {
    readonly db: Database;
    readonly clock: () => number;
    readonly metrics: ReturnType<typeof createMetrics>;
    readonly logger: Logger;
  },
): Promise<ApiKeyWiring> {
  const { db, logger } = deps;
  const authorities = createKeyAuthorities({ ttlMs: config.apiKeyCacheMs });
  const keys = createApiKeyStore({
    secret: await apiKeyCheckSecret(db.pool),
    lookup: createPgApiKeyLookup(db.pool),
    authorities,
    ttlMs: config.apiKeyCacheMs,
    clock: deps.clock,
    onLoadError: (error) =>
      logger.warn(
        { err: error instanceof Error ? error.message : String(error) },
        "API keys issued without a check could not be read again; the ones held stay",
      ),
  });
  await keys.loadUncheckedKeys();
  if (db.kind !== "postgres") return { authorities, keys, close: async () => undefined };
  const signals = createPgAuthoritySignals(db, {
    onSignal: (signal) => (signal === "all" ? keys.invalidateAll() : keys.invalidate(signal.key)),
    onState: (up) => deps.metrics.authorityListener(up),
    logger: logger.child({ component: "authority" }),
  });
  await signals.ready();
  return { authorities, keys, close: () => signals.close() };
}

/** What the API is made of (createApi). */
export interface ApiDeps {
  readonly db: Database;
  readonly deploymentId: string;
  readonly chain: PublicClient;
  readonly catalog: Catalog;
  /** What the catalog (and quotes) show of each offer beside the chain's record, from memory. */
  readonly offerViews: {
    readonly reputation: (offerId: Hex) => Reputation;
    /** Offers cooling down (the catalog shows when each one's cooldown ends). */
    readonly cooldowns?: Pick<OfferCooldowns, "until"> | undefined;
    /** The offers' audit standings (the catalog and quotes show each offer's). */
    readonly standings?: Pick<AuditStandings, "get"> | undefined;
  };
  readonly permits: ChainPermitReader;
  readonly permitClock: () => number;
  readonly inference: Inference;
  readonly registration: RegistrationService;
  readonly health: HealthMonitor;
  readonly tokens: TokenCounters;
  readonly settlement: Settlement;
  readonly invalidateRouting: () => void;
  readonly rateLimiter: RateLimiter;
  readonly apiKeys: ApiKeyWiring;
  readonly readiness: () => Promise<Readiness>;
  readonly clock: () => number;
  readonly metrics: ReturnType<typeof createMetrics>;
  readonly shutdown: AbortSignal;
  readonly logger: Logger;
}

/** The RPC services, and the one handler that serves them over Connect, gRPC and REST. */
export function createApi(config: Config, deps: ApiDeps) {
  const { db, clock } = deps;
  // Spending authority (DESIGN.md section 8): held per API key with the key itself.
  const { authorities, keys } = deps.apiKeys;
  const permitAuthorizations = createPermitAuthorizationService({
    chainId: config.chainId,
    market: config.marketAddress,
    deployment: deps.deploymentId,
    maxLifetimeSeconds: config.authorizationMaxExpirySeconds,
    store: createPgPermitAuthorizationStore(db.pool),
    verifier: createChainSignatureVerifier(deps.chain),
    authorities,
    clock,
    warn: (fields, message) => deps.logger.warn(fields, message),
  });
  // Provider earnings: who may read them is bound by the offer's operator (docs/decisions/settlement.md).
  const keyBindingStore = createPgOfferKeyBindingStore(db.pool);
  const offers = createChainOfferReader({ client: deps.chain, market: config.marketAddress });
  const keyBindings = createOfferKeyBindingService({
    chainId: config.chainId,
    market: config.marketAddress,
    deployment: deps.deploymentId,
    operatorOf: async (offerId) => (await offers.getOffer(offerId))?.operator,
    store: keyBindingStore,
    verifier: createChainSignatureVerifier(deps.chain),
    clock,
  });
  const earnings = createOfferEarningsService({
    catalog: deps.catalog,
    bindings: keyBindingStore,
    store: createPgEarningsStore(db.pool),
    clock,
  });
  const reads = createPgServiceReads(db.pool);
  // Usage receipts (docs/decisions/settlement.md, "Usage receipts"): signed on request, off the chat path.
  const receiptSigner =
    config.receiptPrivateKey === undefined
      ? undefined
      : createReceiptSigner(config.receiptPrivateKey);
  return createGatewayHandler({
    services: {
      catalog: createCatalogService(
        deps.catalog,
        deps.offerViews.reputation,
        deps.offerViews.cooldowns,
        deps.offerViews.standings,
      ),
      gateway: createGatewayService({
        deployment: deps.deploymentId,
        chainId: config.chainId,
        market: config.marketAddress,
        settlementAccount:
          config.settlementPrivateKey === undefined
            ? undefined
            : privateKeyToAccount(config.settlementPrivateKey).address,
        receiptSigner: receiptSigner?.address,
        auditCorpus: auditCorpusSource(config.audits),
      }),
      quote: createQuoteService(deps.inference, deps.offerViews.standings),
      audit: createAuditService(createPgAuditStandingStore(db.pool)),
      inference: createInferenceService({
        inference: deps.inference,
        findRequest: reads.findRequest,
        permits: deps.permits,
        permitLedger: reads.permitLedger,
        clock,
        permitClock: deps.permitClock,
        activity: {
          listRequests: reads.listRequests,
          usage: reads.usage,
          authorizations: (apiKeyId) => permitAuthorizations.list(apiKeyId),
          permitsOpenedBy: reads.permitsOpenedBy,
        },
        receipts: {
          signer: receiptSigner,
          chainId: config.chainId,
          market: config.marketAddress,
          listCharged: reads.listCharged,
        },
      }),
      permit: createPermitService({ authorizations: permitAuthorizations, clock }),
      settlement: createSettlementService({
        flusher: deps.settlement.flusher,
        reconcile: () => deps.settlement.reconcile(),
        listBatches: reads.listBatches,
      }),
      provider: createProviderService({
        catalog: deps.catalog,
        registration: deps.registration,
        health: deps.health,
        verificationTtlSeconds: config.verificationTtlSeconds,
        hidesReasoning: (model) => deps.tokens.forModel(model)?.hidesReasoning === true,
        hiddenReasoningRatioMax: BigInt(config.hiddenReasoningRatioMax),
        onEndpointChange: deps.invalidateRouting,
        keyBindings,
        earnings,
        clock,
      }),
    },
    logger: deps.logger,
    bodyLimitBytes: config.bodyLimitBytes,
    x402: x402Active(config),
    jsonBounds: { maxDepth: config.maxJsonDepth, maxArrayItems: config.maxJsonArrayItems },
    readiness: deps.readiness,
    findApiKey: (key) => keys.find(key),
    plausibleApiKey: (key) => keys.plausible(key),
    // A payer reads the records of the requests it paid with x402 with its signature (issue 37).
    payerReader: (credential) => permitAuthorizations.payerReader(credential),
    settlementOperatorToken: config.settlementOperatorToken,
    rateLimiter: deps.rateLimiter,
    failedAuthentications: createFailureBudget({
      rps: config.addressRateLimitRps,
      burst: config.addressRateLimitBurst,
    }),
    metrics: deps.metrics,
    serveMetrics: config.metricsPort === undefined,
    shutdown: deps.shutdown,
  });
}
