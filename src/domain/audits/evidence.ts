import type { Hex } from "viem";
import { leaveOneOutMedoid, offerDistances } from "./reference.js";
import { eBenjaminiHochberg, ebhThreshold } from "./statistics.js";
import {
  borderProfile,
  borderTest,
  logprobTest,
  majorityBorderProfile,
  mmdTest,
  referenceLogprobs,
  type PermutationCache,
  type TestOutcome,
} from "./tests.js";
import type {
  AuditSample,
  AuditState,
  JudgeMarket,
  ModelAuditInput,
  OfferAuditVerdict,
} from "./types.js";

/**
 * The market's decision (issue 39, item 4; docs/decisions/audits.md): per offer, each test's
 * anytime-valid e-value against the offer's reference, averaged over its tests; then e-BH across
 * every audited offer of the market at two levels.
 */

/**
 * The flag level: among the offers flagged at any moment, the expected share that serve the
 * model they sell (whose e-processes are supermartingales) is at most 5%; and each such offer is
 * ever flagged with probability at most 5% (Ville's inequality: it needs e ≥ m/(α k) ≥ 1/α).
 */
export const ALPHA_FLAG = 0.05;
/** The exclusion level: the same guarantees at 0.1%; excluded offers leave routing. */
export const ALPHA_EXCLUDE = 0.001;

export interface JudgeOptions {
  readonly alphaFlag?: number;
  readonly alphaExclude?: number;
  /**
   * Permutation tests already computed, by their batches' content (a batch's p-value never
   * changes once its samples exist): a long-lived judge keeps one; bounded by `cacheLimit`.
   */
  readonly cache?: PermutationCache;
  readonly cacheLimit?: number;
}

interface Judged {
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly reference: OfferAuditVerdict["reference"];
  readonly outcomes: readonly TestOutcome[];
  readonly audited: boolean;
  readonly eValue: number;
  /** The anchor the operator named: the reference itself, never flagged (see below). */
  readonly anchor?: boolean;
}

/** The e-value of an offer: the mean of its tests' (a mean of e-values is an e-value). */
function combined(outcomes: readonly TestOutcome[]): number {
  const used = outcomes.filter((o) => o.evidence.samples > 0);
  return used.length === 0 ? 1 : used.reduce((sum, o) => sum + o.evidence.eValue, 0) / used.length;
}

function judgeOffer(
  input: ModelAuditInput,
  offerId: Hex,
  referenceOf: (offerId: Hex) => OfferAuditVerdict["reference"],
  cache: PermutationCache | undefined,
): Judged {
  const samples = input.offers.get(offerId) ?? [];
  const reference = referenceOf(offerId);
  if (reference.offerId === undefined) {
    return { offerId, modelId: input.modelId, reference, outcomes: [], audited: false, eValue: 1 };
  }
  const theirs: readonly AuditSample[] = input.offers.get(reference.offerId) ?? [];
  const values = referenceLogprobs(theirs, input.referenceLogprobs);
  // The border profile of the majority is every other offer's, not the medoid's alone: an
  // honest medoid that is quantized answers one token of a near-tie where the others answer two.
  const profile =
    reference.kind === "anchor"
      ? borderProfile(theirs)
      : majorityBorderProfile(
          [...input.offers].filter(([id]) => id !== offerId).map(([, others]) => others),
        );
  const referenceProbes =
    reference.kind === "anchor"
      ? theirs.filter((s) => s.test === "border_probe").length
      : [...input.offers]
          .filter(([id]) => id !== offerId)
          .reduce(
            (sum, [, others]) => sum + others.filter((s) => s.test === "border_probe").length,
            0,
          );
  const outcomes = [
    borderTest(samples, profile, referenceProbes),
    mmdTest(samples, theirs, { offerId, referenceId: reference.offerId }, cache),
    logprobTest(samples, values, input.referenceLogprobs?.size ? values.size : theirs.length),
  ];
  return {
    offerId,
    modelId: input.modelId,
    reference,
    outcomes,
    audited: outcomes.some((o) => o.audited),
    eValue: combined(outcomes),
  };
}

function judgeModel(input: ModelAuditInput, cache: PermutationCache | undefined): Judged[] {
  const ids = [...input.offers.keys()].sort();
  const anchor =
    input.anchorOfferId !== undefined && input.offers.has(input.anchorOfferId)
      ? input.anchorOfferId
      : undefined;
  let distances: number[][] | undefined;
  const referenceOf = (offerId: Hex): OfferAuditVerdict["reference"] => {
    if (anchor !== undefined && offerId !== anchor) return { kind: "anchor", offerId: anchor };
    // The anchor itself, or every offer of a model without one: the majority of the others.
    distances ??= offerDistances(ids.map((id) => input.offers.get(id) ?? []));
    const medoid = leaveOneOutMedoid(ids, distances, offerId);
    return medoid === undefined ? { kind: "majority" } : { kind: "majority", offerId: medoid };
  };
  return ids.map((offerId) => ({
    ...judgeOffer(input, offerId, referenceOf, cache),
    anchor: offerId === anchor,
  }));
}

/** The judge, with its options; {@link judgeMarket} is the one with the defaults. */
export function createJudgeMarket(options: JudgeOptions = {}): JudgeMarket {
  const alphaFlag = options.alphaFlag ?? ALPHA_FLAG;
  const alphaExclude = options.alphaExclude ?? ALPHA_EXCLUDE;
  const cacheLimit = options.cacheLimit ?? 100_000;
  return (models) => {
    const cache = options.cache;
    if (cache && cache.size > cacheLimit) cache.clear();
    const judged = models.flatMap((model) => judgeModel(model, cache));
    const audited = judged.filter((j) => j.audited);
    const eValues = audited.map((j) => j.eValue);
    const flag = eBenjaminiHochberg(eValues, alphaFlag);
    const exclude = eBenjaminiHochberg(eValues, alphaExclude);
    const m = audited.length;
    return judged.map((j): OfferAuditVerdict => {
      const index = audited.indexOf(j);
      // The anchor is the reference the operator vouches for: its e-value against the majority
      // is shown (the majority differs from it), but it is never flagged or excluded by it. With
      // one other offer, that offer is the "majority": an impostor would otherwise take the
      // anchor down with it.
      const flagged = index >= 0 && flag.rejected.has(index) && j.anchor !== true;
      const excluded = index >= 0 && exclude.rejected.has(index) && j.anchor !== true;
      const state: AuditState = !j.audited
        ? "unaudited"
        : excluded
          ? "excluded"
          : flagged
            ? "flagged"
            : "passing";
      return {
        offerId: j.offerId,
        modelId: j.modelId,
        state,
        eValue: j.eValue,
        flagAt: ebhThreshold(Math.max(m, 1), alphaFlag, flag.count, flagged),
        excludeAt: ebhThreshold(Math.max(m, 1), alphaExclude, exclude.count, excluded),
        reference: j.reference,
        tests: j.outcomes.map((o) => o.evidence),
      };
    });
  };
}

/** The market's decision with the default levels ({@link ALPHA_FLAG}, {@link ALPHA_EXCLUDE}). */
export const judgeMarket: JudgeMarket = createJudgeMarket();
