import type { Logger } from "pino";
import type { Hex } from "viem";
import type { Sealer } from "../adapters/crypto/sealer.js";
import type { Database } from "../adapters/pg/database.js";
import type { PublicClient } from "viem";
import { prepareAudits, type AuditOptions, type AuditWiring } from "./audits.js";
import { wireX402 } from "./x402.js";
import {
  createPgLedger,
  createPgQuoteStore,
  createPgWakeFeeClaimer,
} from "../adapters/pg/chat-stores.js";
import { createPgEndpointLookup } from "../adapters/pg/endpoint-lookup.js";
import { createPgIdempotencyStore } from "../adapters/pg/idempotency.js";
import { createPgLeaseSignals, type PgLeaseSignals } from "../adapters/pg/lease-signals.js";
import { createPgLeaseStore } from "../adapters/pg/leases.js";
import { createPgCooldownStore } from "../adapters/pg/offer-cooldowns.js";
import { createAuthorizationThresholds } from "../adapters/pg/authorization-warnings.js";
import { createPgAuditStandingStore } from "../adapters/pg/audits.js";
import { createAuditStandings, type AuditStandings } from "../domain/audits/standing.js";
import { createPgMeasurementStore } from "../adapters/pg/offer-measurements.js";
import { createUpstreamChat } from "../adapters/upstream/chat.js";
import type { UpstreamClient } from "../adapters/upstream/http.js";
import type { Config } from "../config.js";
import type { Catalog } from "../domain/catalog.js";
import {
  createInference,
  type ChatTracer,
  type Inference,
  type Ledger,
} from "../domain/chat/index.js";
import { createLeasedLedger, type LeasedLedger } from "../domain/leases/leases.js";
import { offerReputation } from "../domain/reputation/offer-reputation.js";
import { createOfferCooldowns, type OfferCooldowns } from "../domain/reputation/cooldowns.js";
import { createMeasurementSync } from "../domain/reputation/measurement-sync.js";
import { createOfferMeasurements } from "../domain/reputation/measurements.js";
import { type MeasurementSync } from "../domain/reputation/measurement-types.js";
import { createWakeFees } from "../domain/chat/wake-fees.js";
import type { EndpointSecret } from "../domain/health-types.js";
import type { PermitReader } from "../domain/permits.js";
import type { Reputation } from "../domain/reputation/reputation.js";
import type { TokenCounters } from "../domain/tokens.js";
import type { TtlCache } from "../domain/ttl-cache.js";
import type { createMetrics } from "../runtime/metrics.js";

/**
 * How often each process shares its offer measurements through the database and reads the
 * reputation's record counts (migrations 019, 023).
 */
const measurementSyncMs = 5_000;

/** The metered chat pipeline of this process and what runs beside it. */
export interface ChatWiring {
  readonly inference: Inference;
  /** The blind audits (src/app/audits.ts), started once the gateway listens; undefined when off. */
  readonly audits: AuditWiring | undefined;
  /** The reservation leases (absent when RESERVATION_LEASES is off). */
  readonly leased: LeasedLedger | undefined;
  /** Each offer's reputation, from memory (the catalog's; docs/decisions/providers-and-routing.md). */
  reputation(offerId: Hex): Reputation;
  /** The sharing round (runs on its own; `runOnce` for operators and tests). */
  readonly measurementSync: MeasurementSync;
  /** Offers cooling down after their provider's 429, shared through the database. */
  readonly cooldowns: OfferCooldowns;
  /** The offers' audit standings (read from the database on the measurements' cadence). */
  readonly standings: AuditStandings;
  /** Stops sharing measurements (first, with the other background tasks). */
  stopBackground(): Promise<void>;
  /** Gives the leases back and stops listening for recalls (after the closes are written). */
  stop(): Promise<void>;
}

/** What the chat pipeline is wired from. */
export interface ChatDeps {
  readonly db: Database;
  /** The audits' options (tests: seeded choices, no timers; the statistics and standing). */
  readonly auditOptions?: AuditOptions | undefined;
  readonly sealer: Sealer;
  readonly catalog: Catalog;
  readonly permits: PermitReader;
  readonly permitClock: () => number;
  readonly endpointCache: TtlCache<Hex, EndpointSecret>;
  readonly upstream: UpstreamClient;
  readonly instanceId: string;
  readonly clock: () => number;
  /** Unix milliseconds (cooldowns): the clock above at its finer grain. */
  readonly nowMs: () => number;
  readonly acquireStream: (apiKeyId: string) => (() => void) | Promise<() => void>;
  readonly metrics: ReturnType<typeof createMetrics>;
  readonly tracer: ChatTracer | undefined;
  /** The gateway's token counters (createTokenCounters, checked at start-up). */
  readonly tokens: TokenCounters;
  readonly logger: Logger;
  /** The chain, for x402 payments' simulations. */
  readonly chain: PublicClient;
}

export async function wireChat(config: Config, deps: ChatDeps): Promise<ChatWiring> {
  const { db, instanceId, logger } = deps;
  const upstreamChat = createUpstreamChat(deps.upstream, {
    timeoutMs: config.upstreamTimeoutMs,
    idleTimeoutMs: config.upstreamIdleTimeoutMs,
    minTokensPerSecond: config.upstreamMinTokensPerSecond,
  });
  // Reservations and finalisations that arrive together share one transaction (group commit,
  // migration 006); bounded, so behind a hung batch a request fails closed in time.
  const perRequest = createPgLedger(db.pool, {
    instanceId,
    maxQueued: config.ledgerQueueMax,
    maxWaitMs: config.ledgerQueueWaitMs,
  });
  const { leaseSignals, leased } = await wireLeases(config, deps, perRequest);
  const { measurements, measurementSync } = await wireMeasurements(config, deps);
  const cooldownBounds = {
    maxSeconds: config.upstreamCooldownMaxSeconds,
    defaultSeconds: Math.min(
      config.upstreamCooldownDefaultSeconds,
      config.upstreamCooldownMaxSeconds,
    ),
  };
  // Set here at once by a 429, written for the others, read on the measurements' cadence.
  const cooldowns = createOfferCooldowns({
    store: createPgCooldownStore(db.pool),
    bounds: cooldownBounds,
    intervalMs: measurementSyncMs,
    nowMs: deps.nowMs,
    onError: (error) =>
      logger.warn(
        { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
        "sharing offer cooldowns failed",
      ),
  });
  await cooldowns.refresh().catch(() => undefined);
  cooldowns.start();
  // The blind audits (AUDIT_PERMITS): their corpus checked now, their sample of clients' shapes.
  const standingStore = createPgAuditStandingStore(db.pool);
  const audits = await prepareAudits(
    config,
    { audits: deps.auditOptions },
    { ...deps, standings: standingStore },
  );
  // Written by the process that judged the market; every process reads them on this round, and
  // once before it serves, so a restart routes nothing to an excluded offer (a failed read is
  // logged; the first round reads them again).
  const standings = createAuditStandings({
    store: standingStore,
    intervalMs: measurementSyncMs,
    onError: (error) =>
      logger.warn(
        { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
        "reading offer audit standings failed",
      ),
  });
  await standings
    .refresh()
    .catch((error: unknown) =>
      logger.warn(
        { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
        "reading offer audit standings failed",
      ),
    );
  standings.start();
  const inference = createInference({
    catalog: deps.catalog,
    observeRequest: audits?.shapes.observe,
    permits: deps.permits,
    quotes: createPgQuoteStore(db.pool),
    ledger: leased ?? perRequest,
    endpoints: createPgEndpointLookup({
      pool: db.pool,
      sealer: deps.sealer,
      cache: deps.endpointCache,
    }),
    upstream: upstreamChat,
    idempotency: createPgIdempotencyStore(db.pool, { instanceId }),
    clock: deps.clock,
    permitClock: deps.permitClock,
    bodyLimitBytes: config.bodyLimitBytes,
    jsonBounds: { maxDepth: config.maxJsonDepth, maxArrayItems: config.maxJsonArrayItems },
    idempotencyMaxResultBytes: config.idempotencyMaxResultBytes,
    // The error's first line only: never the key, the API key or the answer.
    onIdempotencyResultLost: ({ requestId, error }) =>
      logger.warn(
        { requestId, error: (error as Error).message?.split("\n")[0] ?? "failed" },
        "idempotency result not stored: the answer was delivered and charged, its replay is lost",
      ),
    acquireStream: deps.acquireStream,
    tokens: deps.tokens,
    hiddenReasoningRatioMax: BigInt(config.hiddenReasoningRatioMax),
    observer: deps.metrics.chat,
    tracer: deps.tracer,
    measurements,
    cooldowns,
    cooldownBounds,
    // A payer's soft threshold, read on its capped authorization's ledger (migration 041).
    thresholds: createAuthorizationThresholds(db.pool),
    audits: standings,
    // Claimed on the endpoint's row: one request per offer per window, fleet-wide (migration 025).
    x402: wireX402(config, { db, chain: deps.chain }),
    wakeFees: createWakeFees({
      claim: createPgWakeFeeClaimer(db.pool),
      windowSeconds: config.wakeFeeWindowSeconds,
      clock: deps.clock,
      onError: (offerId, error) =>
        logger.warn(
          { offerId, error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
          "claiming a wake fee failed: the request is charged none",
        ),
    }),
  });
  return {
    inference,
    audits,
    leased,
    reputation: offerReputation(measurements, measurementSync, standings),
    measurementSync,
    cooldowns,
    standings,
    stopBackground: async () => {
      await standings.stop();
      await cooldowns.stop();
      await measurementSync.stop();
    },
    async stop() {
      await leased?.stop();
      await leaseSignals?.close();
    },
  };
}

/**
 * Plain requests are admitted against reservation leases (absent when RESERVATION_LEASES is off).
 */
async function wireLeases(config: Config, deps: ChatDeps, perRequest: Ledger) {
  const { db, instanceId, logger } = deps;
  // Plain requests are admitted against reservation leases; their records and closes are
  // written in batches (migration 010). Processes recall each other's idle leases over
  // LISTEN/NOTIFY (PostgreSQL only: the embedded PGlite serves one connection, and one process
  // has no one to recall from).
  const leaseSignals: PgLeaseSignals | undefined =
    config.reservationLeases && db.kind === "postgres"
      ? createPgLeaseSignals(db, {
          instanceId,
          logger: logger.child({ component: "leases" }),
        })
      : undefined;
  try {
    await leaseSignals?.ready();
  } catch (error) {
    await leaseSignals?.close();
    throw error;
  }
  const leased = config.reservationLeases
    ? createLeasedLedger({
        signals: leaseSignals,
        store: createPgLeaseStore(db.pool, {
          maxQueued: config.ledgerQueueMax,
          maxWaitMs: config.ledgerQueueWaitMs,
        }),
        fallback: perRequest,
        instanceId,
        clock: deps.clock,
        permitClock: deps.permitClock,
        staleAfterSeconds: config.orphanAfterSeconds,
        maxQueued: config.ledgerQueueMax,
        maxWaitMs: config.ledgerQueueWaitMs,
      })
    : undefined;
  leased?.start();
  return { leaseSignals, leased };
}

/** The offers' measurements and their sharing round, started. */
async function wireMeasurements(config: Config, deps: ChatDeps) {
  const { db, instanceId, logger } = deps;
  // What is measured of offers over the reputation's window (`provider.sort`, the catalog),
  // shared through the database every few seconds (migrations 019, 023): routing and the
  // catalog read memory only.
  const measurements = createOfferMeasurements({
    instanceId,
    windowSeconds: config.reputationWindowSeconds,
  });
  const measurementSync = createMeasurementSync({
    measurements,
    store: createPgMeasurementStore(db.pool),
    instanceId,
    intervalMs: measurementSyncMs,
    clock: deps.clock,
    onError: (error) =>
      logger.warn(
        { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
        "sharing offer measurements failed",
      ),
  });
  // Offers excluded for diverging usage claims are out of routing from the first request (a
  // failed read is logged; the first round, 5 s later, reads them again).
  await measurementSync
    .readExclusions()
    .catch((error: unknown) =>
      logger.warn(
        { error: error instanceof Error ? error.message.split("\n")[0] : "failed" },
        "reading usage exclusions failed",
      ),
    );
  measurementSync.start();
  return { measurements, measurementSync };
}
