import { hashSeed, mixSeed, unitOf } from "../../src/domain/audits/random.js";

/**
 * A small deterministic language model for the audits' tests and bench (issue 39): a bigram
 * sampler over a fixed vocabulary of {@link VOCAB_SIZE} made-up words, whose next-token
 * distributions are derived from a seed (the same seed, the same model, in every process). A
 * test fixture, never imported by `src/`: fake providers answer with it, the statistics judge
 * what they answered.
 *
 * - {@link createReferenceLm}: the model an offer sells. About {@link BORDER_SHARE} of its
 *   contexts are border inputs: their top-2 next tokens nearly tie ({@link BORDER_GAP} nats
 *   apart) and the third is at least {@link BORDER_MARGIN} nats below, as the near-ties B3IT
 *   finds on real models.
 * - {@link createQuantizedLm}: the same model with every next-token probability multiplied by
 *   a fixed factor in [1 - bound, 1 + bound] (default ±{@link QUANTIZATION_BOUND} = ±10%), then
 *   renormalised: a quantized copy of the same weights, honest.
 * - {@link createImpostorLm}: another model: the reference's log-probabilities mixed with
 *   another seed's (half and half by default: another model entirely; 0.2 of the other's in the
 *   bench's "close" impostor, about 0.3 nats/token from the reference, as a 2×-cheaper model).
 * - {@link createMixerLm}: the impostor for 30% of requests, chosen per request.
 *
 * Every model also has kernel noise, as real serving stacks do: each request adds a uniform
 * ±{@link KERNEL_NOISE} nats to the logits it compares at temperature 0 (so honest answers to a
 * border input flip between its two near-tied tokens) and ±{@link SCORE_NOISE} nats per token
 * to the log-probabilities it reports.
 */

/** Words in the vocabulary. */
export const VOCAB_SIZE = 300;
/**
 * Logit scale of the reference's next-token distributions (standard normal × this): about 1.6
 * nats per token, in the range of real models' text at temperature 1.
 */
export const LOGIT_SCALE = 4;
/** Share of contexts planted as border inputs. */
export const BORDER_SHARE = 0.15;
/** Gap between the two near-tied tokens of a border input, nats. */
export const BORDER_GAP = 0.005;
/** Minimum gap between the second and third tokens of a border input, nats. */
export const BORDER_MARGIN = 1.5;
/** Multiplicative bound of the quantized variant's perturbation of each probability. */
export const QUANTIZATION_BOUND = 0.1;
/** Per-request noise on the logits compared at temperature 0 (uniform ±), nats. */
export const KERNEL_NOISE = 0.05;
/** Per-token noise on reported log-probabilities (uniform ±), nats. */
export const SCORE_NOISE = 0.01;
/** Candidates perturbed by kernel noise at temperature 0 (the rest trail by far more). */
const NOISY_TOP = 8;

const syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "da", "fu", "go", "pe"];

/** The vocabulary: {@link VOCAB_SIZE} distinct made-up words, fixed. */
export const VOCAB: readonly string[] = (() => {
  const words = new Set<string>();
  for (let i = 0; words.size < VOCAB_SIZE; i++) {
    const h = mixSeed(0x5eed, i);
    const count = 1 + (h % 3);
    let word = "";
    for (let s = 0; s < count; s++) word += syllables[mixSeed(h, s) % syllables.length]!;
    words.add(word);
  }
  return [...words];
})();

const indexOf = new Map(VOCAB.map((word, i) => [word, i]));

/** A word's token index (an unknown word hashes onto one). */
export function tokenOf(word: string): number {
  return indexOf.get(word) ?? hashSeed(word) % VOCAB_SIZE;
}

/** The context a prompt leaves: its last word. */
export function contextOf(prompt: string): number {
  const words = prompt.trim().split(/\s+/);
  return tokenOf(words[words.length - 1] ?? "");
}

export interface GenerateOptions {
  /** 0: greedy (with kernel noise); otherwise the softmax of log-probabilities / temperature. */
  readonly temperature: number;
  readonly maxTokens: number;
  /** The request's randomness (sampling, kernel noise, a mixer's choice). */
  readonly rng: () => number;
  /** Return the log-probability (temperature 1) of each generated token. */
  readonly logprobs?: boolean;
}

export interface Generation {
  readonly text: string;
  readonly tokens: readonly string[];
  readonly logprobs?: readonly number[];
  /** Which model answered (a mixer's choice shows here; a fixture's own record). */
  readonly servedBy: string;
}

export interface Score {
  /** Mean log-probability per token of the continuation, nats (teacher-forced). */
  readonly meanLogprob: number;
  readonly tokenLogprobs: readonly number[];
}

export interface NgramLm {
  readonly name: string;
  /** Normalised log-probabilities of the next token after `context` (cached, do not mutate). */
  logProbs(context: number): Float64Array;
  generate(prompt: string, options: GenerateOptions): Generation;
  /** Teacher-forced log-probabilities of `continuation` after `prompt`. */
  score(prompt: string, continuation: string, rng: () => number): Score;
}

function normal(hash: number): number {
  const u1 = Math.max(unitOf(hash), 1e-12);
  const u2 = unitOf(mixSeed(hash, 0xb0c5));
  return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
}

function normalise(logits: Float64Array): Float64Array {
  let max = -Infinity;
  for (const v of logits) if (v > max) max = v;
  let sum = 0;
  for (const v of logits) sum += Math.exp(v - max);
  const log = max + Math.log(sum);
  return logits.map((v) => v - log);
}

/** Builds a model from a function giving the (unnormalised) logits of a context. */
function modelOf(name: string, logitsOf: (context: number) => Float64Array): NgramLm {
  const cache = new Map<number, { logp: Float64Array; cdf: Float64Array; top: number[] }>();
  const entry = (context: number) => {
    let found = cache.get(context);
    if (!found) {
      const logp = normalise(logitsOf(context));
      const cdf = new Float64Array(VOCAB_SIZE);
      let acc = 0;
      logp.forEach((v, i) => (cdf[i] = acc += Math.exp(v)));
      const top = [...logp.keys()].sort((a, b) => logp[b]! - logp[a]!).slice(0, NOISY_TOP);
      found = { logp, cdf, top };
      cache.set(context, found);
    }
    return found;
  };
  const next = (context: number, temperature: number, rng: () => number): number => {
    const { logp, cdf, top } = entry(context);
    if (temperature === 0) {
      let best = top[0]!;
      let bestValue = -Infinity;
      for (const token of top) {
        const value = logp[token]! + (2 * rng() - 1) * KERNEL_NOISE;
        if (value > bestValue) [best, bestValue] = [token, value];
      }
      return best;
    }
    if (temperature === 1) {
      const u = rng() * cdf[VOCAB_SIZE - 1]!;
      let lo = 0;
      let hi = VOCAB_SIZE - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (cdf[mid]! < u) lo = mid + 1;
        else hi = mid;
      }
      return lo;
    }
    const scaled = normalise(logp.map((v) => v / temperature));
    let u = rng();
    for (let i = 0; i < VOCAB_SIZE; i++) if ((u -= Math.exp(scaled[i]!)) <= 0) return i;
    return VOCAB_SIZE - 1;
  };
  return {
    name,
    logProbs: (context) => entry(context).logp,
    generate(prompt, options) {
      let context = contextOf(prompt);
      const tokens: string[] = [];
      const logprobs: number[] = [];
      for (let i = 0; i < options.maxTokens; i++) {
        const token = next(context, options.temperature, options.rng);
        tokens.push(VOCAB[token]!);
        if (options.logprobs) logprobs.push(entry(context).logp[token]!);
        context = token;
      }
      const text = tokens.join(" ");
      return { text, tokens, servedBy: name, ...(options.logprobs ? { logprobs } : {}) };
    },
    score(prompt, continuation, rng) {
      let context = contextOf(prompt);
      const tokenLogprobs = continuation
        .trim()
        .split(/\s+/)
        .map((word) => {
          const token = tokenOf(word);
          const value = entry(context).logp[token]! + (2 * rng() - 1) * SCORE_NOISE;
          context = token;
          return value;
        });
      const meanLogprob = tokenLogprobs.reduce((a, b) => a + b, 0) / tokenLogprobs.length;
      return { meanLogprob, tokenLogprobs };
    },
  };
}

function seededLogits(seed: number, context: number): Float64Array {
  const logits = new Float64Array(VOCAB_SIZE);
  for (let j = 0; j < VOCAB_SIZE; j++) logits[j] = LOGIT_SCALE * normal(mixSeed(seed, context, j));
  return logits;
}

/** Whether a context of the reference with this seed is a planted border input. */
export function isBorderContext(seed: number, context: number): boolean {
  return unitOf(mixSeed(seed, context, 0xb0da)) < BORDER_SHARE;
}

/** The reference model: seeded logits, with border inputs planted in some contexts. */
export function createReferenceLm(seed: number, name = `reference-${seed}`): NgramLm {
  return modelOf(name, (context) => {
    const logits = seededLogits(seed, context);
    if (!isBorderContext(seed, context)) return logits;
    const order = [...logits.keys()].sort((a, b) => logits[b]! - logits[a]!);
    const top = logits[order[0]!]!;
    logits[order[1]!] = top - BORDER_GAP;
    for (const j of order.slice(2)) logits[j] = Math.min(logits[j]!, top - BORDER_MARGIN);
    return logits;
  });
}

/** The same model, each probability multiplied by a fixed factor within ±bound, renormalised. */
export function createQuantizedLm(
  base: NgramLm,
  seed: number,
  bound = QUANTIZATION_BOUND,
  name = `quantized-${seed}`,
): NgramLm {
  return modelOf(name, (context) =>
    base
      .logProbs(context)
      .map((v, j) => v + Math.log(1 + bound * (2 * unitOf(mixSeed(seed, context, j)) - 1))),
  );
}

/** Another model: the reference's log-probabilities mixed with another seed's logits. */
export function createImpostorLm(
  base: NgramLm,
  seed: number,
  ownWeight = 0.5,
  name = `impostor-${seed}`,
): NgramLm {
  return modelOf(name, (context) => {
    const other = seededLogits(seed, context);
    return base.logProbs(context).map((v, j) => (1 - ownWeight) * v + ownWeight * other[j]!);
  });
}

/** The impostor for `share` of requests (chosen per request from its rng), else the honest. */
export function createMixerLm(
  honest: NgramLm,
  impostor: NgramLm,
  share = 0.3,
  name = "mixer",
): NgramLm {
  const pick = (rng: () => number) => (rng() < share ? impostor : honest);
  return {
    name,
    logProbs: (context) => honest.logProbs(context),
    generate: (prompt, options) => pick(options.rng).generate(prompt, options),
    score: (prompt, continuation, rng) => pick(rng).score(prompt, continuation, rng),
  };
}

/**
 * Border inputs found black-box, as an auditor finds them on the anchor: each one-word prompt is
 * asked `tries` times at temperature 0; those answered with two or more distinct first tokens
 * are near-ties. Returned in vocabulary order.
 */
export function findBorderPrompts(lm: NgramLm, rng: () => number, tries = 8): string[] {
  return VOCAB.filter((word) => {
    const seen = new Set<string>();
    for (let i = 0; i < tries; i++) {
      seen.add(lm.generate(word, { temperature: 0, maxTokens: 1, rng }).tokens[0]!);
    }
    return seen.size > 1;
  });
}

/** The visible text of a request's last user message (the prompt the fixture answers). */
export function promptOf(body: Record<string, unknown>): string {
  const messages = (body.messages ?? []) as { role?: string; content?: unknown }[];
  const last = [...messages].reverse().find((m) => m.role === "user");
  const content = last?.content;
  if (typeof content === "string") return content;
  if (Array.isArray(content))
    return content.map((p) => String((p as { text?: unknown }).text ?? "")).join("");
  return "";
}
