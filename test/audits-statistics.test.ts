import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { ALPHA_FLAG, createJudgeMarket, judgeMarket } from "../src/domain/audits/evidence.js";
import { mixSeed, randomInt, seededRandom } from "../src/domain/audits/random.js";
import {
  bettingEValue,
  eBenjaminiHochberg,
  ebhThreshold,
  encodeForKernel,
  eValueOfP,
  firstToken,
  hammingKernel,
  mmdPermutationTest,
  mmdSquared,
} from "../src/domain/audits/statistics.js";
import {
  BORDER_MIN_REFERENCE,
  borderMisses,
  borderProfile,
  logprobGaps,
} from "../src/domain/audits/tests.js";
import type { AuditSample, ModelAuditInput } from "../src/domain/audits/types.js";
import { DEFAULT_PLAN, simulateMarket, type OfferOutcome } from "./helpers/audit-market.js";
import { createReferenceLm, VOCAB } from "./helpers/ngram-lm.js";

/**
 * The audits' statistics (issue 39, items 3 to 5, and the first acceptance line): the tests'
 * arithmetic on cases computed by hand, their validity under the null over seeds, e-BH, the
 * determinism every process relies on, and the simulated market of bench/audits.ts over its
 * first seeds, held to the figures the bench found (bench/figures/audits.md).
 */

/** The smallest k with P(Binomial(n, p) > k) ≤ tail: the most a rate of p allows in n trials. */
function binomialBound(n: number, p: number, tail = 0.001): number {
  let term = (1 - p) ** n;
  let cdf = term;
  let k = 0;
  while (1 - cdf > tail) {
    k++;
    term *= ((n - k + 1) / k) * (p / (1 - p));
    cdf += term;
  }
  return k;
}

const t = (promptId: string, text: string) => ({ promptId, text });

describe("MMD with a Hamming kernel", () => {
  it("compares the first L characters, padding matching padding", () => {
    expect(hammingKernel(encodeForKernel("ab", 2), encodeForKernel("ab", 2))).toBe(1);
    expect(hammingKernel(encodeForKernel("ab", 2), encodeForKernel("cb", 2))).toBe(0.5);
    // "a" vs "ab" on 3: a=a, pad≠b, pad=pad.
    expect(hammingKernel(encodeForKernel("a", 3), encodeForKernel("ab", 3))).toBeCloseTo(2 / 3, 12);
    // Only the first L characters count.
    expect(hammingKernel(encodeForKernel("abXYZ", 2), encodeForKernel("abQRS", 2))).toBe(1);
  });

  it("is the unbiased MMD² of hand-computed cases", () => {
    // Within x: k(ab,ab)=1; within y: k(cd,cd)=1; across: 0. 1 + 1 - 0.
    expect(mmdSquared([t("a", "ab"), t("a", "ab")], [t("a", "cd"), t("a", "cd")], 2)).toBe(2);
    // Within x: k(ab,aX)=1/2; within y: k(cd,cb)=1/2; across: only k(ab,cb)=1/2, mean 1/8.
    // 1/2 + 1/2 - 2/8.
    expect(mmdSquared([t("a", "ab"), t("a", "aX")], [t("a", "cd"), t("a", "cb")], 2)).toBe(0.75);
    // The kernel is 0 across prompts: within each side nothing, across two matches of 4: -1.
    expect(mmdSquared([t("a", "ab"), t("b", "ab")], [t("a", "ab"), t("b", "ab")], 2)).toBe(-1);
  });

  it("gives p = 1 when nothing tells the samples apart, and p ≥ 1/(P+1) always", () => {
    const same = [t("a", "xy"), t("a", "xy"), t("a", "xy")];
    expect(mmdPermutationTest(same, same, 1, { permutations: 99 }).pValue).toBe(1);
    const apart = mmdPermutationTest(
      Array.from({ length: 10 }, () => t("a", "aaaa")),
      Array.from({ length: 10 }, () => t("a", "bbbb")),
      1,
      { permutations: 99, length: 4 },
    );
    expect(apart.statistic).toBe(2);
    // Of C(20,10) labelings only the observed one and its mirror reach 2; 99 draws rarely do.
    expect(apart.pValue).toBe(1 / 100);
  });

  it("keeps its level under the null: p ≤ 0.05 at most as often as 5% allows over 200 seeds", () => {
    const lm = createReferenceLm(77);
    const rng = seededRandom(78);
    const prompts = Array.from({ length: 3 }, (_, i) => `${VOCAB[i * 7]!} ${VOCAB[i * 11]!}`);
    const draw = () =>
      Array.from({ length: 20 }, () => {
        const index = randomInt(rng, prompts.length);
        const text = lm.generate(prompts[index]!, { temperature: 1, maxTokens: 20, rng }).text;
        return t(String(index), text);
      });
    const trials = 200;
    let below = 0;
    for (let seed = 0; seed < trials; seed++) {
      const p = mmdPermutationTest(draw(), draw(), seed, { permutations: 99 }).pValue;
      if (p <= 0.05) below++;
    }
    expect(below).toBeLessThanOrEqual(binomialBound(trials, 0.05));
  });
});

describe("e-values", () => {
  it("calibrates a p-value: 0.5 + 0.5 · ¼ · p^(-¾), expectation 1 under a uniform p", () => {
    expect(eValueOfP(1)).toBe(0.625);
    expect(eValueOfP(1 / 16)).toBe(0.5 + 0.5 * 0.25 * 8);
    // Midpoint rule on a substitution p = u^4 (smooth near 0): ∫ e(p) dp = ∫ e(u^4) 4u^3 du.
    const steps = 100_000;
    let integral = 0;
    for (let i = 0; i < steps; i++) {
      const u = (i + 0.5) / steps;
      integral += eValueOfP(u ** 4) * 4 * u ** 3;
    }
    expect(integral / steps).toBeCloseTo(1, 4);
  });

  it("bets only on an edge the past showed (hand-computed)", () => {
    // First bet 0 (the prior sits on the null); then mean 3/4, variance 1/16, edge 1/4: the
    // growth-optimal bet 2 is capped at 0.5/μ₀ = 1, so the wealth is 1 · (1 + 1 · 0.5).
    expect(bettingEValue([1, 1], 0.5)).toBe(1.5);
    // Nothing above the null's mean, no bet.
    expect(bettingEValue([0, 0, 0, 0], 0.1)).toBe(1);
  });

  it("the betting e-process reaches 1/α under its null at most as often as α allows", () => {
    const trials = 400;
    let reached = 0;
    for (let seed = 0; seed < trials; seed++) {
      const rng = seededRandom(mixSeed(9, seed));
      const misses = Array.from({ length: 300 }, () => (rng() < 0.1 ? 1 : 0));
      if (bettingEValue(misses, 0.1) >= 1 / ALPHA_FLAG) reached++;
    }
    expect(reached).toBeLessThanOrEqual(binomialBound(trials, ALPHA_FLAG));
  });

  it("e-BH rejects the k* largest, k* the largest k with e_(k) ≥ m/(αk)", () => {
    // m = 4, α = 0.1: thresholds 40, 20, 13.3, 10.
    expect([...eBenjaminiHochberg([100, 30, 2, 0.5], 0.1).rejected]).toEqual([0, 1]);
    // Step-up: neither alone reaches 20, both reach 10.
    expect(eBenjaminiHochberg([15, 15], 0.1).count).toBe(2);
    expect(eBenjaminiHochberg([19, 1], 0.1).count).toBe(0);
    expect(eBenjaminiHochberg([25, 25, 25], 0.1).count).toBe(3);
    expect(ebhThreshold(4, 0.1, 2, true)).toBe(20);
    expect(ebhThreshold(4, 0.1, 2, false)).toBeCloseTo(40 / 3, 12);
    expect(ebhThreshold(4, 0.1, 0, false)).toBe(40);
  });
});

describe("border probes", () => {
  const probe = (offer: number, promptId: string, text: string, atMs: number): AuditSample => ({
    offerId: `0x${offer.toString(16).padStart(64, "0")}`,
    modelId: `0x${"ab".repeat(32)}`,
    test: "border_probe",
    promptId,
    text,
    atMs,
  });

  it("grade the first token against the tokens the reference answered, once it answered enough", () => {
    const reference = [
      ...Array.from({ length: BORDER_MIN_REFERENCE - 1 }, (_, i) => probe(1, "p", "alpha x", i)),
      probe(1, "p", "beta y", 9),
      probe(1, "q", "alpha", 10),
    ];
    const offer = [
      probe(2, "p", "beta and more", 20), // the other near-tied token: not a miss
      probe(2, "p", "gamma", 21), // a miss
      probe(2, "q", "gamma", 22), // "q" has too few reference answers: not graded
    ];
    expect(firstToken("  beta and more")).toBe("beta");
    // A comma is a token of its own, a CJK character is one; an answer opening with a mark is it.
    expect(firstToken("Blue, mostly")).toBe("Blue");
    expect(firstToken("巴黎是法国的首都。")).toBe("巴");
    expect(firstToken("「はい」")).toBe("「");
    expect(firstToken("Ça va")).toBe("Ça");
    expect(borderMisses(offer, borderProfile(reference))).toEqual([0, 1]);
  });
});

describe("logprob scoring", () => {
  it("takes a provider's non-finite claim as the largest gap, not as no evidence", () => {
    const claim = (promptId: string, meanLogprob: number): AuditSample => ({
      offerId: `0x${"01".padStart(64, "0")}`,
      modelId: `0x${"ab".repeat(32)}`,
      test: "logprob",
      promptId,
      meanLogprob,
      atMs: 0,
    });
    const values = new Map([
      ["s1", -1.5],
      ["s2", -2],
    ]);
    const gaps = logprobGaps(
      [claim("s1", -1.25), claim("s2", Number.NaN), claim("s3", -1), claim("s1", Infinity)],
      values,
    );
    // s3 has no reference value and is not graded.
    expect(gaps).toEqual([0.25, -1, -1]);
  });
});

function verdictsOf(outcomes: readonly OfferOutcome[]) {
  return outcomes.map((o) => [o.kind, o.finalState, o.finalVerdict.eValue]);
}

describe("the market's decision", () => {
  it("is the same from the same samples, whatever the order of the offers or a cache", () => {
    const rng = seededRandom(5);
    const modelId: Hex = `0x${"cd".repeat(32)}`;
    const lm = createReferenceLm(5);
    const offers = new Map<Hex, AuditSample[]>();
    for (let o = 0; o < 3; o++) {
      const offerId: Hex = `0x${(o + 1).toString(16).padStart(64, "0")}`;
      const samples: AuditSample[] = [];
      for (let i = 0; i < 60; i++) {
        const promptId = String(i % 3);
        const text = lm.generate(VOCAB[i % 3]!, { temperature: 1, maxTokens: 20, rng }).text;
        samples.push({ offerId, modelId, test: "mmd", promptId, text, atMs: i });
      }
      offers.set(offerId, samples);
    }
    const input: ModelAuditInput = { modelId, offers };
    const reversed: ModelAuditInput = { modelId, offers: new Map([...offers].reverse()) };
    const first = judgeMarket([input]);
    expect(judgeMarket([input])).toEqual(first);
    const sorted = (v: typeof first) => [...v].sort((a, b) => a.offerId.localeCompare(b.offerId));
    expect(sorted(judgeMarket([reversed]))).toEqual(sorted(first));
    expect(createJudgeMarket({ cache: new Map() })([input])).toEqual(first);
    expect(first.map((v) => v.state)).toEqual(["passing", "passing", "passing"]);
    expect(first.every((v) => v.tests.find((e) => e.test === "mmd")!.samples === 60)).toBe(true);
  });

  it("calls an offer with too few samples unaudited", () => {
    const modelId: Hex = `0x${"cd".repeat(32)}`;
    const a: Hex = `0x${"01".padStart(64, "0")}`;
    const b: Hex = `0x${"02".padStart(64, "0")}`;
    const sample = (offerId: Hex, i: number): AuditSample => ({
      offerId,
      modelId,
      test: "mmd",
      promptId: "p",
      text: `text ${i}`,
      atMs: i,
    });
    const verdicts = judgeMarket([
      {
        modelId,
        anchorOfferId: a,
        offers: new Map([
          [a, Array.from({ length: 40 }, (_, i) => sample(a, i))],
          [b, Array.from({ length: 10 }, (_, i) => sample(b, i))],
        ]),
      },
    ]);
    expect(verdicts.find((v) => v.offerId === b)).toMatchObject({
      state: "unaudited",
      reference: { kind: "anchor", offerId: a },
    });
  });
});

/** The bench's first seeds (bench/figures/audits.md holds all of them). */
const RUNS = 6;
/**
 * The documented budget, in rounds of the plan (per offer per round: 8 border probes, 10
 * completions, 4 logprob challenges, about 600 tokens): the most any of the bench's 200 runs
 * needed (bench/figures/audits.md). In 8 of those runs the mixer was flagged but not yet
 * excluded after the 30 rounds; every other run excluded it.
 */
const IMPOSTOR_FLAG_ROUNDS = 3;
const IMPOSTOR_EXCLUDE_ROUNDS = 4;
const MIXER_FLAG_ROUNDS = 29;
const MIXER_EXCLUDE_ROUNDS = 30;
const CLOSE_FLAG_ROUNDS = 6;
const CLOSE_EXCLUDE_ROUNDS = 11;

describe("a simulated market (the bench's plan, its first seeds)", () => {
  const outcomes = Array.from({ length: RUNS }, (_, r) => simulateMarket(1 + r, DEFAULT_PLAN));
  const all = outcomes.flat();
  const ofKind = (kind: OfferOutcome["kind"]) => all.filter((o) => o.kind === kind);

  it("flags the impostor and the mixer in every run within the documented budget", () => {
    for (const o of ofKind("impostor")) {
      expect(o.flaggedRound).toBeLessThanOrEqual(IMPOSTOR_FLAG_ROUNDS);
      expect(o.excludedRound).toBeLessThanOrEqual(IMPOSTOR_EXCLUDE_ROUNDS);
    }
    for (const o of ofKind("close")) {
      expect(o.flaggedRound).toBeLessThanOrEqual(CLOSE_FLAG_ROUNDS);
      expect(o.excludedRound).toBeLessThanOrEqual(CLOSE_EXCLUDE_ROUNDS);
    }
    for (const o of ofKind("mixer")) {
      expect(o.flaggedRound).toBeLessThanOrEqual(MIXER_FLAG_ROUNDS);
      if (o.excludedRound !== undefined) {
        expect(o.excludedRound).toBeLessThanOrEqual(MIXER_EXCLUDE_ROUNDS);
      }
    }
    // What these seeds gave: the impostor always at rounds 3 and 4; the mixer flagged at rounds
    // 12, 10, 6, 8, 11, 20 and excluded in all but the sixth run.
    expect(ofKind("impostor").map((o) => [o.flaggedRound, o.excludedRound])).toEqual(
      Array(RUNS).fill([3, 4]),
    );
    expect(ofKind("mixer").map((o) => o.flaggedRound)).toEqual([12, 10, 6, 8, 11, 20]);
    expect(ofKind("mixer").map((o) => o.finalState)).toEqual([
      ...Array(RUNS - 1).fill("excluded"),
      "flagged",
    ]);
  });

  it("flags honest and quantized offers no more often than the stated rate allows", () => {
    const nulls = all.filter((o) => ["anchor", "honest", "quantized"].includes(o.kind));
    expect(nulls).toHaveLength(RUNS * (1 + DEFAULT_PLAN.honest + DEFAULT_PLAN.quantized));
    const flagged = nulls.filter((o) => o.flaggedRound !== undefined).length;
    expect(flagged).toBeLessThanOrEqual(binomialBound(nulls.length, ALPHA_FLAG));
    // What these seeds gave (the bench's first runs): none.
    expect(flagged).toBe(0);
  });

  it("without an anchor, judges each offer against the majority of the others", () => {
    const majority = simulateMarket(1, { ...DEFAULT_PLAN, anchor: false });
    const states = Object.fromEntries(
      ["anchor", "honest", "quantized", "impostor", "mixer", "close"].map((kind) => [
        kind,
        majority.filter((o) => o.kind === kind).map((o) => o.finalState),
      ]),
    );
    expect(states).toEqual({
      anchor: ["passing"],
      honest: Array(DEFAULT_PLAN.honest).fill("passing"),
      quantized: Array(DEFAULT_PLAN.quantized).fill("passing"),
      impostor: ["excluded"],
      mixer: ["excluded"],
      close: ["excluded"],
    });
    // The reference is always an honest offer of the majority, never the offer itself.
    for (const o of majority) {
      const reference = majority.find((r) => r.offerId === o.finalVerdict.reference.offerId)!;
      expect(o.finalVerdict.reference.kind).toBe("majority");
      expect(["anchor", "honest", "quantized"]).toContain(reference.kind);
      expect(reference.offerId).not.toBe(o.offerId);
    }
  });

  it("is deterministic: a run again gives the same verdicts", () => {
    const short = { ...DEFAULT_PLAN, rounds: 6 };
    expect(verdictsOf(simulateMarket(1, short))).toEqual(verdictsOf(simulateMarket(1, short)));
  });
});
