import type { Logger } from "pino";
import { loadAuditCorpus } from "../adapters/audits/corpus.js";
import type { Database } from "../adapters/pg/database.js";
import { createPgAuditSampleStore, createPgAuditSpendStore } from "../adapters/pg/audit-traffic.js";
import { connectAudits } from "../clients/inference.js";
import type { Config } from "../config.js";
import { apiKeyIdOf } from "../domain/api-key-check.js";
import { createAuditRunner, type AuditRunner, type SaveVerdicts } from "../domain/audits/runner.js";
import { createShapeSample, type ShapeSample } from "../domain/audits/shapes.js";
import { cryptoRandom, type AuditCorpus, type Random } from "../domain/audits/traffic.js";
import type { JudgeMarket } from "../domain/audits/types.js";
import type { Catalog } from "../domain/catalog.js";
import type { createMetrics } from "../runtime/metrics.js";

/**
 * The blind audits' wiring (issue 39; src/domain/audits/): the sample of clients' request shapes
 * the chat pipeline feeds (before the chat is wired), and the runner (once the gateway listens:
 * audits reach it over its own gRPC port, as internal callers do).
 */

/** What a caller of startGateway may give the audits (tests: a seeded choice, no timers). */
export interface AuditOptions {
  /** The statistics (src/domain/audits/evidence.ts); absent: samples are collected only. */
  readonly judge?: JudgeMarket | undefined;
  /** The standing's store of verdicts (src/adapters/pg/audits.ts). */
  readonly saveVerdicts?: SaveVerdicts | undefined;
  readonly rng?: Random | undefined;
  /** Unix milliseconds (samples' times, the budget's day). */
  readonly nowMs?: (() => number) | undefined;
  /** false: no timers (a test calls `runOnce`). Default true. */
  readonly start?: boolean | undefined;
}

/** What the audits need before the gateway listens: the corpus (checked), the shape sample. */
export interface PreparedAudits {
  readonly shapes: ShapeSample;
  readonly corpus: AuditCorpus;
}

/**
 * The corpus, read and checked against its pins at start-up (a changed file stops the start),
 * and the shape sample audits copy from; undefined when audits are not configured.
 */
export async function prepareAudits(config: Config): Promise<PreparedAudits | undefined> {
  const audits = config.audits;
  if (audits === undefined) return undefined;
  const ownKey = apiKeyIdOf(audits.auditApiKey);
  return {
    shapes: createShapeSample({ ignoredKey: () => ownKey }),
    corpus: await loadAuditCorpus(),
  };
}

export interface AuditWiring {
  readonly runner: AuditRunner;
  /** Stops the timers, waits for audits under way, closes the connection. */
  close(): Promise<void>;
}

export function wireAudits(
  config: Config,
  deps: {
    readonly url: string;
    readonly db: Database;
    readonly catalog: Catalog;
    readonly prepared: PreparedAudits | undefined;
    readonly metrics: ReturnType<typeof createMetrics>;
    /** Unix seconds (the gateway's clock). */
    readonly clock: () => number;
    readonly logger: Logger;
    readonly options?: AuditOptions | undefined;
  },
): AuditWiring | undefined {
  const audits = config.audits;
  const prepared = deps.prepared;
  if (audits === undefined || prepared === undefined) return undefined;
  const options = deps.options ?? {};
  const connection = connectAudits(deps.url, audits.auditApiKey);
  const runner = createAuditRunner({
    catalog: deps.catalog,
    permits: audits.permits,
    anchors: audits.anchors,
    corpus: prepared.corpus,
    shapes: prepared.shapes,
    client: connection.client,
    spend: createPgAuditSpendStore(deps.db.pool),
    budget: { perOffer: audits.budgetPerOffer, perModel: audits.budgetPerModel },
    samples: createPgAuditSampleStore(deps.db.pool),
    observer: deps.metrics.audits,
    judge: options.judge,
    saveVerdicts: options.saveVerdicts,
    perOfferPerDay: audits.requestsPerOfferPerDay,
    evidenceWindowMs: audits.evidenceWindowDays * 86_400_000,
    evaluateEveryMs: audits.evaluateIntervalMs,
    rng: options.rng ?? cryptoRandom,
    nowMs: options.nowMs ?? Date.now,
    clock: deps.clock,
    logger: deps.logger.child({ component: "audits" }),
  });
  if (options.start !== false) runner.start();
  return {
    runner,
    close: async () => {
      await runner.stop();
      connection.close();
    },
  };
}
