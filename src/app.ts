import { setMaxListeners } from "node:events";
import { createHash, hkdfSync, randomBytes } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createPublicClient, http, type Hex, type PublicClient } from "viem";
import type { Logger } from "pino";
import { loadCatalogFile } from "./adapters/catalog-file.js";
import { createIndexer, type Indexer } from "./adapters/chain/indexer.js";
import { createChainOfferReader } from "./adapters/chain/offers.js";
import { createChainPermitReader } from "./adapters/chain/permits.js";
import { chainSettledTotals, createChainSettlement } from "./adapters/chain/settlement.js";
import { createPgSettlementStore, settledSums } from "./adapters/pg/settlement.js";
import { createPgIdempotencyStore } from "./adapters/pg/idempotency.js";
import * as ledger from "./adapters/pg/ledger.js";
import { createPgLeaseSignals, type PgLeaseSignals } from "./adapters/pg/lease-signals.js";
import { createPgLeaseStore } from "./adapters/pg/leases.js";
import { getQuote, insertQuote } from "./adapters/pg/quotes.js";
import { getRequest } from "./adapters/pg/requests.js";
import { getRegisteredEndpoint } from "./adapters/pg/endpoint-health.js";
import {
  createSealer,
  generateEncryptionKey,
  parseEncryptionKey,
} from "./adapters/crypto/sealer.js";
import { createPgEndpointHealthStore } from "./adapters/pg/endpoint-health.js";
import { recordRegistration } from "./adapters/pg/registrations.js";
import { canonicalEndpointUrl, resolveEndpoint } from "./adapters/upstream/endpoint-guard.js";
import {
  createUpstreamClient,
  readEventStream,
  type UpstreamClient,
} from "./adapters/upstream/http.js";
import { createEndpointProber } from "./adapters/upstream/probe.js";
import {
  createPgPermitAuthorizationStore,
  findApiKeyWithAuthorizations,
} from "./adapters/pg/permit-authorizations.js";
import { createChainSignatureVerifier } from "./adapters/chain/signatures.js";
import { createPgCatalogStore } from "./adapters/pg/catalog.js";
import { openDatabase, type Database } from "./adapters/pg/database.js";
import { migrate } from "./adapters/pg/migrate.js";
import type { Config } from "./config.js";
import { createCatalogService } from "./connect/catalog-service.js";
import { createInferenceService } from "./connect/inference-service.js";
import { createPermitService } from "./connect/permit-service.js";
import { createProviderService } from "./connect/provider-service.js";
import { createQuoteService } from "./connect/quote-service.js";
import { createSettlementService } from "./connect/settlement-service.js";
import { createCatalog, ModelDirectory } from "./domain/catalog.js";
import { GatewayError } from "./domain/errors.js";
import { createHealthMonitor, type EndpointSecret, type HealthMonitor } from "./domain/health.js";
import {
  createInference,
  type Ledger,
  type QuoteRecord,
  type UpstreamChat,
} from "./domain/chat/index.js";
import { createLeasedLedger, type LeasedLedger } from "./domain/chat/leases.js";
import {
  createKeyAuthorities,
  createPermitAuthorizationService,
  type KeyAuthorities,
  type SpendingAuthority,
} from "./domain/permit-authorization.js";
import { createPermitClock } from "./domain/permits.js";
import { createRegistrationService, openEndpoint } from "./domain/registration.js";
import { createSharedRefresh } from "./domain/shared-refresh.js";
import { createTtlCache } from "./domain/ttl-cache.js";
import { createSettlementFlusher, reconcile, type SettlementFlusher } from "./domain/settlement.js";
import { listen } from "./listen.js";
import type { NodeRequest } from "./rest/body.js";
import { errorBodyFor, type NodeResponse, type Readiness } from "./rest/facade.js";
import { toHttpError } from "./rest/errors.js";
import { createHousekeeping, type Housekeeping } from "./housekeeping.js";
import { createMeasurementSync, createOfferMeasurements } from "./domain/chat/measurements.js";
import { createPgMeasurementStore } from "./adapters/pg/offer-measurements.js";
import { createGatewayHandler } from "./server.js";
import { createMetrics, metricsOnlyHandler, publicStateMaxAgeMs } from "./metrics.js";
import { createRateLimiter } from "./rate-limit.js";

/** How often each process shares its offer measurements through the database (migration 019). */
const measurementSyncMs = 5_000;

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
  /** Where `GET /metrics` is served: `url` unless METRICS_PORT gave it its own listener. */
  readonly metricsUrl: string;
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
}

/**
 * The key that seals provider endpoints at rest: ENDPOINT_ENCRYPTION_KEY, else
 * (embedded database only) one made on first start and kept beside the data,
 * or a throwaway one for an in-memory database.
 */
async function endpointEncryptionKey(config: Config, inMemory: boolean): Promise<Buffer> {
  if (config.endpointEncryptionKey !== undefined)
    return parseEncryptionKey(config.endpointEncryptionKey);
  if (inMemory) return generateEncryptionKey();
  const path = join(config.stateDir, "endpoint-encryption.key");
  try {
    return parseEncryptionKey((await readFile(path, "utf8")).trim());
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
  await mkdir(config.stateDir, { recursive: true });
  const key = generateEncryptionKey();
  try {
    await writeFile(path, `${key.toString("hex")}\n`, { mode: 0o600, flag: "wx" });
    return key;
  } catch (error) {
    // Another process made it first: use theirs.
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    return parseEncryptionKey((await readFile(path, "utf8")).trim());
  }
}

async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Shutdown: after SHUTDOWN_GRACE_MS the requests still in flight are cut (a stream ends with
 * its `shutting_down` event); connections still open this much later are destroyed.
 */
const cutMs = 500;
/** Shutdown: the longest wait for the closes of the requests in flight to be written. */
const drainMs = 2000;

function isReadyTarget(url: string | undefined): boolean {
  return url === "/ready" || url?.startsWith("/ready?") === true;
}

/** 503 shutting_down for a request that arrives while the gateway drains; the connection closes. */
function refuseShuttingDown(req: NodeRequest, res: NodeResponse): void {
  req.resume();
  const { status, body } = toHttpError(
    new GatewayError("shutting_down", "the gateway is shutting down; retry on another instance"),
  );
  const payload = JSON.stringify(errorBodyFor(req.url, body));
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
  };
  if (req.httpVersionMajor === 1) headers.connection = "close";
  res.writeHead(status, headers);
  res.end(payload);
}

/**
 * API key lookups, remembered for `ttlMs` once found (a chat request is the hot path; a
 * revoked key stops within `ttlMs`). Unknown keys are never remembered. Keyed by the key's
 * SHA-256, as the database is: no plaintext key is kept in memory longer than a request.
 *
 * The key's spending authority (its live permit authorizations) comes in the same query and is
 * held by `authorities` for the same `ttlMs`: a chat's authority check is a read of memory, and
 * a revocation made by another gateway on the database reaches this one within `ttlMs`
 * (API_KEY_CACHE_MS; one made here applies at once, see domain/permit-authorization.ts).
 */
function cachedApiKeys(
  db: Database,
  ttlMs: number,
  authorities: KeyAuthorities,
  clock: () => number,
): (key: string) => Promise<{ id: string; authority: SpendingAuthority } | null> {
  const found = createTtlCache<string, string>({ ttlMs });
  return async (key) => {
    const digest = createHash("sha256").update(key).digest("base64");
    const hit = found.get(digest);
    const held = hit === undefined ? undefined : authorities.get(hit);
    if (hit !== undefined && held !== undefined) return { id: hit, authority: held };
    // Marked before the read: a change this process makes while it runs is applied on top.
    const since = authorities.mark();
    const row = await findApiKeyWithAuthorizations(db.pool, key, clock());
    if (row === null) {
      found.delete(digest);
      return null;
    }
    found.set(digest, row.id);
    return { id: row.id, authority: authorities.load(row.id, row.authorizations, since) };
  };
}

/** Connects to the chain and refuses one whose id or market contract is not the configured one. */
export async function connectChain(config: Config): Promise<PublicClient> {
  const client = createPublicClient({
    transport: http(config.rpcUrl, { batch: true, retryCount: 2, timeout: config.chainTimeoutMs }),
  });
  let chainId: number;
  try {
    chainId = await client.getChainId();
  } catch (error) {
    throw new Error(`cannot reach the chain at RPC_URL: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (chainId !== config.chainId) {
    throw new Error(
      `RPC_URL serves chain ${chainId}, but CHAIN_ID is ${config.chainId}: refusing to start`,
    );
  }
  const code = await client.getCode({ address: config.marketAddress });
  if (code === undefined || code === "0x") {
    throw new Error(`no contract at MARKET_ADDRESS ${config.marketAddress} on chain ${chainId}`);
  }
  return client as PublicClient;
}

/** Config -> dependencies -> listening server. */
export async function startGateway(config: Config, options: StartOptions): Promise<Gateway> {
  const { logger } = options;
  const chain = await connectChain(config);
  const entries = config.catalogFile === undefined ? [] : await loadCatalogFile(config.catalogFile);
  const directory = new ModelDirectory(entries);
  // This gateway's own registry (several gateways may share a process: tests).
  const metrics = createMetrics({ modelName: (modelId) => directory.publicId(modelId) });

  const clock = options.clock ?? (() => Math.floor(Date.now() / 1000));
  const ownsDatabase = options.database === undefined;
  const db =
    options.database ??
    (await openDatabase({
      url: config.databaseUrl,
      dataDir: options.inMemoryDatabase ? undefined : join(config.stateDir, "pgdata"),
      logger,
      timeouts: {
        statementMs: config.dbStatementTimeoutMs,
        queryMs: config.dbQueryTimeoutMs,
        connectMs: config.dbConnectTimeoutMs,
      },
    }));
  let leaseSignals: PgLeaseSignals | undefined;
  try {
    const { applied } = await migrate(db.pool);
    if (applied.length > 0) logger.info({ applied }, "database migrated");

    // Routing reads (offers, opened endpoints) are reused for ROUTING_CACHE_MS; what this
    // process changes or indexes drops them at once.
    const endpointCache = createTtlCache<Hex, EndpointSecret>({
      ttlMs: config.routingCacheMs,
    });
    const catalog = createCatalog({
      store: createPgCatalogStore(db.pool),
      directory,
      routingCacheMs: config.routingCacheMs,
    });
    const invalidateRouting = () => {
      catalog.invalidate();
      endpointCache.clear();
    };
    const permits = createChainPermitReader({
      client: chain,
      market: config.marketAddress,
      maxStalenessMs: config.permitCacheMs,
    });
    // Permit expiry is judged by the later of our clock and the chain's latest block time, which
    // the indexer's head reads feed (no RPC per request).
    const permitClock = createPermitClock(clock);
    const instanceId = `gw_${randomBytes(8).toString("hex")}`;
    // Set once the ledger exists; the indexer (started before it) revokes closing permits.
    const late: { leased?: LeasedLedger } = {};
    // Settlement: the flusher behind SettlementService.Flush, and the close watcher that settles
    // charges of permits in their close grace period without waiting for a worker.
    const flusher: SettlementFlusher | undefined =
      config.settlementPrivateKey === undefined
        ? undefined
        : createSettlementFlusher({
            store: createPgSettlementStore(db.pool),
            chain: createChainSettlement({
              client: chain,
              chainId: config.chainId,
              market: config.marketAddress,
              privateKey: config.settlementPrivateKey,
            }),
            holder: instanceId,
            logger: logger.child({ component: "settlement" }),
            clock,
            confirmations: config.confirmations,
            maxBatchGas: config.settlementMaxBatchGas,
            replaceAfterBlocks: config.settlementReplaceAfterBlocks,
            feeBumpPercent: config.settlementFeeBumpPercent,
            feeCap: {
              maxFeePerGas: config.settlementMaxFeePerGas,
              maxPriorityFeePerGas: config.settlementMaxPriorityFeePerGas,
            },
            waitMs: config.settlementWaitMs,
            leaseSeconds: config.settlementLeaseSeconds,
            pollMs: Math.min(config.pollIntervalMs, 1000),
            closeMarginSeconds: config.settlementCloseMarginSeconds,
            observer: metrics.settlement,
            // What we just settled is read afresh (the view's four amounts add up at once),
            // without waiting for the indexer to see ChargeSettled.
            onSettled: (permitIds) => {
              for (const permitId of permitIds) permits.invalidate(permitId);
            },
          });
    // One background settlement task at a time: the recovery of a batch left in flight by a
    // stopped process (at start), and the close watcher. Shutdown stops its waiting at once.
    const settlementStop = new AbortController();
    let settlementTask: Promise<void> | undefined;
    const settleInBackground = (
      what: string,
      task: (flusher: SettlementFlusher) => Promise<unknown>,
    ) => {
      if (flusher === undefined || settlementTask !== undefined || settlementStop.signal.aborted)
        return;
      settlementTask = task(flusher)
        .then(
          () => undefined,
          (error: unknown) => logger.warn({ err: error }, `${what} failed; will retry`),
        )
        .finally(() => {
          settlementTask = undefined;
        });
    };
    const settleClosingSoon = (): void =>
      settleInBackground("settling charges of closing permits", (f) =>
        f.settleClosing(settlementStop.signal),
      );
    const closeWatcher = setInterval(settleClosingSoon, config.settlementCloseCheckMs);
    closeWatcher.unref();
    const indexer = createIndexer({
      onHead: (head) => permitClock.observeBlock(head.timestamp),
      onPermitEvent: (permitId) => permits.invalidate(permitId),
      onCatalogChange: () => invalidateRouting(),
      onPermitClosing: (permitIds) => {
        for (const permitId of permitIds) late.leased?.revokePermit(permitId);
        settleClosingSoon();
      },
      client: chain,
      market: config.marketAddress,
      pool: db.pool,
      confirmations: config.confirmations,
      startBlock: config.startBlock,
      pollIntervalMs: config.pollIntervalMs,
      logger: logger.child({ component: "indexer" }),
    });
    // Catch up once before serving, so a fresh gateway does not list an empty market.
    try {
      let pass = await indexer.syncOnce();
      while (pass?.behind) pass = await indexer.syncOnce();
    } catch (error) {
      logger.warn({ err: error }, "initial indexing failed; the indexer keeps trying");
    }
    indexer.start();

    const key = await endpointEncryptionKey(config, options.inMemoryDatabase === true);
    const sealer = createSealer(key);
    const upstream = createUpstreamClient({ allowPrivate: config.allowPrivateEndpoints });
    const registration = createRegistrationService({
      chainId: config.chainId,
      market: config.marketAddress,
      offers: createChainOfferReader({ client: chain, market: config.marketAddress }),
      recordRegistration: (nonce, reg) => recordRegistration(db.pool, nonce, reg),
      sealer,
      canonicalizeUrl: canonicalEndpointUrl,
      checkEndpoint: async (url) => {
        await resolveEndpoint(url, { allowPrivate: config.allowPrivateEndpoints });
      },
      clock,
      // Derived, so every gateway sharing the endpoint key also shares it.
      challengeSecret: Buffer.from(
        hkdfSync("sha256", key, "", "gateway.v1 registration challenge", 32),
      ),
    });
    const health = createHealthMonitor({
      store: createPgEndpointHealthStore(db.pool),
      open: (offerId, sealed) => openEndpoint(sealer, offerId, sealed),
      prober: createEndpointProber(upstream),
      intervalMs: config.probeIntervalMs,
      concurrency: config.probeConcurrency,
      staleMs: config.probeStaleMs,
      verifyMinIntervalSeconds: config.verifyMinIntervalSeconds,
      clock,
      logger: logger.child({ component: "health" }),
    });
    // Shutdown: `draining` first (GET /ready answers 503 shutting_down, new requests are
    // refused), `cut` when the grace is over (what is still in flight ends with shutting_down).
    let draining = false;
    const cut = new AbortController();
    // Every request in flight listens on `cut.signal` (one listener each, removed when it ends):
    // thousands at once is the design, not a leak, so Node's default of 10 would only print
    // MaxListenersExceededWarning under load.
    setMaxListeners(0, cut.signal);
    // GET /ready is unauthenticated: it answers from one check of the database and the chain
    // per publicStateMaxAgeMs, shared by every caller (DESIGN.md section 8), never one per request.
    const dependencyChecks = createSharedRefresh(
      async (): Promise<Readiness> => {
        const check = async (probe: () => Promise<unknown>) => {
          try {
            await withTimeout(probe(), 2000);
            return { ok: true };
          } catch (error) {
            return { ok: false, error: (error as Error).message.split("\n")[0] ?? "failed" };
          }
        };
        const [database, chainCheck] = await Promise.all([
          check(() => db.pool.query("SELECT 1")),
          check(() => chain.getBlockNumber({ cacheTime: 0 })),
        ]);
        return { ok: database.ok && chainCheck.ok, checks: { database, chain: chainCheck } };
      },
      { maxAgeMs: publicStateMaxAgeMs },
    );
    // Draining is this process's own state: said at once, not after the next check.
    const readiness = async (): Promise<Readiness> =>
      draining ? { ok: false, shuttingDown: true, checks: {} } : dependencyChecks.get();

    await ledger.heartbeat(db.pool, instanceId);
    const lookupEndpoint = async (offerId: Hex): Promise<EndpointSecret | undefined> => {
      const registered = await getRegisteredEndpoint(db.pool, offerId);
      return registered === undefined
        ? undefined
        : openEndpoint(sealer, offerId, registered.sealed);
    };
    const upstreamChat: UpstreamChat = async (endpoint, body, { signal }) => {
      const reply = await upstream.request(endpoint, "/v1/chat/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
        signal,
        timeoutMs: config.upstreamTimeoutMs,
        idleTimeoutMs: config.upstreamIdleTimeoutMs,
      });
      return {
        status: reply.status,
        text: () => reply.text(),
        events: async function* () {
          for await (const event of readEventStream(reply.body)) yield event.data;
        },
        discard: () => reply.dump(),
      };
    };
    // Reservations and finalisations that arrive together share one transaction (group commit,
    // migration 006); unloaded, each still goes at once.
    // Bounded: behind a hung batch, a request fails closed in time (503, no upstream call).
    const ledgerBatcher = ledger.createLedgerBatcher(db.pool, {
      maxQueued: config.ledgerQueueMax,
      maxWaitMs: config.ledgerQueueWaitMs,
    });
    const perRequest: Ledger = {
      reserve: (input) => ledgerBatcher.reserve({ ...input, instanceId }),
      markStreaming: (requestId) => ledger.markStreaming(db.pool, requestId),
      finalize: (input) => ledgerBatcher.finalize(input),
      voidReservation: (reservation, close) =>
        ledger.voidReservation(db.pool, { ...reservation, instanceId }, close),
      switchOffer: (input) => ledger.switchOffer(db.pool, input),
      recordOfferFlag: (input) => ledger.recordOfferFlag(db.pool, input),
    };
    // Plain requests are admitted against reservation leases; their records and closes are
    // written in batches (migration 010).
    // Processes recall each other's idle leases over LISTEN/NOTIFY (PostgreSQL only: the
    // embedded PGlite serves one connection, and one process has no one to recall from).
    leaseSignals =
      config.reservationLeases && db.kind === "postgres"
        ? createPgLeaseSignals(db.pool, {
            instanceId,
            logger: logger.child({ component: "leases" }),
          })
        : undefined;
    await leaseSignals?.ready();
    const leased = config.reservationLeases
      ? createLeasedLedger({
          signals: leaseSignals,
          store: createPgLeaseStore(db.pool, {
            maxQueued: config.ledgerQueueMax,
            maxWaitMs: config.ledgerQueueWaitMs,
          }),
          fallback: perRequest,
          instanceId,
          clock,
          permitClock: permitClock.now,
          staleAfterSeconds: config.orphanAfterSeconds,
          maxQueued: config.ledgerQueueMax,
          maxWaitMs: config.ledgerQueueWaitMs,
        })
      : undefined;
    late.leased = leased;
    leased?.start();
    // Per API key, per replica (docs/decisions.md, "Rate limits").
    const rateLimiter = createRateLimiter({
      rps: config.rateLimitRps,
      burst: config.rateLimitBurst,
      maxStreams: config.maxStreamsPerKey,
      replicas: config.gatewayReplicas,
    });
    const jsonBounds = { maxDepth: config.maxJsonDepth, maxArrayItems: config.maxJsonArrayItems };
    // Measured latency and throughput of offers (`provider.sort`), shared through the database
    // every few seconds (migration 019): routing reads memory only.
    const measurements = createOfferMeasurements({ instanceId });
    const measurementSync = createMeasurementSync({
      measurements,
      store: createPgMeasurementStore(db.pool),
      instanceId,
      intervalMs: measurementSyncMs,
      onError: (error) =>
        logger.warn(
          { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
          "sharing offer measurements failed",
        ),
    });
    measurementSync.start();
    const inference = createInference({
      catalog,
      permits,
      quotes: {
        insert: (quote) => insertQuote(db.pool, quote),
        get: async (quoteId) => (await getQuote(db.pool, quoteId)) as QuoteRecord | undefined,
      },
      ledger: leased ?? perRequest,
      endpoints: async (offerId) => {
        // `undefined` (no endpoint) is not remembered: a registration is picked up at once.
        const hit = endpointCache.get(offerId);
        if (hit !== undefined) return hit;
        const endpoint = await lookupEndpoint(offerId);
        if (endpoint !== undefined) endpointCache.set(offerId, endpoint);
        return endpoint;
      },
      upstream: upstreamChat,
      idempotency: createPgIdempotencyStore(db.pool, { instanceId }),
      clock,
      permitClock: permitClock.now,
      bodyLimitBytes: config.bodyLimitBytes,
      jsonBounds,
      idempotencyMaxResultBytes: config.idempotencyMaxResultBytes,
      // The error's first line only: never the key, the API key or the answer.
      onIdempotencyResultLost: ({ requestId, error }) =>
        logger.warn(
          { requestId, error: (error as Error).message?.split("\n")[0] ?? "failed" },
          "idempotency result not stored: the answer was delivered and charged, its replay is lost",
        ),
      acquireStream: (apiKeyId) => rateLimiter.acquireStream(apiKeyId),
      observer: metrics.chat,
      measurements,
    });
    // Liveness of this process, and the rule for the requests of crashed ones.
    const housekeeping = createHousekeeping({
      pool: db.pool,
      instanceId,
      logger: logger.child({ component: "housekeeping" }),
      retryCloses: () => inference.retryCloses(),
      staleAfterSeconds: config.orphanAfterSeconds,
      intervalMs: config.housekeepingIntervalMs,
    });
    housekeeping.start();

    // Spending authority (DESIGN.md section 8): held per API key with the key itself.
    const authorities = createKeyAuthorities({ ttlMs: config.apiKeyCacheMs });
    const permitAuthorizations = createPermitAuthorizationService({
      chainId: config.chainId,
      market: config.marketAddress,
      store: createPgPermitAuthorizationStore(db.pool),
      verifier: createChainSignatureVerifier(chain),
      authorities,
      clock,
    });
    const handler = createGatewayHandler({
      services: {
        catalog: createCatalogService(catalog),
        quote: createQuoteService(inference),
        inference: createInferenceService({
          inference,
          findRequest: (id, apiKeyId) => getRequest(db.pool, id, apiKeyId),
          permits,
          permitLedger: (permitId) => ledger.permitLedger(db.pool, permitId),
          clock,
          permitClock: permitClock.now,
        }),
        permit: createPermitService({ authorizations: permitAuthorizations, clock }),
        settlement: createSettlementService({
          flusher,
          reconcile: async () => {
            const gateway = await settledSums(db.pool);
            const events = await chainSettledTotals(chain, config.marketAddress, config.startBlock);
            // The chain's own `settled` of every permit the gateway knows, over the event sums.
            const chainPermits = new Map(events.permits);
            for (const p of gateway.permits) {
              permits.invalidate(p.permitId);
              const permit = await permits.get(p.permitId);
              chainPermits.set(p.permitId, permit?.settled ?? 0n);
            }
            return reconcile({
              account: flusher?.account ?? "0x",
              gateway,
              chainPermits,
              chainOffers: events.offers,
            });
          },
        }),
        provider: createProviderService({
          catalog,
          registration,
          health,
          verificationTtlSeconds: config.verificationTtlSeconds,
          onEndpointChange: invalidateRouting,
        }),
      },
      logger,
      bodyLimitBytes: config.bodyLimitBytes,
      jsonBounds,
      readiness,
      findApiKey: cachedApiKeys(db, config.apiKeyCacheMs, authorities, clock),
      settlementOperatorToken: config.settlementOperatorToken,
      rateLimiter,
      metrics,
      serveMetrics: config.metricsPort === undefined,
      shutdown: cut.signal,
    });
    // While draining, a request that still reaches us (on a kept-alive connection) is refused,
    // except GET /ready, which says why.
    const serve: typeof handler = (req, res) => {
      if (!draining || isReadyTarget(req.url)) handler(req, res);
      else refuseShuttingDown(req, res);
    };
    metrics.setSources({
      query: (text) => db.pool.query(text),
      chainHead: () => chain.getBlockNumber({ cacheTime: 0 }),
      confirmations: config.confirmations,
      clock,
    });
    const metricsListener =
      config.metricsPort === undefined
        ? undefined
        : await listen(metricsOnlyHandler(metrics), {
            host: config.host,
            port: config.metricsPort,
          });
    const listener = await listen(serve, {
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
    health.start();
    // A batch a stopped process left in flight is driven to its end from the chain's state
    // (asking isBatchSettled first), whether or not a worker calls soon.
    settleInBackground("recovering settlement batches in flight", (f) =>
      f.flush({ maxRequests: 0, signal: settlementStop.signal }),
    );
    const host = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
    const url = `http://${host.includes(":") ? `[${host}]` : host}:${listener.port}`;
    const metricsUrl =
      metricsListener === undefined
        ? `${url}/metrics`
        : `http://${host.includes(":") ? `[${host}]` : host}:${metricsListener.port}/metrics`;
    logger.info(
      { url, chainId: config.chainId, market: config.marketAddress, database: db.kind },
      "gateway listening",
    );

    let closing: Promise<void> | undefined;
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
      metricsUrl,
      close() {
        closing ??= (async () => {
          const began = performance.now();
          const step = (name: string) =>
            logger.debug({ step: name, ms: Math.round(performance.now() - began) }, "shutdown");
          // First, before anything stops: readiness goes 503 and new requests are refused.
          draining = true;
          // Then nothing new starts: no probe, index pass, housekeeping round or settlement.
          clearInterval(closeWatcher);
          settlementStop.abort();
          const background = Promise.all([
            health.stop(),
            indexer.stop(),
            housekeeping.stop(),
            measurementSync.stop(),
          ]);
          // The listener stops accepting at once; what is in flight has the grace to finish.
          const graceMs = config.shutdownGraceMs;
          const closed = listener.close(graceMs + cutMs);
          let graceTimer: NodeJS.Timeout | undefined;
          const drained = await Promise.race([
            closed.then(() => true),
            new Promise<false>((resolve) => (graceTimer = setTimeout(resolve, graceMs, false))),
          ]);
          clearTimeout(graceTimer);
          if (!drained) {
            logger.warn({ grace_ms: graceMs }, "shutdown grace over: cutting requests in flight");
            cut.abort(new GatewayError("shutting_down", "the gateway is shutting down"));
          }
          await closed;
          step("listener closed");
          await metricsListener?.close(0);
          await background;
          step("background tasks stopped");
          // Every request's close is written (those cut above included) before the leases go back.
          try {
            await withTimeout(inference.drain(), drainMs);
          } catch {
            logger.error({ ms: drainMs }, "request closes still unwritten at shutdown");
          }
          await leased?.stop();
          await leaseSignals?.close();
          await settlementTask;
          step("request closes and leases written");
          await upstream.close();
          if (ownsDatabase) await db.close();
          step("closed");
        })();
        return closing;
      },
    };
  } catch (error) {
    await leaseSignals?.close();
    if (ownsDatabase) await db.close();
    throw error;
  }
}
