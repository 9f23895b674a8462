import type { Logger } from "pino";
import { loadOperatorCorpus } from "../adapters/audits/corpus.js";
import type { Database } from "../adapters/pg/database.js";
import { createPgAuditSampleStore, createPgAuditSpendStore } from "../adapters/pg/audit-traffic.js";
import { connectAudits, type AuditConnection } from "../clients/inference.js";
import type { Config } from "../config.js";
import { auditCorpusSource } from "../config/audits.js";
import { apiKeyIdOf } from "../domain/api-key-check.js";
import { createAuditRunner, type AuditRunner, type SaveVerdicts } from "../domain/audits/runner.js";
import { createShapeSample, type ShapeSample } from "../domain/audits/shapes.js";
import { cryptoRandom, type Random } from "../domain/audits/traffic.js";
import { judgeMarket } from "../domain/audits/evidence.js";
import type { JudgeMarket } from "../domain/audits/types.js";
import { clearedTimes, type AuditStandingStore } from "../domain/audits/standing.js";
import type { Catalog } from "../domain/catalog.js";
import type { createMetrics } from "../runtime/metrics.js";

/**
 * The blind audits' wiring (issue 39; src/domain/audits/): the sample of clients' request shapes
 * the chat pipeline feeds (before the chat is wired), and the runner (once the gateway listens:
 * audits reach it over its own gRPC port, as internal callers do).
 */

/** What a caller of startGateway may give the audits (tests: a seeded choice, no timers). */
export interface AuditOptions {
  /** The statistics; absent: src/domain/audits/evidence.ts's `judgeMarket`. */
  readonly judge?: JudgeMarket | undefined;
  /** Where verdicts go; absent: the standing's store (src/adapters/pg/audits.ts). */
  readonly saveVerdicts?: SaveVerdicts | undefined;
  readonly rng?: Random | undefined;
  /** Unix milliseconds (samples' times, the budget's day). */
  readonly nowMs?: (() => number) | undefined;
  /** false: no timers (a test calls `runOnce`). Default true. */
  readonly start?: boolean | undefined;
}

/** The audits of one gateway: wired before it listens, started once it does. */
export interface AuditWiring {
  /** The sample of clients' request shapes the chat pipeline feeds. */
  readonly shapes: ShapeSample;
  /** Connects to the gateway at `url` (its own gRPC port) and starts the runner. */
  start(url: string): AuditRunner;
  /** Stops the timers, waits for audits under way, closes the connection. */
  close(): Promise<void>;
}

/**
 * The audits, when configured: the corpus (AUDIT_CORPUS_DIR, else the shipped one, with a
 * warning) read and checked against its pins now (a changed file stops the start), the shape
 * sample, and the runner once the gateway listens.
 */
export async function prepareAudits(
  config: Config,
  options: { readonly audits?: AuditOptions | undefined },
  deps: {
    readonly db: Database;
    readonly catalog: Catalog;
    readonly metrics: ReturnType<typeof createMetrics>;
    /** Unix seconds (the gateway's clock). */
    readonly clock: () => number;
    readonly logger: Logger;
    /** The standings every process routes by (the verdicts are written there). */
    readonly standings: AuditStandingStore;
  },
): Promise<AuditWiring | undefined> {
  const audits = config.audits;
  if (audits === undefined) return undefined;
  const ownKey = apiKeyIdOf(audits.auditApiKey);
  const shapes = createShapeSample({ ignoredKey: () => ownKey });
  const corpus = await loadOperatorCorpus(audits.corpusDir);
  const source = auditCorpusSource(audits)!;
  deps.metrics.auditCorpus(source);
  if (source === "shipped")
    deps.logger.warn(
      { component: "audits", corpus: "shipped" },
      "audits ask the shipped corpus's prompts, which anyone can read: a provider that reads " +
        "them can answer audits honestly and clients otherwise; set AUDIT_CORPUS_DIR to a " +
        "corpus of your own (docs/operators.md, Blind audits)",
    );
  const spend = createPgAuditSpendStore(deps.db.pool);
  const samples = createPgAuditSampleStore(deps.db.pool);
  const settings = options.audits ?? {};
  let connection: AuditConnection | undefined;
  let runner: AuditRunner | undefined;
  return {
    shapes,
    start(url) {
      connection = connectAudits(url, audits.auditApiKey);
      runner = createAuditRunner({
        catalog: deps.catalog,
        permits: audits.permits,
        anchors: audits.anchors,
        corpus,
        shapes,
        client: connection.client,
        spend,
        budget: { perOffer: audits.budgetPerOffer, perModel: audits.budgetPerModel },
        samples,
        observer: deps.metrics.audits,
        judge: settings.judge ?? judgeMarket,
        saveVerdicts:
          settings.saveVerdicts ??
          ((verdicts, readAtMs) =>
            deps.standings.save(verdicts, { readAtMs, nowMs: (settings.nowMs ?? Date.now)() })),
        clearedAt: () => clearedTimes(deps.standings),
        perOfferPerDay: audits.requestsPerOfferPerDay,
        evidenceWindowMs: audits.evidenceWindowDays * 86_400_000,
        evaluateEveryMs: audits.evaluateIntervalMs,
        rng: settings.rng ?? cryptoRandom,
        nowMs: settings.nowMs ?? Date.now,
        clock: deps.clock,
        logger: deps.logger.child({ component: "audits" }),
      });
      if (settings.start !== false) runner.start();
      return runner;
    },
    async close() {
      await runner?.stop();
      connection?.close();
    },
  };
}
