import type { Hex } from "viem";
import type { Logger } from "pino";
import { isEligible, type Catalog } from "../catalog.js";
import { auditDay, type AuditBudget, type AuditSpendStore } from "./budget.js";
import { answerLogprobs, LOGPROB_TOKENS, logprobScore } from "./logprobs.js";
import type { RequestShape, ShapeSample } from "./shapes.js";
import {
  answerText,
  auditBody,
  borderPrompts,
  foundBorders,
  pickBorderPrompt,
  logprobPrompts,
  mmdPrompts,
  nextGapMs,
  pick,
  pickAuditTest,
  pickShape,
  sampleChars,
  sequenceId,
  type AuditBody,
  type AuditCorpus,
  type AuditTarget,
  type Random,
  type TrafficTest,
} from "./traffic.js";
import type {
  AuditSample,
  AuditTestName,
  JudgeMarket,
  ModelAuditInput,
  OfferAuditVerdict,
} from "./types.js";

/**
 * The auditor (issue 39, items 1 and 2): at random times it picks an audited offer, a test, a
 * prompt and a client's framing (traffic.ts), reserves the audit's most against the day's
 * budget, sends it through the gateway's own inference path (a typed client of its
 * InferenceService, authenticated with the operator's audit API key, paid by the audit permit:
 * the provider is paid as for any request), settles the budget with the real charge, and
 * stores what came back. Periodically it reads each model's samples, asks the statistics
 * (`JudgeMarket`) for the verdicts and hands them to the standing.
 */

/** One audit request as the gateway answered it. */
export interface AuditAnswer {
  readonly requestId?: Hex | undefined;
  /** The visible text's events, in order (`answerText` reads each). */
  readonly events: readonly { readonly data: unknown; readonly event?: string | undefined }[];
  /** The answer completed (a failed one is charged what the ledger says, and not sampled). */
  readonly completed: boolean;
  /** Credits charged to the audit permit; undefined when it could not be read. */
  readonly charged: bigint | undefined;
}

/** How audits reach the gateway: its QuoteService and InferenceService, as a client's do. */
export interface AuditClient {
  /** A quote pinned to `offerId` for `body`: the offer it names and its most. */
  quote(
    body: AuditBody,
    offerId: Hex,
  ): Promise<{ quoteId: Hex; offerId: Hex; maximumCredits: bigint }>;
  send(body: AuditBody, permitId: Hex, quoteId: Hex): Promise<AuditAnswer>;
}

/** An audit sample as stored, with the request that produced it. */
export interface StoredAuditSample extends AuditSample {
  readonly requestId?: Hex | undefined;
}

/** Where samples are kept (src/adapters/pg/audit-traffic.ts, migration 043). */
export interface AuditSampleStore {
  add(sample: StoredAuditSample): Promise<void>;
  /** A model's samples (every offer's) since `sinceMs`, oldest first. */
  since(modelId: Hex, sinceMs: number): Promise<AuditSample[]>;
}

/**
 * The standing's port (src/adapters/pg/audits.ts): keeps the verdicts every process reads.
 * `readAtMs`: when the samples they were judged from were read (a verdict is not written over an
 * offer whose evidence a passing verification cleared after that).
 */
export type SaveVerdicts = (
  verdicts: readonly OfferAuditVerdict[],
  readAtMs: number,
) => Promise<void>;

/**
 * When each offer's evidence was last cleared (a verification of it passed after an exclusion,
 * standing.ts): samples taken before no longer count against it.
 */
export type ClearedAt = () => Promise<ReadonlyMap<Hex, number>>;

/** What audits report to the metrics (src/runtime/metrics.ts). */
export interface AuditObserver {
  sent(modelId: Hex, offerId: Hex, test: AuditTestName): void;
  /**
   * An audit drawn and not sent: no client of the model sent a framing it could copy
   * (`no_shape`), or the day's budget could not take its most (`over_budget`).
   */
  skipped(modelId: Hex, test: AuditTestName, reason: "no_shape" | "over_budget"): void;
  spent(modelId: Hex, offerId: Hex, credits: bigint): void;
}

export interface AuditRunnerDeps {
  readonly catalog: Pick<Catalog, "routingView" | "directory">;
  /** The audit permit of each audited model (ModelID -> PermitID). */
  readonly permits: ReadonlyMap<Hex, Hex>;
  /** The anchor offer the operator named for a model (ModelID -> OfferID). */
  readonly anchors: ReadonlyMap<Hex, Hex>;
  readonly corpus: AuditCorpus;
  readonly shapes: ShapeSample;
  readonly client: AuditClient;
  readonly spend: AuditSpendStore;
  readonly budget: AuditBudget;
  readonly samples: AuditSampleStore;
  readonly observer?: AuditObserver | undefined;
  /** The statistics (src/domain/audits/evidence.ts); absent: samples are only collected. */
  readonly judge?: JudgeMarket | undefined;
  readonly saveVerdicts?: SaveVerdicts | undefined;
  /** Absent: no offer's evidence was ever cleared. */
  readonly clearedAt?: ClearedAt | undefined;
  /** Audits per offer per day on average. */
  readonly perOfferPerDay: number;
  /** How far back the evaluation reads samples. */
  readonly evidenceWindowMs: number;
  /** Between two evaluations. */
  readonly evaluateEveryMs: number;
  readonly rng: Random;
  /** Unix milliseconds: samples' times and the budget's day. */
  readonly nowMs: () => number;
  /** Unix seconds, the gateway's clock: which offers routing would serve now. */
  readonly clock: () => number;
  readonly logger?: Logger | undefined;
}

/** What one audit came to. */
export type AuditOutcome =
  | { readonly status: "idle" }
  /** No client of the model sent a framing the test could copy (shapes.ts): nothing sent. */
  | { readonly status: "no_shape"; readonly target: AuditTarget; readonly test: TrafficTest }
  | {
      readonly status: "over_budget";
      readonly target: AuditTarget;
      readonly test: TrafficTest;
      /** What the audit would have reserved (its quote's most): more than the budget has left. */
      readonly maximumCredits: bigint;
    }
  | {
      readonly status: "sent";
      readonly target: AuditTarget;
      readonly test: TrafficTest;
      readonly promptId: string;
      readonly answer: AuditAnswer;
      readonly charged: bigint;
    }
  | { readonly status: "failed"; readonly target: AuditTarget; readonly error: unknown };

export interface AuditRunner {
  /** The offers audited now (every routable offer of each model with an audit permit). */
  targets(): Promise<AuditTarget[]>;
  /** One audit now. */
  runOnce(): Promise<AuditOutcome>;
  /** The gap before the next audit, drawn now (ms). */
  nextDelayMs(targets: number): number;
  /** Reads each audited model's samples, judges the market and saves the verdicts. */
  evaluate(): Promise<OfferAuditVerdict[]>;
  /** Starts the timers (audits at random times, evaluations on a round). */
  start(): void;
  /** Stops the timers and waits for the audits under way. */
  stop(): Promise<void>;
}

export function createAuditRunner(deps: AuditRunnerDeps): AuditRunner {
  // The near-ties found on each model's reference (ModelID -> prompt ids), renewed by every
  // evaluation from the samples it reads.
  const borders = new Map<Hex, ReadonlySet<string>>();
  const running = new Set<Promise<unknown>>();
  let stopped = true;
  let auditTimer: NodeJS.Timeout | undefined;
  let evaluateTimer: NodeJS.Timeout | undefined;

  const targets = async (): Promise<AuditTarget[]> => {
    const out: AuditTarget[] = [];
    for (const [modelId, permitId] of deps.permits) {
      const modelName = deps.catalog.directory.publicId(modelId);
      let view;
      try {
        view = await deps.catalog.routingView(modelName);
      } catch {
        continue; // a model not (or no longer) served: nothing to audit
      }
      const now = deps.clock();
      // The offers a client's request could reach (the anchor among them): active, verified,
      // registered.
      for (const offer of view.offers)
        if (isEligible(offer, view.model, now))
          out.push({
            modelId,
            modelName,
            offerId: offer.offerId,
            permitId,
            logprobs: offer.verifiedFeatures?.includes("logprobs") === true,
          });
    }
    return out;
  };

  const runner: AuditRunner = {
    targets,
    runOnce: async () => {
      const target = pick(deps.rng, await targets());
      if (target === undefined) return { status: "idle" };
      return audit(deps, target, borders.get(target.modelId));
    },
    nextDelayMs: (count) => nextGapMs(deps.rng, deps.perOfferPerDay, count),
    evaluate: () => evaluate(deps, borders),
    start() {
      if (!stopped) return;
      stopped = false;
      const schedule = async () => {
        const count = (await targets().catch(() => [])).length;
        // No offer yet: look again in an hour's worth of one offer's gaps.
        const delay = Math.min(runner.nextDelayMs(Math.max(count, 1)), 2 ** 31 - 1);
        if (stopped) return;
        auditTimer = setTimeout(() => {
          const run = runner
            .runOnce()
            .catch((error: unknown) =>
              deps.logger?.warn({ error: messageOf(error) }, "audit failed"),
            )
            .finally(() => running.delete(run));
          running.add(run);
          void schedule();
        }, delay);
        auditTimer.unref();
      };
      void schedule();
      evaluateTimer = setInterval(() => {
        const run = runner
          .evaluate()
          .catch((error: unknown) =>
            deps.logger?.warn({ error: messageOf(error) }, "audit evaluation failed"),
          )
          .finally(() => running.delete(run));
        running.add(run);
      }, deps.evaluateEveryMs);
      evaluateTimer.unref();
    },
    async stop() {
      stopped = true;
      clearTimeout(auditTimer);
      clearInterval(evaluateTimer);
      await Promise.allSettled([...running]);
    },
  };
  return runner;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? (error.message.split("\n")[0] ?? "failed") : "failed";
}

/** One audit of `target`: choose, reserve, send, settle, sample. */
async function audit(
  deps: AuditRunnerDeps,
  target: AuditTarget,
  borders: ReadonlySet<string> | undefined,
): Promise<AuditOutcome> {
  const { rng, corpus } = deps;
  const now = deps.nowMs();
  const shapes = deps.shapes.shapes(target.modelId);
  const test = pickAuditTest(rng, target, shapes);
  const prompt =
    test === "mmd"
      ? pick(rng, mmdPrompts(corpus, target.modelId, now))
      : test === "logprob"
        ? pick(rng, logprobPrompts(corpus, target.modelId, now))
        : pickBorderPrompt(rng, borderPrompts(corpus, target.modelId), borders);
  if (prompt === undefined) return { status: "idle" };
  const shape = pickShape(rng, shapes, test);
  if (shape === undefined) {
    deps.observer?.skipped(target.modelId, test, "no_shape");
    return { status: "no_shape", target, test };
  }
  const body = auditBody(corpus, rng, { shape, prompt, modelName: target.modelName });
  let quote;
  try {
    quote = await deps.client.quote(body, target.offerId);
  } catch (error) {
    return { status: "failed", target, error };
  }
  const day = auditDay(now);
  const { modelId, offerId } = target;
  const reserved = quote.maximumCredits;
  if (!(await deps.spend.reserve(day, modelId, offerId, reserved, deps.budget))) {
    deps.observer?.skipped(modelId, test, "over_budget");
    return { status: "over_budget", target, test, maximumCredits: reserved };
  }
  let answer: AuditAnswer | undefined;
  try {
    answer = await deps.client.send(body, target.permitId, quote.quoteId);
  } finally {
    // What the ledger charged; unknown (the call failed before it said): the whole reservation,
    // so the budget never counts less than the permit paid.
    const charged = answer?.charged ?? reserved;
    await deps.spend.settle(day, modelId, offerId, reserved, charged);
    deps.observer?.sent(modelId, offerId, test);
    deps.observer?.spent(modelId, offerId, charged < reserved ? charged : reserved);
  }
  const charged = answer.charged ?? reserved;
  if (answer.completed) {
    const whole = answer.events.map((e) => answerText(body.dialect, e.data, e.event)).join("");
    const sample: StoredAuditSample = {
      offerId,
      modelId,
      test,
      promptId: prompt.id,
      text: whole.slice(0, sampleChars),
      atMs: now,
      requestId: answer.requestId,
    };
    await deps.samples.add(test === "logprob" ? scored(sample, answer, whole, shape) : sample);
  }
  return { status: "sent", target, test, promptId: prompt.id, answer, charged };
}

/**
 * A logprob challenge's sample: the answer's score (logprobs.ts) under the sequence it scored.
 * Values that fail a check, or that were asked for and not given, score `-Infinity` under the
 * sequence an honest answer of the shape's length would have had.
 */
function scored(
  sample: StoredAuditSample,
  answer: AuditAnswer,
  whole: string,
  shape: RequestShape,
): StoredAuditSample {
  const score = logprobScore(answerLogprobs(answer.events.map((e) => e.data)), whole);
  const limit = Number(shape.params["max_completion_tokens"] ?? shape.params["max_tokens"] ?? 0);
  const tokens =
    score.tokens > 0 ? score.tokens : Math.min(LOGPROB_TOKENS, limit > 0 ? limit : LOGPROB_TOKENS);
  return { ...sample, promptId: sequenceId(sample.promptId, tokens), meanLogprob: score.mean };
}

/** Every audited model's samples in the window, judged together (false discovery across all). */
async function evaluate(
  deps: AuditRunnerDeps,
  borders: Map<Hex, ReadonlySet<string>>,
): Promise<OfferAuditVerdict[]> {
  if (deps.judge === undefined) return [];
  const readAtMs = deps.nowMs();
  const since = readAtMs - deps.evidenceWindowMs;
  // Read before the samples: a clearing after this read is caught when the verdicts are saved.
  const cleared = (await deps.clearedAt?.()) ?? new Map<Hex, number>();
  const models: ModelAuditInput[] = [];
  for (const modelId of deps.permits.keys()) {
    const offers = new Map<Hex, AuditSample[]>();
    for (const sample of await deps.samples.since(modelId, since)) {
      if (sample.atMs < (cleared.get(sample.offerId) ?? 0)) continue;
      let list = offers.get(sample.offerId);
      if (list === undefined) offers.set(sample.offerId, (list = []));
      list.push(sample);
    }
    if (offers.size === 0) continue;
    // The reference's temperature-0 answers: the anchor's, or every offer's without one.
    const anchor = deps.anchors.get(modelId);
    borders.set(
      modelId,
      foundBorders(anchor === undefined ? [...offers.values()].flat() : (offers.get(anchor) ?? [])),
    );
    models.push({
      modelId,
      anchorOfferId: deps.anchors.get(modelId),
      offers,
      referenceLogprobs: deps.corpus.referenceLogprobs.get(modelId),
    });
  }
  const verdicts = deps.judge(models);
  await deps.saveVerdicts?.(verdicts, readAtMs);
  return verdicts;
}
