import type { Hex } from "viem";
import { normalizeHex } from "../hex.js";
import { median } from "./statistics.js";
import { foundBorders, sequencePrompt, type AuditCorpus, type CorpusPrompt } from "./traffic.js";
import type { AuditSample } from "./types.js";

/**
 * A model's reference data taken from its anchor's audit samples (issue 39;
 * docs/decisions/audits.md, "Reference"), in the shape the corpus ships it (corpus.ts
 * `borders/` and `reference/`), so a gateway without an anchor of the model audits against what
 * this one measured. Pure: the CLI (src/cli/audits-export.ts) reads the samples and writes the
 * files.
 *
 * - Borders: the candidates the anchor answered at temperature 0 with two or more different
 *   first tokens (traffic.ts `foundBorders`), as the corpus states them.
 * - Logprobs: per sequence (`<prompt id>#<tokens>`), the median of the anchor's finite scores,
 *   when it has at least {@link referenceMinSamples}; the median, not the mean, so one answer
 *   scored off (a fault scores -Infinity and is left out, a kernel outlier is outvoted) does not
 *   move the value every other gateway compares with. Rounded to {@link referenceDecimals}
 *   decimals: far below the ±0.07 nats/token an honest offer's kernels differ by, and the same
 *   samples print the same digits.
 */

/** Finite scores a sequence needs on the anchor before its median is shipped. */
export const referenceMinSamples = 3;
/** Decimals a shipped mean log-probability keeps. */
export const referenceDecimals = 6;

export interface ReferenceExport {
  readonly modelId: Hex;
  /** The border inputs found, by id. */
  readonly borders: readonly CorpusPrompt[];
  /** Median mean log-probability per sequence id, by id. */
  readonly logprobs: ReadonlyMap<string, number>;
}

/**
 * `value` rounded to {@link referenceDecimals} decimals, at most 0 (an endpoint's values may
 * pass 0 by rounding, logprobs.ts; a log-probability does not) and never -0.
 */
export function roundReference(value: number): number {
  const rounded = Number(Math.min(0, value).toFixed(referenceDecimals));
  return rounded === 0 ? 0 : rounded;
}

const byId = (a: { id: string }, b: { id: string }) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

/**
 * The reference data of `modelId` from its anchor's samples (`samples`: every sample of the
 * model; only the anchor's count). A border found, or a logprob sequence, whose prompt the
 * corpus does not state is left out: its text is unknown, or (samples of another corpus the
 * audits asked before, e.g. the shipped one before AUDIT_CORPUS_DIR) no audit of this corpus
 * asks it.
 */
export function exportReference(
  corpus: AuditCorpus,
  modelId: Hex,
  anchorId: Hex,
  samples: readonly AuditSample[],
): ReferenceExport {
  const model = normalizeHex(modelId);
  const anchor = normalizeHex(anchorId);
  const own = samples.filter((s) => normalizeHex(s.offerId) === anchor);
  const found = foundBorders(own);
  const known = new Map<string, CorpusPrompt>();
  for (const p of [...corpus.prompts, ...corpus.probes, ...(corpus.borders.get(model) ?? [])])
    if (!known.has(p.id)) known.set(p.id, p);
  const borders = [...found]
    .map((id) => known.get(id))
    .filter((p): p is CorpusPrompt => p !== undefined)
    .sort(byId);
  const asked = new Set(corpus.prompts.map((p) => p.id));
  const scores = new Map<string, number[]>();
  for (const s of own) {
    if (s.test !== "logprob" || s.meanLogprob === undefined || !Number.isFinite(s.meanLogprob))
      continue;
    if (!asked.has(sequencePrompt(s.promptId))) continue;
    let list = scores.get(s.promptId);
    if (list === undefined) scores.set(s.promptId, (list = []));
    list.push(s.meanLogprob);
  }
  const logprobs = new Map<string, number>();
  for (const id of [...scores.keys()].sort()) {
    const values = scores.get(id)!;
    if (values.length >= referenceMinSamples) logprobs.set(id, roundReference(median(values)));
  }
  return { modelId: model, borders, logprobs };
}
