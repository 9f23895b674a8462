import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { ALPHA_EXCLUDE, ALPHA_FLAG } from "../src/domain/audits/evidence.js";
import { median as medianOf } from "../src/domain/audits/statistics.js";
import {
  DEFAULT_PLAN,
  simulateMarket,
  type MarketPlan,
  type OfferOutcome,
  type VariantKind,
} from "../test/helpers/audit-market.js";

/**
 * `npm run bench:audits` (issue 39): the audits' statistics over seeded simulated markets
 * (test/helpers/audit-market.ts, the n-gram fixture of test/helpers/ngram-lm.ts). For each
 * variant, the share of runs flagged and excluded and the samples and tokens the auditor spent
 * until then; for the honest and quantized offers, the false-positive rate with its exact 95%
 * upper bound. Writes bench/figures/audits.md and audits.json beside it.
 *
 * AUDITS_RUNS (200) seeded runs per scenario, AUDITS_SEED (1) the first seed. Two scenarios:
 * offers exposing logprobs, and offers that do not (border probes and MMD only).
 */

const runs = Number(process.env.AUDITS_RUNS ?? 200);
const firstSeed = Number(process.env.AUDITS_SEED ?? 1);
const out = join(dirname(new URL(import.meta.url).pathname), "figures");

/** The exact (Clopper–Pearson) one-sided 95% upper bound of a binomial proportion. */
function upperBound(successes: number, trials: number, confidence = 0.95): number {
  if (successes >= trials) return 1;
  // P(X ≤ successes | p) = 1 − confidence, solved by bisection.
  const cdf = (p: number): number => {
    let term = (1 - p) ** trials;
    let sum = term;
    for (let k = 1; k <= successes; k++) {
      term *= ((trials - k + 1) / k) * (p / (1 - p));
      sum += term;
    }
    return sum;
  };
  let lo = successes / trials;
  let hi = 1;
  for (let i = 0; i < 60; i++) {
    const mid = (lo + hi) / 2;
    if (cdf(mid) > 1 - confidence) lo = mid;
    else hi = mid;
  }
  return hi;
}

function median(values: readonly number[]): number | undefined {
  return values.length === 0 ? undefined : medianOf(values);
}

interface Row {
  readonly kind: VariantKind;
  readonly offers: number;
  readonly flagged: number;
  readonly excluded: number;
  readonly flaggedUpper95: number;
  readonly medianRoundsToFlag?: number | undefined;
  readonly maxRoundsToFlag?: number | undefined;
  readonly medianSamplesToFlag?: number | undefined;
  readonly medianTokensToFlag?: number | undefined;
  readonly medianSamplesToExclude?: number | undefined;
  readonly medianTokensToExclude?: number | undefined;
  readonly maxRoundsToExclude?: number | undefined;
}

function rowsOf(outcomes: readonly OfferOutcome[]): Row[] {
  const kinds: VariantKind[] = ["anchor", "honest", "quantized", "impostor", "mixer", "close"];
  return kinds
    .map((kind) => outcomes.filter((o) => o.kind === kind))
    .filter((list) => list.length > 0)
    .map((list) => {
      const flagged = list.filter((o) => o.flaggedRound !== undefined);
      const excluded = list.filter((o) => o.excludedRound !== undefined);
      return {
        kind: list[0]!.kind,
        offers: list.length,
        flagged: flagged.length,
        excluded: excluded.length,
        flaggedUpper95: upperBound(flagged.length, list.length),
        medianRoundsToFlag: median(flagged.map((o) => o.flaggedRound!)),
        maxRoundsToFlag: flagged.length
          ? Math.max(...flagged.map((o) => o.flaggedRound!))
          : undefined,
        medianSamplesToFlag: median(flagged.map((o) => o.samplesToFlag!)),
        medianTokensToFlag: median(flagged.map((o) => o.tokensToFlag!)),
        medianSamplesToExclude: median(excluded.map((o) => o.samplesToExclude!)),
        medianTokensToExclude: median(excluded.map((o) => o.tokensToExclude!)),
        maxRoundsToExclude: excluded.length
          ? Math.max(...excluded.map((o) => o.excludedRound!))
          : undefined,
      };
    });
}

function scenario(name: string, plan: MarketPlan) {
  const started = performance.now();
  const outcomes: OfferOutcome[] = [];
  for (let r = 0; r < runs; r++) outcomes.push(...simulateMarket(firstSeed + r, plan));
  const rows = rowsOf(outcomes);
  const honest = outcomes.filter((o) => o.kind === "anchor" || o.kind === "honest");
  const quantized = outcomes.filter((o) => o.kind === "quantized");
  const nulls = [...honest, ...quantized];
  const falsePositives = nulls.filter((o) => o.flaggedRound !== undefined).length;
  const seconds = (performance.now() - started) / 1000;
  process.stdout.write(`${name}: ${runs} runs in ${seconds.toFixed(1)} s\n`);
  return {
    name,
    plan,
    runs,
    seconds,
    rows,
    falsePositive: {
      offers: nulls.length,
      flagged: falsePositives,
      excluded: nulls.filter((o) => o.excludedRound !== undefined).length,
      rate: falsePositives / nulls.length,
      upper95: upperBound(falsePositives, nulls.length),
    },
  };
}

const fmt = (v: number | undefined, digits = 0) => (v === undefined ? "–" : v.toFixed(digits));

function markdown(results: ReturnType<typeof scenario>[]): string {
  const lines = [
    "# Audits: the statistics over simulated markets (issue 39)",
    "",
    `\`npm run bench:audits\` (bench/audits.ts), ${runs} seeded runs per scenario (seeds ${firstSeed} to ${firstSeed + runs - 1}), written ${new Date().toISOString().slice(0, 10)}.`,
    "One model per run (its seeds drawn from the run's), offers driven by the n-gram fixture",
    "(test/helpers/ngram-lm.ts): the anchor (the reference, named by the operator), honest offers",
    "of the same model, quantized ones (every probability within ±10%), the impostor (another",
    "model), the mixer (the impostor for 30% of requests) and a close impostor (about 0.3",
    "nats/token from the reference, as a 2×-cheaper model). The market is judged after each",
    `round; flag level ${ALPHA_FLAG}, exclusion ${ALPHA_EXCLUDE} (e-BH over the run's offers).`,
    "Samples and tokens are the offer's own, counted until the round it was first flagged",
    "(or excluded); a round per offer is the plan's border probes, completions and challenges.",
    "Decisions and guarantees: docs/decisions/audits.md.",
    "",
  ];
  for (const r of results) {
    lines.push(`## ${r.name}`, "");
    lines.push(
      `Per round per offer: ${r.plan.borderProbes} border probes (the anchor: one per border input, ${r.plan.borderInputs}), ${r.plan.completions} completions for MMD, ${r.plan.logprobs ? `${r.plan.challenges} logprob challenges` : "no logprob challenges"}; ${r.plan.rounds} rounds. ${fmt(r.seconds, 1)} s.`,
      "",
      "| variant | offers | flagged | excluded | flagged, 95% upper | rounds to flag (median / max) | samples to flag | tokens to flag | samples to exclude | tokens to exclude | rounds to exclude (max) |",
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    );
    for (const row of r.rows) {
      lines.push(
        `| ${row.kind} | ${row.offers} | ${row.flagged} (${fmt((100 * row.flagged) / row.offers, 1)}%) | ${row.excluded} (${fmt((100 * row.excluded) / row.offers, 1)}%) | ${fmt(100 * row.flaggedUpper95, 2)}% | ${fmt(row.medianRoundsToFlag, 1)} / ${fmt(row.maxRoundsToFlag)} | ${fmt(row.medianSamplesToFlag)} | ${fmt(row.medianTokensToFlag)} | ${fmt(row.medianSamplesToExclude)} | ${fmt(row.medianTokensToExclude)} | ${fmt(row.maxRoundsToExclude)} |`,
      );
    }
    const fp = r.falsePositive;
    lines.push(
      "",
      `False positives (anchor, honest and quantized offers together): ${fp.flagged} of ${fp.offers} ever flagged over the run (${fmt(100 * fp.rate, 2)}%, exact 95% upper bound ${fmt(100 * fp.upper95, 2)}%; the stated rate is ${100 * ALPHA_FLAG}% per offer), ${fp.excluded} excluded.`,
      "",
    );
  }
  return lines.join("\n");
}

const results = [
  scenario("Offers exposing logprobs", DEFAULT_PLAN),
  scenario("Offers without logprobs (border probes and MMD only)", {
    ...DEFAULT_PLAN,
    logprobs: false,
  }),
];
mkdirSync(out, { recursive: true });
writeFileSync(
  join(out, "audits.json"),
  `${JSON.stringify({ runs, firstSeed, results }, null, 2)}\n`,
);
writeFileSync(join(out, "audits.md"), markdown(results));
process.stdout.write(markdown(results));
