import type { Hex } from "viem";
import { median, mmdSquared, type TextSample } from "./statistics.js";
import { borderMisses, borderProfile, logprobGaps, MMD_BATCH, referenceLogprobs } from "./tests.js";
import type { AuditSample } from "./types.js";

/**
 * The model's majority as a reference (issue 39, item 2), when the operator named no anchor:
 * for each offer, the medoid of the model's other offers (leave-one-out, so an offer's own
 * samples never choose the reference it is judged against). The medoid is the offer whose median
 * distance to the others is smallest; with honest offers in the majority it is an honest one,
 * however far the impostors are. Distances per test, each scaled by its largest value among the
 * offers so the tests weigh alike, summed:
 * - border probes: the share of each one's first tokens outside the other's (both ways, mean);
 * - MMD: MMD² (clipped at 0) of their latest {@link MEDOID_MMD_SAMPLES} completions each;
 * - logprob: the mean absolute gap of their per-sequence means, over the sequences both scored.
 */
export const MEDOID_MMD_SAMPLES = 2 * MMD_BATCH;

type Distances = (a: number, b: number) => number | undefined;

function meanOf(values: readonly number[]): number | undefined {
  return values.length === 0 ? undefined : values.reduce((x, y) => x + y, 0) / values.length;
}

function latestTexts(samples: readonly AuditSample[]): TextSample[] {
  return samples
    .filter((s) => s.test === "mmd")
    .slice(-MEDOID_MMD_SAMPLES)
    .map((s) => ({ promptId: s.promptId, text: s.text ?? "" }));
}

function matrixOf(count: number, distance: Distances): (number | undefined)[][] {
  const matrix: (number | undefined)[][] = [];
  for (let a = 0; a < count; a++) matrix.push(new Array<number | undefined>(count).fill(0));
  for (let a = 0; a < count; a++) {
    for (let b = a + 1; b < count; b++) {
      const d = distance(a, b);
      matrix[a]![b] = d;
      matrix[b]![a] = d;
    }
  }
  const max = Math.max(0, ...matrix.flat().filter((d): d is number => d !== undefined));
  return matrix.map((row) => row.map((d) => (d === undefined ? undefined : max > 0 ? d / max : 0)));
}

/** Sum of the per-test scaled distances between every two offers (undefined: no test shared). */
export function offerDistances(offers: readonly (readonly AuditSample[])[]): number[][] {
  const texts = offers.map(latestTexts);
  const values = offers.map((samples) => referenceLogprobs(samples));
  const profiles = offers.map(borderProfile);
  const tests: Distances[] = [
    (a, b) =>
      meanOf([
        ...borderMisses(offers[a]!, profiles[b]!),
        ...borderMisses(offers[b]!, profiles[a]!),
      ]),
    (a, b) =>
      texts[a]!.length < 2 || texts[b]!.length < 2
        ? undefined
        : Math.max(0, mmdSquared(texts[a]!, texts[b]!)),
    (a, b) => meanOf(logprobGaps(offers[a]!, values[b]!).map(Math.abs)),
  ];
  const matrices = tests.map((t) => matrixOf(offers.length, t));
  return offers.map((_, a) =>
    offers.map((_, b) => matrices.reduce((sum, m) => sum + (m[a]![b] ?? 0), 0)),
  );
}

/**
 * The medoid of `ids` without `excluded` (its median distance to the rest smallest; ties to the
 * smallest offer id). Undefined when no other offer is left.
 */
export function leaveOneOutMedoid(
  ids: readonly Hex[],
  distances: readonly (readonly number[])[],
  excluded: Hex,
): Hex | undefined {
  const candidates = ids.map((id, index) => ({ id, index })).filter((c) => c.id !== excluded);
  let best: { id: Hex; score: number } | undefined;
  for (const c of candidates) {
    const others = candidates
      .filter((d) => d.index !== c.index)
      .map((d) => distances[c.index]![d.index]!);
    const score = others.length === 0 ? 0 : median(others);
    if (!best || score < best.score || (score === best.score && c.id < best.id)) {
      best = { id: c.id, score };
    }
  }
  return best?.id;
}
