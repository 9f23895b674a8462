import { randomBytes } from "node:crypto";
import type { Logger } from "pino";
import type { Hex, PublicClient } from "viem";
import { loadCatalogFile } from "./adapters/catalog-file.js";
import type { Indexer } from "./adapters/chain/indexer.js";
import type { Database } from "./adapters/pg/database.js";
import { createPgCatalogStore } from "./adapters/pg/catalog.js";
import * as ledger from "./adapters/pg/ledger/index.js";
import { createUpstreamClient, type UpstreamClient } from "./adapters/upstream/http.js";
import { createApi, wireApiKeys, wireRateLimiter, type ApiKeyWiring } from "./app/api.js";
import { connectChain, marketReads, startIndexer, type IndexerHooks } from "./app/chain.js";
import type { AuditOptions } from "./app/audits.js";
import { wireChat, type ChatWiring } from "./app/chat.js";
import { wireProviders } from "./app/provider.js";
import { createReadiness, dependencySources } from "./runtime/readiness.js";
import { createSettlement, type Settlement } from "./app/settlement.js";
import { createShutdown } from "./runtime/shutdown.js";
import { openStorage, type Storage } from "./app/storage.js";
import { wireTokens } from "./app/tokens.js";
import {
  createTokenizerPreloads,
  type PreloadingCounters,
  type TokenizerPreloads,
} from "./app/tokenizer-preloads.js";
import { startTracing } from "./app/tracing.js";
import type { Config } from "./config.js";
import type { AuditRunner } from "./domain/audits/runner.js";
import { createCatalog, ModelDirectory } from "./domain/catalog.js";
import type { MeasurementSync } from "./domain/reputation/measurement-types.js";
import type { OfferCooldowns } from "./domain/reputation/cooldowns.js";
import { auditStateCounts, type AuditStandings } from "./domain/audits/standing.js";
import type { EndpointSecret, HealthMonitor } from "./domain/health-types.js";
import type { TokenCounters } from "./domain/tokens.js";
import { createTtlCache } from "./domain/ttl-cache.js";
import { createHousekeeping, type Housekeeping } from "./runtime/housekeeping.js";
import { listen, type Listener } from "./runtime/listen.js";
import { createMetrics, metricsOnlyHandler, type ScrapeSources } from "./runtime/metrics.js";
import type { Tracing } from "./runtime/tracing.js";

export { connectChain };

export interface Gateway {
  readonly port: number;
  /** Base URL for REST and Connect, e.g. http://127.0.0.1:8080 */
  readonly url: string;
  readonly db: Database;
  readonly chain: PublicClient;
  readonly indexer: Indexer;
  readonly health: HealthMonitor;
  readonly upstream: UpstreamClient;
  /** Identifies this process's requests (orphans of a crashed process are reconciled). */
  readonly instanceId: string;
  /** Heartbeat and the orphan rule (runs on its own; `runOnce` for operators and tests). */
  readonly housekeeping: Housekeeping;
  /**
   * Shares offer measurements and reads the reputation's record counts (runs on its own every
   * 5 s; `runOnce` for operators and tests).
   */
  readonly measurementSync: MeasurementSync;
  /**
   * The offers' audit standings as this process holds them (read every 5 s; `refresh` for
   * operators and tests).
   */
  readonly standings: AuditStandings;
  /** Where `GET /metrics` is served: `url` unless METRICS_PORT gave it its own listener. */
  readonly metricsUrl: string;
  /** The gateway's token counters (the tokenizer registry, checked at start-up). */
  readonly tokens: TokenCounters;
  /** The blind audits' runner (AUDIT_PERMITS; src/domain/audits/runner.ts); undefined when off. */
  readonly audits: AuditRunner | undefined;
  close(): Promise<void>;
}

export interface StartOptions {
  readonly logger: Logger;
  /** Embedded PGlite only: keep data in memory instead of under the state dir. */
  readonly inMemoryDatabase?: boolean;
  /** A database opened by the caller (tests); the gateway migrates it but does not close it. */
  readonly database?: Database;
  /** Unix seconds; tests inject a clock to move time without sleeping. */
  readonly clock?: () => number;
  /**
   * Token counters made by the caller (tests: counters whose loads they watch); absent: the
   * tokenizer registry's (TOKENIZER_REGISTRY over the embedded one, checked at start-up).
   */
  readonly tokens?: PreloadingCounters;
  /** The audits' statistics, standing and (tests) choices and timers (src/app/audits.ts). */
  readonly audits?: AuditOptions;
}

/**
 * Config -> dependencies -> listening server: the composition root. Each part is wired in its
 * own module (src/app/): storage (database, endpoint key), chain (reads, indexer), settlement,
 * chat (ledger, leases, the pipeline), the API (services, handler); readiness and shutdown are
 * the process runtime's (src/runtime/). The root constructs and connects, nothing else: what a
 * request or a background round runs lives below it (src/app/wiring.test.ts).
 */
export async function startGateway(config: Config, options: StartOptions): Promise<Gateway> {
  const { logger } = options;
  const tokens: PreloadingCounters = options.tokens ?? (await wireTokens(config, logger));
  const chain = await connectChain(config);
  const directory = new ModelDirectory(
    config.catalogFile === undefined ? [] : await loadCatalogFile(config.catalogFile),
  );
  // This gateway's own registry (several gateways may share a process: tests).
  const metrics = createMetrics({ modelName: (modelId) => directory.publicId(modelId) });
  const tracing = await startTracing(config, logger);
  const clock = options.clock ?? (() => Math.floor(Date.now() / 1000));
  const storage = await openStorage(config, options);
  const { db } = storage;
  let chat: ChatWiring | undefined;
  let apiKeys: ApiKeyWiring | undefined;
  try {
    const routing = wireRouting(config, { db, directory, tokens, logger });
    const { catalog, endpointCache, invalidateRouting, preloads } = routing;
    const { permits, permitClock } = marketReads(config, chain, clock);
    const instanceId = `gw_${randomBytes(8).toString("hex")}`;
    const settlement = createSettlement(config, {
      db,
      chain,
      permits,
      instanceId,
      clock,
      metrics,
      tracing,
      logger,
    });
    const indexer = await startIndexer(config, {
      chain,
      db,
      logger,
      hooks: indexerHooks({
        permits,
        permitClock,
        routing,
        settlement,
        // Set once the ledger exists (the indexer starts before it).
        leased: () => chat?.leased,
      }),
    });
    // Awaited before the gateway listens: no request waits on a tokenizer load (issue 35).
    const preloaded = preloads.sweep();
    const upstream = createUpstreamClient({ allowPrivate: config.allowPrivateEndpoints });
    const { registration, health } = wireProviders(config, {
      db,
      storage,
      chain,
      upstream,
      counters: tokens,
      clock,
      logger,
    });
    const shutdown = createShutdown({ graceMs: config.shutdownGraceMs, logger });
    const { draining } = shutdown;
    const readiness = createReadiness({ db, chain, draining, tokenizers: preloads.readiness });
    await ledger.heartbeat(db.pool, instanceId);
    const rateLimiter = wireRateLimiter(config, { db, instanceId, logger });
    chat = await wireChat(config, {
      auditOptions: options.audits,
      db,
      sealer: storage.sealer,
      catalog,
      permits,
      permitClock: permitClock.now,
      endpointCache,
      upstream,
      instanceId,
      clock,
      nowMs: clockMs(options.clock),
      acquireStream: (apiKeyId) => rateLimiter.acquireStream(apiKeyId),
      metrics,
      tracer: tracing?.chat,
      tokens,
      logger,
      chain,
    });
    const housekeeping = startHousekeeping(config, { db, instanceId, chat, logger });
    apiKeys = await wireApiKeys(config, { db, clock, metrics, logger });
    const handler = createApi(config, {
      db,
      deploymentId: storage.deploymentId,
      chain,
      catalog,
      offerViews: chat,
      permits,
      permitClock: permitClock.now,
      inference: chat.inference,
      registration,
      health,
      tokens,
      settlement,
      invalidateRouting,
      rateLimiter,
      apiKeys,
      readiness,
      clock,
      metrics,
      shutdown: shutdown.signal,
      logger,
    });
    metrics.setSources(scrapeSources(config, { db, chain, clock, chat }));
    await preloaded;
    const { listener, metricsListener } = await listenAll(config, shutdown.guard(handler), metrics);
    const { url, metricsUrl } = urlsOf(config, listener, metricsListener);
    const audits = startListening({ health, settlement, chat, url });
    announce(config, logger, { url, database: db.kind });
    const parts = {
      shutdown,
      settlement,
      health,
      indexer,
      housekeeping,
      chat,
      listener,
      metricsListener,
      rateLimiter,
      apiKeys,
      upstream,
      tracing,
      storage,
      tokens: options.tokens === undefined ? tokens : undefined,
    };
    return {
      port: listener.port,
      url,
      db,
      chain,
      indexer,
      health,
      upstream,
      instanceId,
      housekeeping,
      measurementSync: chat.measurementSync,
      standings: chat.standings,
      metricsUrl,
      tokens,
      audits,
      close: () => closeGateway(parts),
    };
  } catch (error) {
    await tracing?.shutdown();
    await apiKeys?.close();
    await chat?.stop();
    if (storage.ownsDatabase) await db.close();
    throw error;
  }
}

/**
 * What the indexer's news changes: the permits, their clock, routing, the tokenizers loaded,
 * leases and settlement.
 */
function indexerHooks(deps: {
  readonly permits: ReturnType<typeof marketReads>["permits"];
  readonly permitClock: ReturnType<typeof marketReads>["permitClock"];
  readonly routing: {
    readonly invalidateRouting: () => void;
    readonly preloads: TokenizerPreloads;
  };
  readonly settlement: Settlement;
  readonly leased: () => ChatWiring["leased"];
}): IndexerHooks {
  const { permits, permitClock, settlement } = deps;
  return {
    onHead: (timestamp) => permitClock.observeBlock(timestamp),
    onPermitEvent: (permitId) => permits.invalidate(permitId),
    // Loads run in the background (never rejecting): a model is routable once its own is done.
    onModelsIndexed: (models) => void deps.routing.preloads.preload(models),
    onCatalogChange: () => {
      deps.routing.invalidateRouting();
      void deps.routing.preloads.sweep();
    },
    onPermitClosing: (permitIds) => {
      for (const permitId of permitIds) deps.leased()?.revokePermit(permitId);
      settlement.settleClosingSoon();
    },
  };
}

/** Liveness of this process, and the rule for the requests of crashed ones; started. */
function startHousekeeping(
  config: Config,
  deps: {
    readonly db: Database;
    readonly instanceId: string;
    readonly chat: ChatWiring;
    readonly logger: Logger;
  },
): Housekeeping {
  const { inference } = deps.chat;
  const housekeeping = createHousekeeping({
    pool: deps.db.pool,
    instanceId: deps.instanceId,
    logger: deps.logger.child({ component: "housekeeping" }),
    retryCloses: () => inference.retryCloses(),
    staleAfterSeconds: config.orphanAfterSeconds,
    intervalMs: config.housekeepingIntervalMs,
  });
  housekeeping.start();
  return housekeeping;
}

/**
 * Routing's reads (offers, opened endpoints), what drops them, and the tokenizer loads a model
 * waits on before it is routable.
 */
function wireRouting(
  config: Config,
  deps: {
    readonly db: Database;
    readonly directory: ModelDirectory;
    readonly tokens: PreloadingCounters;
    readonly logger: Logger;
  },
) {
  const { db, directory, tokens } = deps;
  // Routing reads (offers, opened endpoints) are reused for ROUTING_CACHE_MS; what this
  // process changes or indexes drops them at once.
  const endpointCache = createTtlCache<Hex, EndpointSecret>({ ttlMs: config.routingCacheMs });
  const catalog = createCatalog({
    store: createPgCatalogStore(db.pool),
    directory,
    routingCacheMs: config.routingCacheMs,
    // How each model is metered, and whether its tokenizer is loaded (routable).
    tokens,
  });
  const invalidateRouting = () => {
    catalog.invalidate();
    endpointCache.clear();
  };
  const preloads = createTokenizerPreloads({ tokens, catalog, logger: deps.logger });
  return { catalog, endpointCache, invalidateRouting, preloads };
}

/**
 * What starts once the gateway listens: the prober, the settlement rounds, and the blind audits
 * (they reach the gateway at `url`, its own port); returns the audits' runner.
 */
function startListening(parts: {
  readonly health: HealthMonitor;
  readonly settlement: Settlement;
  readonly chat: ChatWiring;
  readonly url: string;
}): AuditRunner | undefined {
  parts.health.start();
  parts.settlement.start();
  return parts.chat.audits?.start(parts.url);
}

/** The gateway's listener, and the metrics' own when METRICS_PORT is set. */
async function listenAll(
  config: Config,
  handler: Parameters<typeof listen>[0],
  metrics: ReturnType<typeof createMetrics>,
): Promise<{ listener: Listener; metricsListener: Listener | undefined }> {
  const metricsListener =
    config.metricsPort === undefined
      ? undefined
      : await listen(metricsOnlyHandler(metrics), {
          host: config.host,
          port: config.metricsPort,
        });
  const listener = await listen(handler, {
    host: config.host,
    port: config.port,
    limits: {
      headersTimeoutMs: config.headersTimeoutMs,
      bodyTimeoutMs: config.bodyTimeoutMs,
      idleTimeoutMs: config.idleTimeoutMs,
      maxHeaderBytes: config.maxHeaderBytes,
      clientWriteTimeoutMs: config.clientWriteTimeoutMs,
    },
  }).catch(async (error: unknown) => {
    await metricsListener?.close(0);
    throw error;
  });
  return { listener, metricsListener };
}

/** Where the gateway and its metrics are reached (a wildcard host is reached on loopback). */
function urlsOf(config: Config, listener: Listener, metricsListener: Listener | undefined) {
  const host = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
  const origin = (port: number) => `http://${host.includes(":") ? `[${host}]` : host}:${port}`;
  const url = origin(listener.port);
  const metricsUrl = `${metricsListener === undefined ? url : origin(metricsListener.port)}/metrics`;
  return { url, metricsUrl };
}

/** The start-up's last log line: where, on which chain and market, over which database. */
function announce(config: Config, logger: Logger, at: { url: string; database: string }): void {
  logger.info(
    { url: at.url, chainId: config.chainId, market: config.marketAddress, database: at.database },
    "gateway listening",
  );
}

/** Where the metrics' scrape-time gauges are read. */
function scrapeSources(
  config: Config,
  from: {
    readonly db: Database;
    readonly chain: PublicClient;
    readonly clock: () => number;
    /** What routing holds in memory: the cooldowns and the audit standings. */
    readonly chat: { readonly cooldowns: OfferCooldowns; readonly standings: AuditStandings };
  },
): ScrapeSources {
  return {
    ...dependencySources(from.db, from.chain),
    confirmations: config.confirmations,
    clock: from.clock,
    coolingDown: () => from.chat.cooldowns.coolingCount(),
    auditStates: () => auditStateCounts(from.chat.standings.all()),
  };
}

/** Unix milliseconds: a test's clock (seconds) moves cooldowns too; else the real one. */
function clockMs(clock: (() => number) | undefined): () => number {
  return clock === undefined ? Date.now : () => clock() * 1000;
}

/** The gateway's shutdown: what each step stops, in its order (src/runtime/shutdown.ts). */
function closeGateway(parts: {
  readonly shutdown: ReturnType<typeof createShutdown>;
  readonly settlement: Settlement;
  readonly health: HealthMonitor;
  readonly indexer: Indexer;
  readonly housekeeping: Housekeeping;
  readonly chat: ChatWiring;
  readonly listener: Listener;
  readonly metricsListener: Listener | undefined;
  readonly rateLimiter: ReturnType<typeof wireRateLimiter>;
  readonly apiKeys: ApiKeyWiring;
  readonly upstream: UpstreamClient;
  readonly tracing: Tracing | undefined;
  readonly storage: Storage;
  /** The counters the gateway made (a test's own are the test's to stop). */
  readonly tokens: PreloadingCounters | undefined;
}): Promise<void> {
  // Stopped at once when the shutdown begins; awaited after the closes are written.
  let settlementStopped: Promise<void> | undefined;
  return parts.shutdown.close({
    stopBackground: () => {
      settlementStopped = parts.settlement.stop();
      return Promise.all([
        parts.health.stop(),
        parts.indexer.stop(),
        parts.housekeeping.stop(),
        parts.chat.stopBackground(),
        parts.chat.audits?.close(),
      ]);
    },
    listener: parts.listener,
    metricsListener: parts.metricsListener,
    drainRequests: () => parts.chat.inference.drain(),
    release: [
      ["leases given back", () => parts.chat.stop()],
      ["rate limit leases given back", () => parts.rateLimiter.close()],
      ["authority listener closed", () => parts.apiKeys.close()],
      ["request closes and leases written", async () => settlementStopped],
      ["upstream connections closed", () => parts.upstream.close()],
      ["spans exported", async () => parts.tracing?.shutdown()],
      ["token counting workers stopped", async () => parts.tokens?.close?.()],
      ["closed", async () => (parts.storage.ownsDatabase ? parts.storage.db.close() : undefined)],
    ],
  });
}
