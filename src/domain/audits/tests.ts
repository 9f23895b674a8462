import {
  bettingEValue,
  eValueOfP,
  firstToken,
  mmdPermutationTest,
  type PermutationTest,
  type TextSample,
} from "./statistics.js";
import { hashSeed, mixSeed } from "./random.js";
import type { AuditSample, AuditTestEvidence } from "./types.js";

/**
 * Each audit test of one offer against its reference, as an e-value (issue 39, items 3 to 5;
 * docs/decisions/audits.md, "What each test's null is"). Pure: the same samples, the same
 * evidence.
 */

/**
 * Border probes: the largest share of an honest offer's first tokens (temperature 0, border
 * inputs) that may fall outside the tokens the reference itself answered to the same input.
 * The null is composite: "misses happen at most this often", so honest near-tie flips (kernel
 * noise, quantization: the answer moves to the other near-tied token, which the reference also
 * answers) are not evidence; an impostor's first token leaves the reference's near-tie set. The
 * bench measured honest and quantized offers' miss rates (bench/figures/audits.md).
 */
export const BORDER_NULL_MISS_RATE = 0.1;
/** Reference answers to a border input before the offer's answers to it are graded. */
export const BORDER_MIN_REFERENCE = 5;
/** Graded probes before the border test counts toward an offer being audited. */
export const BORDER_MIN_SAMPLES = 20;

/**
 * MMD batches: the offer's temperature-1 completions are taken in order in batches of this size,
 * each compared with the next unused batch of the reference's (disjoint, so under the null the
 * batches' p-values are independent and their calibrated e-values multiply into a test
 * martingale).
 */
export const MMD_BATCH = 30;
/** Full batches before the MMD test counts toward an offer being audited. */
export const MMD_MIN_BATCHES = 1;

/**
 * Logprob scoring: the tolerance, nats per token. The null is "the mean absolute gap between the
 * offer's mean log-probability of a fixed sequence and the reference's is at most this": the
 * honest spread of one model at q4 and q8 measured 0.00 ± 0.07 nats/token (research notes,
 * section C.1), so honest quantization is not evidence; a 2×-cheaper impostor's gap was 0.27.
 */
export const LOGPROB_TOLERANCE = 0.07;
/** Gaps are clipped at this (nats/token), so one wild answer bets at most a bounded amount. */
export const LOGPROB_CLIP = 1;
/** Scored sequences before the logprob test counts toward an offer being audited. */
export const LOGPROB_MIN_SAMPLES = 10;

/** The evidence of one test and whether it has reached its minimum. */
export interface TestOutcome {
  readonly evidence: AuditTestEvidence;
  readonly audited: boolean;
}

function ofTest(samples: readonly AuditSample[], test: AuditSample["test"]): AuditSample[] {
  return samples.filter((s) => s.test === test);
}

/**
 * Without an anchor, a first token belongs to a border input's majority profile when the other
 * offers answered it at least this share of the time, each offer weighing alike (the mean of
 * their frequencies): an honest near-tie's two tokens are each answered about half the time by
 * the honest majority, while one impostor model behind a few offers stays below it.
 */
export const BORDER_MAJORITY_SHARE = 0.2;

/** The first tokens graded as the reference's, per border input. */
export type BorderProfile = ReadonlyMap<string, ReadonlySet<string>>;

/** The first tokens a reference answered to each border input it answered often enough. */
export function borderProfile(reference: readonly AuditSample[]): BorderProfile {
  const profile = new Map<string, { tokens: Set<string>; count: number }>();
  for (const s of ofTest(reference, "border_probe")) {
    const entry = profile.get(s.promptId) ?? { tokens: new Set<string>(), count: 0 };
    entry.tokens.add(firstToken(s.text ?? ""));
    entry.count++;
    profile.set(s.promptId, entry);
  }
  const graded = new Map<string, Set<string>>();
  for (const [promptId, entry] of profile) {
    if (entry.count >= BORDER_MIN_REFERENCE) graded.set(promptId, entry.tokens);
  }
  return graded;
}

/** The majority profile of several offers (see {@link BORDER_MAJORITY_SHARE}). */
export function majorityBorderProfile(others: readonly (readonly AuditSample[])[]): BorderProfile {
  const byPrompt = new Map<
    string,
    { shares: Map<string, number>; offers: number; count: number }
  >();
  for (const samples of others) {
    const mine = new Map<string, Map<string, number>>();
    for (const s of ofTest(samples, "border_probe")) {
      const counts = mine.get(s.promptId) ?? new Map<string, number>();
      const token = firstToken(s.text ?? "");
      counts.set(token, (counts.get(token) ?? 0) + 1);
      mine.set(s.promptId, counts);
    }
    for (const [promptId, counts] of mine) {
      const entry = byPrompt.get(promptId) ?? { shares: new Map(), offers: 0, count: 0 };
      const total = [...counts.values()].reduce((a, b) => a + b, 0);
      for (const [token, n] of counts) {
        entry.shares.set(token, (entry.shares.get(token) ?? 0) + n / total);
      }
      entry.offers++;
      entry.count += total;
      byPrompt.set(promptId, entry);
    }
  }
  const graded = new Map<string, Set<string>>();
  for (const [promptId, entry] of byPrompt) {
    if (entry.count < BORDER_MIN_REFERENCE) continue;
    const tokens = [...entry.shares]
      .filter(([, share]) => share / entry.offers >= BORDER_MAJORITY_SHARE)
      .map(([token]) => token);
    graded.set(promptId, new Set(tokens));
  }
  return graded;
}

/** The offer's border probes, in order, graded 1 (a miss) or 0 against a profile. */
export function borderMisses(offer: readonly AuditSample[], profile: BorderProfile): number[] {
  const misses: number[] = [];
  for (const s of ofTest(offer, "border_probe")) {
    const tokens = profile.get(s.promptId);
    if (tokens) misses.push(tokens.has(firstToken(s.text ?? "")) ? 0 : 1);
  }
  return misses;
}

/** Border probes: the betting e-process of misses against {@link BORDER_NULL_MISS_RATE}. */
export function borderTest(
  offer: readonly AuditSample[],
  profile: BorderProfile,
  referenceSamples: number,
): TestOutcome {
  const misses = borderMisses(offer, profile);
  const missed = misses.reduce((a, b) => a + b, 0);
  return {
    evidence: {
      test: "border_probe",
      samples: misses.length,
      referenceSamples,
      statistic: misses.length === 0 ? 1 : 1 - missed / misses.length,
      eValue: bettingEValue(misses, BORDER_NULL_MISS_RATE),
    },
    audited: misses.length >= BORDER_MIN_SAMPLES,
  };
}

/** Permutation tests already computed, by their samples (a judge's cache; see evidence.ts). */
export type PermutationCache = Map<string, PermutationTest>;

function textSamples(samples: readonly AuditSample[]): TextSample[] {
  return samples.map((s) => ({ promptId: s.promptId, text: s.text ?? "" }));
}

function batchKey(seed: number, batch: readonly TextSample[]): string {
  const text = batch.map((s) => `${s.promptId}\u0000${s.text}`).join("\u0001");
  return `${seed}:${hashSeed(text)}:${hashSeed(`${text.length}${text}`)}:${text.length}`;
}

/**
 * MMD: batch b of the offer against batch b of the reference, each a permutation test seeded by
 * the offer, the reference and b; the product of the calibrated p-values is the e-value. The
 * statistic and p-value shown are the latest batch's.
 */
export function mmdTest(
  offer: readonly AuditSample[],
  reference: readonly AuditSample[],
  seedOf: { readonly offerId: string; readonly referenceId: string },
  cache?: PermutationCache,
): TestOutcome {
  const mine = textSamples(ofTest(offer, "mmd"));
  const theirs = textSamples(ofTest(reference, "mmd"));
  const batches = Math.min(
    Math.floor(mine.length / MMD_BATCH),
    Math.floor(theirs.length / MMD_BATCH),
  );
  let eValue = 1;
  let last: PermutationTest | undefined;
  for (let b = 0; b < batches; b++) {
    const x = mine.slice(b * MMD_BATCH, (b + 1) * MMD_BATCH);
    const y = theirs.slice(b * MMD_BATCH, (b + 1) * MMD_BATCH);
    const seed = mixSeed(hashSeed(seedOf.offerId), hashSeed(seedOf.referenceId), b);
    const key = cache ? batchKey(seed, [...x, ...y]) : "";
    let result = cache?.get(key);
    if (!result) {
      result = mmdPermutationTest(x, y, seed);
      cache?.set(key, result);
    }
    eValue *= eValueOfP(result.pValue);
    last = result;
  }
  return {
    evidence: {
      test: "mmd",
      samples: batches * MMD_BATCH,
      referenceSamples: theirs.length,
      statistic: last?.statistic ?? 0,
      pValue: last?.pValue,
      eValue,
    },
    audited: batches >= MMD_MIN_BATCHES,
  };
}

/** The reference's value per fixed sequence: shipped data, else the mean of its samples. */
export function referenceLogprobs(
  reference: readonly AuditSample[],
  data?: ReadonlyMap<string, number>,
): ReadonlyMap<string, number> {
  if (data && data.size > 0) return data;
  const sums = new Map<string, { sum: number; count: number }>();
  for (const s of ofTest(reference, "logprob")) {
    if (s.meanLogprob === undefined || !Number.isFinite(s.meanLogprob)) continue;
    const entry = sums.get(s.promptId) ?? { sum: 0, count: 0 };
    entry.sum += s.meanLogprob;
    entry.count++;
    sums.set(s.promptId, entry);
  }
  return new Map([...sums].map(([id, { sum, count }]) => [id, sum / count]));
}

/** The offer's gaps (offer − reference, nats/token) in order, for sequences with a reference. */
export function logprobGaps(
  offer: readonly AuditSample[],
  values: ReadonlyMap<string, number>,
): number[] {
  const gaps: number[] = [];
  for (const s of ofTest(offer, "logprob")) {
    const value = values.get(s.promptId);
    if (value === undefined || s.meanLogprob === undefined) continue;
    // A non-finite claim is as far as a claim can be.
    gaps.push(Number.isFinite(s.meanLogprob) ? s.meanLogprob - value : -LOGPROB_CLIP);
  }
  return gaps;
}

/** Logprob scoring: the betting e-process of |gap| against {@link LOGPROB_TOLERANCE}. */
export function logprobTest(
  offer: readonly AuditSample[],
  values: ReadonlyMap<string, number>,
  referenceSamples: number,
): TestOutcome {
  const gaps = logprobGaps(offer, values);
  const scaled = gaps.map((g) => Math.min(Math.abs(g), LOGPROB_CLIP) / LOGPROB_CLIP);
  return {
    evidence: {
      test: "logprob",
      samples: gaps.length,
      referenceSamples,
      statistic: gaps.length === 0 ? 0 : gaps.reduce((a, b) => a + b, 0) / gaps.length,
      eValue: bettingEValue(scaled, LOGPROB_TOLERANCE / LOGPROB_CLIP),
    },
    audited: gaps.length >= LOGPROB_MIN_SAMPLES,
  };
}
