import type { Hex } from "viem";
import { createJudgeMarket } from "../../src/domain/audits/evidence.js";
import { mixSeed, randomInt, seededRandom } from "../../src/domain/audits/random.js";
import type { PermutationCache } from "../../src/domain/audits/tests.js";
import type { AuditSample, AuditState, OfferAuditVerdict } from "../../src/domain/audits/types.js";
import {
  createImpostorLm,
  createMixerLm,
  createQuantizedLm,
  createReferenceLm,
  findBorderPrompts,
  VOCAB,
  type NgramLm,
} from "./ngram-lm.js";

/**
 * A simulated market of one model for the audits' statistics (issue 39): offers driven by the
 * n-gram fixture, sampled as the auditor samples them, judged after every round. Shared by
 * bench/audits.ts (many runs, the figures) and test/audits-statistics.test.ts (fewer runs, the
 * same plan). No HTTP here: the statistics' power and error rates, not the traffic's blindness.
 */

export type VariantKind = "anchor" | "honest" | "quantized" | "impostor" | "mixer" | "close";

export interface MarketPlan {
  /** Rounds of audits in a run; the market is judged after each. */
  readonly rounds: number;
  /** Border probes per offer per round (the anchor: one per border input of the plan). */
  readonly borderProbes: number;
  /** Border inputs the auditor uses (from those found on the anchor). */
  readonly borderInputs: number;
  /** Temperature-1 completions per offer per round (MMD), over {@link MMD_PROMPTS} prompts. */
  readonly completions: number;
  /** Logprob challenges per offer per round (for offers that expose logprobs). */
  readonly challenges: number;
  /** Whether the offers expose logprobs (the anchor's values are shipped data either way). */
  readonly logprobs: boolean;
  /** Offers per kind besides the anchor. */
  readonly honest: number;
  readonly quantized: number;
  /** Add the close impostor (a 2×-cheaper-like model, ~0.3 nats/token from the reference). */
  readonly close: boolean;
  /**
   * Whether the operator named the anchor: without, the first offer is one more honest offer
   * (still probed on every border input) and each offer is judged against the majority.
   */
  readonly anchor?: boolean;
}

export const DEFAULT_PLAN: MarketPlan = {
  rounds: 30,
  borderProbes: 8,
  borderInputs: 24,
  completions: 10,
  challenges: 4,
  logprobs: true,
  honest: 4,
  quantized: 2,
  close: true,
};

const MMD_PROMPTS = 5;
const SEQUENCES = 24;
/** Words of the filler before a border input (a probe looks like any request). */
const FILLER_WORDS = 30;
/** Tokens asked for: border probes pay a short answer, MMD a 100-character one. */
const BORDER_MAX_TOKENS = 4;
const COMPLETION_MAX_TOKENS = 20;
const SEQUENCE_TOKENS = 20;

export interface OfferOutcome {
  readonly kind: VariantKind;
  readonly offerId: Hex;
  /** First round (1-based) the offer was flagged (or excluded); undefined: never. */
  readonly flaggedRound?: number;
  readonly excludedRound?: number;
  /** The offer's samples and tokens when first flagged / excluded. */
  readonly samplesToFlag?: number;
  readonly tokensToFlag?: number;
  readonly samplesToExclude?: number;
  readonly tokensToExclude?: number;
  readonly finalState: AuditState;
  readonly finalVerdict: OfferAuditVerdict;
}

interface Offer {
  readonly kind: VariantKind;
  readonly id: Hex;
  readonly lm: NgramLm;
  readonly rng: () => number;
  readonly samples: AuditSample[];
  tokens: number;
}

const modelId: Hex = `0x${"ab".repeat(32)}`;

function offerIdOf(index: number): Hex {
  return `0x${(index + 1).toString(16).padStart(64, "0")}`;
}

function words(rng: () => number, count: number): string {
  return Array.from({ length: count }, () => VOCAB[randomInt(rng, VOCAB.length)]!).join(" ");
}

function offersOf(seed: number, plan: MarketPlan): Offer[] {
  const reference = createReferenceLm(mixSeed(seed, 1));
  const impostor = createImpostorLm(reference, mixSeed(seed, 2));
  const kinds: { kind: VariantKind; lm: NgramLm }[] = [
    { kind: "anchor", lm: reference },
    ...Array.from({ length: plan.honest }, () => ({ kind: "honest" as const, lm: reference })),
    ...Array.from({ length: plan.quantized }, (_, i) => ({
      kind: "quantized" as const,
      lm: createQuantizedLm(reference, mixSeed(seed, 3, i)),
    })),
    { kind: "impostor", lm: impostor },
    { kind: "mixer", lm: createMixerLm(reference, impostor) },
    ...(plan.close
      ? [{ kind: "close" as const, lm: createImpostorLm(reference, mixSeed(seed, 4), 0.2) }]
      : []),
  ];
  return kinds.map(({ kind, lm }, index) => ({
    kind,
    id: offerIdOf(index),
    lm,
    rng: seededRandom(mixSeed(seed, 100 + index)),
    samples: [],
    tokens: 0,
  }));
}

/** One seeded run of the plan: every offer's first flag and exclusion. */
export function simulateMarket(seed: number, plan: MarketPlan = DEFAULT_PLAN): OfferOutcome[] {
  const setup = seededRandom(mixSeed(seed, 0));
  const offers = offersOf(seed, plan);
  const anchor = offers[0]!;
  const border = findBorderPrompts(anchor.lm, setup).slice(0, plan.borderInputs);
  const mmdPrompts = Array.from({ length: MMD_PROMPTS }, () => words(setup, 3));
  // Fixed sequences and their reference values (shipped data, computed on the reference).
  const sequences = Array.from({ length: SEQUENCES }, (_, i) => {
    const prompt = words(setup, 3);
    const text = anchor.lm.generate(prompt, {
      temperature: 1,
      maxTokens: SEQUENCE_TOKENS,
      rng: setup,
    }).text;
    return { id: `seq-${i}`, prompt, text };
  });
  const referenceLogprobs = new Map(
    sequences.map((s) => [s.id, anchor.lm.score(s.prompt, s.text, () => 0.5).meanLogprob]),
  );
  const judge = createJudgeMarket({ cache: new Map() as PermutationCache });
  const firsts = new Map<
    Hex,
    { flagged?: [number, number, number]; excluded?: [number, number, number] }
  >();
  let verdicts: OfferAuditVerdict[] = [];
  let atMs = 0;
  for (let round = 1; round <= plan.rounds; round++) {
    for (const offer of offers) {
      const isAnchor = offer === anchor;
      const probes = isAnchor ? border.length : plan.borderProbes;
      for (let p = 0; p < probes; p++) {
        const input = isAnchor ? border[p]! : border[randomInt(offer.rng, border.length)]!;
        const prompt = `${words(offer.rng, FILLER_WORDS)} ${input}`;
        const answer = offer.lm.generate(prompt, {
          temperature: 0,
          maxTokens: BORDER_MAX_TOKENS,
          rng: offer.rng,
        });
        offer.tokens += FILLER_WORDS + 1 + BORDER_MAX_TOKENS;
        offer.samples.push(sample(offer, "border_probe", input, { text: answer.text }, atMs++));
      }
      for (let c = 0; c < plan.completions; c++) {
        const index = randomInt(offer.rng, mmdPrompts.length);
        const answer = offer.lm.generate(mmdPrompts[index]!, {
          temperature: 1,
          maxTokens: COMPLETION_MAX_TOKENS,
          rng: offer.rng,
        });
        offer.tokens += 3 + COMPLETION_MAX_TOKENS;
        offer.samples.push(sample(offer, "mmd", `mmd-${index}`, { text: answer.text }, atMs++));
      }
      if (!plan.logprobs || isAnchor) continue;
      for (let c = 0; c < plan.challenges; c++) {
        const s = sequences[randomInt(offer.rng, sequences.length)]!;
        const score = offer.lm.score(s.prompt, s.text, offer.rng);
        offer.tokens += 3 + SEQUENCE_TOKENS + 1;
        offer.samples.push(
          sample(offer, "logprob", s.id, { meanLogprob: score.meanLogprob }, atMs++),
        );
      }
    }
    verdicts = judge([
      {
        modelId,
        anchorOfferId: plan.anchor === false ? undefined : anchor.id,
        offers: new Map(offers.map((o) => [o.id, o.samples])),
        referenceLogprobs,
      },
    ]);
    for (const verdict of verdicts) {
      const offer = offers.find((o) => o.id === verdict.offerId)!;
      const first = firsts.get(offer.id) ?? {};
      const mark: [number, number, number] = [round, offer.samples.length, offer.tokens];
      if (verdict.state === "flagged" || verdict.state === "excluded") first.flagged ??= mark;
      if (verdict.state === "excluded") first.excluded ??= mark;
      firsts.set(offer.id, first);
    }
  }
  return offers.map((offer) => {
    const first = firsts.get(offer.id) ?? {};
    const verdict = verdicts.find((v) => v.offerId === offer.id)!;
    return {
      kind: offer.kind,
      offerId: offer.id,
      finalState: verdict.state,
      finalVerdict: verdict,
      ...(first.flagged
        ? {
            flaggedRound: first.flagged[0],
            samplesToFlag: first.flagged[1],
            tokensToFlag: first.flagged[2],
          }
        : {}),
      ...(first.excluded
        ? {
            excludedRound: first.excluded[0],
            samplesToExclude: first.excluded[1],
            tokensToExclude: first.excluded[2],
          }
        : {}),
    };
  });
}

function sample(
  offer: Offer,
  test: AuditSample["test"],
  promptId: string,
  answer: { text?: string; meanLogprob?: number },
  atMs: number,
): AuditSample {
  return { offerId: offer.id, modelId, test, promptId, ...answer, atMs };
}
