import { seededRandom } from "./random.js";

/**
 * The audits' statistics (issue 39, items 3 to 5; docs/decisions/audits.md): pure functions from
 * samples to statistics, p-values and e-values. Nothing here reads a clock or `Math.random`: the
 * same samples give the same numbers in every process.
 */

/**
 * Characters of a completion the MMD test compares (Model Equality Testing compares the first
 * 100; our completions are asked for about that many).
 */
export const MMD_LENGTH = 100;
/**
 * Permutations of the MMD test. The p-value is (1 + #{permuted ≥ observed}) / (1 + this): exact
 * (never below its level under the null) for any count; 499 makes the smallest p-value 1/500.
 */
export const MMD_PERMUTATIONS = 499;
/** Longest first token graded by border probes, characters (a longer first word is cut here). */
export const FIRST_TOKEN_CHARS = 32;

/** A sample the two-sample tests read: the prompt it answered and the text. */
export interface TextSample {
  readonly promptId: string;
  readonly text: string;
}

/**
 * The first token of an answer, as near as the text tells without the model's tokenizer: a
 * CJK character alone (those scripts write no spaces, and their tokens are a character or two),
 * else the first run of letters, marks and digits, else the first other character; cut at
 * {@link FIRST_TOKEN_CHARS}. "Blue", "Blue," and "Blue sky" begin alike: a tokenizer splits the
 * comma off, so a punctuation mark is not another first token.
 */
export function firstToken(text: string): string {
  const match =
    /^(?:[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]|[\p{L}\p{M}\p{N}]+|\S)/u.exec(
      text.trimStart(),
    );
  return match ? match[0].slice(0, FIRST_TOKEN_CHARS) : "";
}

/** The first `length` UTF-16 code units of a text, padded with 0 (padding matches padding). */
export function encodeForKernel(text: string, length = MMD_LENGTH): Uint16Array {
  const codes = new Uint16Array(length);
  for (let i = 0; i < Math.min(length, text.length); i++) codes[i] = text.charCodeAt(i);
  return codes;
}

/** The Hamming kernel: the share of the first `length` positions where two texts agree. */
export function hammingKernel(a: Uint16Array, b: Uint16Array): number {
  let same = 0;
  for (let i = 0; i < a.length; i++) if (a[i] === b[i]) same++;
  return same / a.length;
}

/**
 * The kernel between samples is the Hamming kernel of their texts when they answered the same
 * prompt and 0 otherwise (Model Equality Testing's kernel on prompt–completion pairs), so only
 * pairs within a prompt count: they are listed once, with the kernel's value.
 */
interface KernelPairs {
  readonly i: Int32Array;
  readonly j: Int32Array;
  readonly k: Float64Array;
}

function kernelPairs(samples: readonly TextSample[], length: number): KernelPairs {
  const codes = samples.map((s) => encodeForKernel(s.text, length));
  const byPrompt = new Map<string, number[]>();
  samples.forEach((s, index) => {
    const list = byPrompt.get(s.promptId);
    if (list) list.push(index);
    else byPrompt.set(s.promptId, [index]);
  });
  const is: number[] = [];
  const js: number[] = [];
  const ks: number[] = [];
  for (const members of byPrompt.values()) {
    for (let a = 0; a < members.length; a++) {
      for (let b = a + 1; b < members.length; b++) {
        is.push(members[a]!);
        js.push(members[b]!);
        ks.push(hammingKernel(codes[members[a]!]!, codes[members[b]!]!));
      }
    }
  }
  return { i: Int32Array.from(is), j: Int32Array.from(js), k: Float64Array.from(ks) };
}

/**
 * The unbiased MMD² between the samples labelled 1 (`n` of them) and 0 (`m`): the mean kernel
 * within each side (distinct pairs) minus twice the mean across. `pairs` holds every pair once
 * (only pairs within one prompt, the kernel being 0 across prompts).
 */
function mmdOfLabels(pairs: KernelPairs, labels: Uint8Array, n: number, m: number): number {
  let xx = 0;
  let yy = 0;
  let xy = 0;
  for (let p = 0; p < pairs.k.length; p++) {
    const a = labels[pairs.i[p]!]!;
    const b = labels[pairs.j[p]!]!;
    const k = pairs.k[p]!;
    if (a !== b) xy += k;
    else if (a === 1) xx += k;
    else yy += k;
  }
  // Each unordered pair stands for two ordered ones within a side, and one across counted once
  // per ordered pair (x, y).
  return (2 * xx) / (n * (n - 1)) + (2 * yy) / (m * (m - 1)) - (2 * xy) / (n * m);
}

/** MMD² (unbiased, Hamming kernel on the first `length` characters, within prompts). */
export function mmdSquared(
  x: readonly TextSample[],
  y: readonly TextSample[],
  length = MMD_LENGTH,
): number {
  if (x.length < 2 || y.length < 2) return 0;
  const labels = new Uint8Array(x.length + y.length);
  labels.fill(1, 0, x.length);
  return mmdOfLabels(kernelPairs([...x, ...y], length), labels, x.length, y.length);
}

export interface PermutationTest {
  readonly statistic: number;
  readonly pValue: number;
}

/**
 * The two-sample permutation test of MMD²: labels are shuffled within each prompt (the null is
 * that, given the prompt, the offer's completions and the reference's are exchangeable), the
 * shuffles drawn from a PRNG seeded by `seed`. The p-value (1 + #{T_perm ≥ T}) / (1 + P) is valid
 * for any P: under the null, P(p ≤ a) ≤ a for every a.
 */
export function mmdPermutationTest(
  x: readonly TextSample[],
  y: readonly TextSample[],
  seed: number,
  options: { readonly length?: number; readonly permutations?: number } = {},
): PermutationTest {
  const permutations = options.permutations ?? MMD_PERMUTATIONS;
  if (x.length < 2 || y.length < 2) return { statistic: 0, pValue: 1 };
  const pooled = [...x, ...y];
  const pairs = kernelPairs(pooled, options.length ?? MMD_LENGTH);
  const labels = new Uint8Array(pooled.length);
  labels.fill(1, 0, x.length);
  const statistic = mmdOfLabels(pairs, labels, x.length, y.length);
  const strata = new Map<string, number[]>();
  pooled.forEach((s, index) => {
    const list = strata.get(s.promptId);
    if (list) list.push(index);
    else strata.set(s.promptId, [index]);
  });
  const groups = [...strata.values()].filter((g) => g.length > 1);
  const random = seededRandom(seed);
  const shuffled = labels.slice();
  let atLeast = 0;
  for (let p = 0; p < permutations; p++) {
    for (const group of groups) {
      // Fisher–Yates over the group's labels, in place.
      for (let a = group.length - 1; a > 0; a--) {
        const b = Math.floor(random() * (a + 1));
        const ia = group[a]!;
        const ib = group[b]!;
        const t = shuffled[ia]!;
        shuffled[ia] = shuffled[ib]!;
        shuffled[ib] = t;
      }
    }
    if (mmdOfLabels(pairs, shuffled, x.length, y.length) >= statistic - 1e-12) atLeast++;
  }
  return { statistic, pValue: (1 + atLeast) / (1 + permutations) };
}

/**
 * Calibrator weight and exponent: a p-value becomes the e-value
 * (1 - w) + w · κ · p^(κ - 1). For any κ in (0, 1), κ p^(κ-1) integrates to 1 over a uniform p,
 * so its expectation under a valid p-value is at most 1, and so is the mixture's; the weight
 * w = 1/2 keeps a batch that looks null from costing more than half the evidence gathered so far
 * (a product of pure calibrators decays fast over null-looking batches). κ = 1/4 comes near
 * the largest value at our smallest p-value, 1/500 (κ p^(κ-1) is 26.4 there; the best κ,
 * 1/ln 500 ≈ 0.16, gives 29.5 and costs more on middling p-values): the batch's e-value is 13.7.
 */
export const CALIBRATOR_WEIGHT = 0.5;
export const CALIBRATOR_KAPPA = 0.25;

/** A p-value turned into an e-value by the calibrator above. */
export function eValueOfP(p: number): number {
  const clamped = Math.min(1, Math.max(p, Number.MIN_VALUE));
  return (
    1 - CALIBRATOR_WEIGHT + CALIBRATOR_WEIGHT * CALIBRATOR_KAPPA * clamped ** (CALIBRATOR_KAPPA - 1)
  );
}

/**
 * Most of 1/μ₀ a bet may stake: 1 + λ (y - μ₀) stays at least 1/2 for y = 0, so one honest
 * observation never halves the wealth more than once.
 */
const MAX_BET_SHARE = 0.5;

/**
 * The betting e-process for bounded observations y ∈ [0, 1] against the composite null
 * "E[y | the past] ≤ μ₀": wealth Π (1 + λ_t (y_t − μ₀)), λ_t chosen from the observations before
 * t only (aGRAPA: the growth-optimal bet for the running mean and variance, clipped to
 * [0, {@link MAX_BET_SHARE}/μ₀]). Under the null it is a nonnegative supermartingale starting at
 * 1, so by Ville's inequality P(it ever reaches 1/α) ≤ α: anytime-valid, whatever the order or
 * the number of samples at which it is read. Returns its value after the last observation.
 */
export function bettingEValue(observations: readonly number[], nullMean: number): number {
  let wealth = 1;
  // A prior of one pseudo-observation at the null's mean, so the first bet is 0.
  let count = 1;
  let sum = nullMean;
  let sumSquares = nullMean * nullMean;
  for (const raw of observations) {
    const y = Math.min(1, Math.max(0, raw));
    const mean = sum / count;
    const variance = Math.max(sumSquares / count - mean * mean, 1e-4);
    const edge = mean - nullMean;
    const bet = Math.min(Math.max(edge / (variance + edge * edge), 0), MAX_BET_SHARE / nullMean);
    wealth *= 1 + bet * (y - nullMean);
    count++;
    sum += y;
    sumSquares += y * y;
  }
  return wealth;
}

/** The result of e-BH at one level. */
export interface EbhResult {
  /** Indices (into the given e-values) rejected. */
  readonly rejected: ReadonlySet<number>;
  /** The number rejected, k*. */
  readonly count: number;
}

/**
 * e-BH (Wang and Ramdas, 2022): with e-values e_1..e_m, reject the k* largest, where k* is the
 * largest k whose k-th largest e-value is at least m / (α k). The false discovery rate is at
 * most α · m₀/m ≤ α under any dependence between the e-values (the offers are compared with one
 * reference, so theirs are dependent).
 */
export function eBenjaminiHochberg(eValues: readonly number[], alpha: number): EbhResult {
  const m = eValues.length;
  const order = [...eValues.keys()].sort((a, b) => eValues[b]! - eValues[a]! || a - b);
  let count = 0;
  for (let k = 1; k <= m; k++) if (eValues[order[k - 1]!]! >= m / (alpha * k)) count = k;
  return { rejected: new Set(order.slice(0, count)), count };
}

/**
 * The e-value an offer needs to be rejected by e-BH at `alpha` among `m`, when `count` others
 * are: m / (α (count + 1)) for one not yet rejected, m / (α count) for one that is.
 */
export function ebhThreshold(m: number, alpha: number, count: number, rejected: boolean): number {
  return m / (alpha * Math.max(1, rejected ? count : count + 1));
}

/** The median of `values` (the mean of the two middle ones for an even count); not empty. */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((x, y) => x - y);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}
