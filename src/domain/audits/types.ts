import type { Hex } from "viem";

/**
 * Audits (issue 39; DESIGN.md section 12; docs/decisions/audits.md): the contract between the
 * three parts of the auditor, so each can be built and tested on its own.
 *
 * - The traffic (src/domain/audits/traffic*, the runner in src/app/audits.ts) sends blind audit
 *   requests to every active offer and to its model's reference, and stores what came back as
 *   {@link AuditSample}s.
 * - The statistics (src/domain/audits/statistics.ts, evidence.ts) turn an offer's samples and its
 *   reference's into {@link AuditTestEvidence} per test and, across the whole market, into one
 *   {@link OfferAuditVerdict} per offer (anytime-valid e-values, false-discovery control).
 * - The standing (src/adapters/pg/audits.ts, src/domain/audits/standing.ts) keeps the verdicts in
 *   PostgreSQL (every process and restart agrees), shows them in the catalog, quotes and console,
 *   sorts flagged offers last, takes excluded ones out of routing until a verification of the
 *   offer passes again, and serves `provider.require_audited`.
 *
 * Numbers a statistic produces are not money: they are JS numbers, stored and shown as decimal
 * strings with a fixed number of significant digits where they leave the process.
 */

/** The tests an audit runs. */
export type AuditTestName =
  /** Border-input probes at temperature 0: the first tokens graded against the reference's. */
  | "border_probe"
  /** Completions at temperature 1 against the reference's: MMD, Hamming kernel, permutations. */
  | "mmd"
  /** Teacher-forced log-probabilities of fixed sequences against the reference's values. */
  | "logprob";

/**
 * What an offer's audits say today.
 * - `unaudited`: not enough evidence yet either way (new offers, or no reference for the model).
 * - `passing`: audited, evidence below the first threshold.
 * - `flagged`: beyond the first threshold: `model_mismatch` in the catalog, console, reputation;
 *   routing sorts it after every offer that is not flagged.
 * - `excluded`: beyond the stronger threshold: out of routing (pinned requests included, 503
 *   `offer_model_mismatch`) until a verification of the offer passes again, which clears its
 *   evidence (the standing keeps `clearedAt`; samples older than it no longer count).
 */
export type AuditState = "unaudited" | "passing" | "flagged" | "excluded";

/**
 * Where the audits' prompts come from: the operator's own corpus (`AUDIT_CORPUS_DIR`), or the
 * one shipped with the gateway, which anyone can read (a provider can tell audits by it).
 */
export type AuditCorpusSource = "shipped" | "operator";

/** One audit observation: one answer of one offer (or of the reference) to one audit prompt. */
export interface AuditSample {
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly test: AuditTestName;
  /** Which prompt of the corpus (or which border input / fixed sequence) was asked. */
  readonly promptId: string;
  /** For `border_probe` and `mmd`: the visible text answered (the first characters suffice). */
  readonly text?: string | undefined;
  /** For `logprob`: mean log-probability per token of the fixed sequence, nats (negative). */
  readonly meanLogprob?: number | undefined;
  readonly atMs: number;
}

/** What one test says of one offer, as the operator sees it. */
export interface AuditTestEvidence {
  readonly test: AuditTestName;
  /** Samples of the offer the test used (since the last clearing). */
  readonly samples: number;
  /** Samples of the reference it compared them with. */
  readonly referenceSamples: number;
  /** The test's own statistic (MMD², the share of first tokens matched, mean nats/token gap). */
  readonly statistic: number;
  /** Its p-value when the test computes one (permutation tests), else undefined. */
  readonly pValue?: number | undefined;
  /** The e-value this test contributes (1: no evidence; larger: evidence of another model). */
  readonly eValue: number;
}

/** The decision for one offer across every test, after false-discovery control. */
export interface OfferAuditVerdict {
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly state: AuditState;
  /** The offer's accumulated e-value (anytime-valid: a product or mixture of its tests'). */
  readonly eValue: number;
  /** The e-value that flags at this market's size (e-BH at the flag level), and excludes. */
  readonly flagAt: number;
  readonly excludeAt: number;
  /** The reference the offer was compared with: an anchor offer, or the model's majority. */
  readonly reference: { readonly kind: "anchor" | "majority" | "data"; readonly offerId?: Hex };
  readonly tests: readonly AuditTestEvidence[];
}

/** A verdict as stored: what every process reads. */
export interface OfferAuditStanding extends OfferAuditVerdict {
  readonly updatedAtMs: number;
  /** When the evidence was last cleared by a passing verification (undefined: never). */
  readonly clearedAtMs?: number | undefined;
}

/** One model's evidence, as the statistics read it. */
export interface ModelAuditInput {
  readonly modelId: Hex;
  /** The anchor offer the operator named for the model; undefined: the majority of its offers. */
  readonly anchorOfferId?: Hex | undefined;
  /** Every audited offer's samples since its last clearing, oldest first (the anchor's too). */
  readonly offers: ReadonlyMap<Hex, readonly AuditSample[]>;
  /** Reference values shipped for the model (pinned files), by sequence id: mean nats/token. */
  readonly referenceLogprobs?: ReadonlyMap<string, number> | undefined;
}

/**
 * The market's decision (implemented by src/domain/audits/evidence.ts): deterministic (seeded
 * from the offer id and its batches), so every process computing it from the same samples agrees.
 */
export type JudgeMarket = (models: readonly ModelAuditInput[]) => OfferAuditVerdict[];
