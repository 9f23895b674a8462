import type { OfferMeasurement, OfferRecordCounts } from "./measurement-types.js";
import {
  divergenceFlagMinPayers,
  divergenceMinClaims,
  usageDivergenceOf,
  type UsageDivergence,
} from "./divergence.js";
import { isModelMismatch } from "../audits/standing.js";
import type { AuditState } from "../audits/types.js";

/**
 * An offer's reputation (issue 22; docs/decisions/providers-and-routing.md "Offer reputation"): what the gateway
 * measured of it over the last `windowSeconds`, shown in the catalog, and the one number that
 * sums it up. Every rate is an integer in basis points (10000 = 100 %), every time an integer:
 * nothing here is a float on the wire.
 *
 * The score is the weighted mean of the terms the window has data for:
 *
 *   S = success rate                               weight 4
 *   L = 10000 * 1000 / (1000 + ttft_ms)            weight 2  (half at 1 s to the first token)
 *   T = 10000 * tps / (tps + 50)                   weight 2  (half at 50 output tokens/s)
 *   V = verification pass rate                     weight 2
 *
 * (each term rounded down, the mean rounded down), times the share of requests not flagged,
 * tenfold: `(10000 - min(10000, 10 * flag rate)) / 10000`, so 1 % of requests flagged costs 10 %
 * of the score and 10 % costs all of it; and times the share of usage claims that did not
 * diverge from the gateway's count, tenfold, the same way (`(10000 - min(10000, 10 * share))
 * / 10000`, once the window holds `divergenceMinClaims` claimed answers and the diverged ones
 * come from more than one payer, `divergenceFlagMinPayers`; 0 for an offer
 * excluded for its claims): an offer flagged for divergence (more than 10 %) scores 0; so does
 * an offer its audits flag or exclude (`model_mismatch`, src/domain/audits/standing.ts). A term
 * without data is left out of the mean (its
 * weight too). Without a request counted in the window there is no score (null), as a new
 * offer shows: a verification says the endpoint conforms, not how it serves, and a score of
 * the verification alone would put a newcomer above every offer with a record.
 */

export const reputationWeights = { success: 4, latency: 2, throughput: 2, verification: 2 };
/** Time to first token that scores half: 1 s. */
export const latencyHalfMs = 1000;
/** Output tokens per second that score half. */
export const throughputHalf = 50;
/** Each basis point of flagged requests takes this many off the score's factor. */
export const flagPenalty = 10;

/**
 * An offer failing this much is sorted last by `provider.sort` latency and throughput: a success
 * rate below 80 % over at least 10 requests of the window. The floor on requests keeps one
 * unlucky failure of a quiet offer from sinking it.
 */
export const failingBelowBps = 8000;
export const failingMinRequests = 10;

export interface Reputation {
  /** 0 to 10000; undefined: no request counted in the window. */
  readonly score: number | undefined;
  /** Served / (served + failed), basis points; undefined: no request counted. */
  readonly successRateBps: number | undefined;
  /** Median time to first token, milliseconds (rounded). */
  readonly timeToFirstTokenMs: number | undefined;
  /** Median output tokens per second (rounded). */
  readonly outputTokensPerSecond: number | undefined;
  /** Verification runs that passed / runs that passed or answered wrongly, basis points. */
  readonly verificationPassRateBps: number | undefined;
  /** Requests flagged (over-reported usage) in the window. */
  readonly flags: number;
  /** Requests counted: served plus failed by the provider. */
  readonly requests: number;
  readonly windowSeconds: number;
  /** Its usage claims against the gateway's count (src/domain/reputation/divergence.ts). */
  readonly usageDivergence: UsageDivergence;
  /** Its audits found it serving another model (flagged or excluded): the score is 0. */
  readonly modelMismatch: boolean;
}

const bps = (part: number, whole: number): number => Math.floor((part * 10000) / whole);

/** The reputation of one offer from its measurement and record counts (absent: none). */
export function reputationOf(
  measured: OfferMeasurement | undefined,
  counts: OfferRecordCounts | undefined,
  windowSeconds: number,
  audit: AuditState = "unaudited",
): Reputation {
  const modelMismatch = isModelMismatch(audit);
  const requests = (measured?.served ?? 0) + (measured?.failed ?? 0);
  const successRateBps = requests === 0 ? undefined : bps(measured?.served ?? 0, requests);
  const ttft = measured?.latencyMs === undefined ? undefined : Math.round(measured.latencyMs);
  const tps = measured?.throughput === undefined ? undefined : Math.round(measured.throughput);
  const runs = (counts?.verificationsPassed ?? 0) + (counts?.verificationsRejected ?? 0);
  const verificationPassRateBps =
    runs === 0 ? undefined : bps(counts?.verificationsPassed ?? 0, runs);
  const flags = counts?.flags ?? 0;
  const usageDivergence = usageDivergenceOf(measured);

  const terms: [value: number | undefined, weight: number][] = [
    [successRateBps, reputationWeights.success],
    [
      ttft === undefined ? undefined : bps(latencyHalfMs, latencyHalfMs + ttft),
      reputationWeights.latency,
    ],
    [tps === undefined ? undefined : bps(tps, tps + throughputHalf), reputationWeights.throughput],
    [verificationPassRateBps, reputationWeights.verification],
  ];
  let sum = 0;
  let weight = 0;
  for (const [value, w] of terms) {
    if (value === undefined) continue;
    sum += value * w;
    weight += w;
  }
  let score: number | undefined;
  // With a request counted the success rate is a term: `weight` is not 0.
  if (requests > 0) {
    const flagRateBps = Math.min(10000, bps(flags, requests));
    const factor = Math.max(0, 10000 - flagPenalty * flagRateBps);
    score = Math.floor((Math.floor(sum / weight) * factor) / 10000);
    score = Math.floor((score * divergenceFactor(usageDivergence)) / 10000);
    if (modelMismatch) score = 0;
  }
  return {
    score,
    successRateBps,
    timeToFirstTokenMs: ttft,
    outputTokensPerSecond: tps,
    verificationPassRateBps,
    flags,
    requests,
    windowSeconds,
    usageDivergence,
    modelMismatch,
  };
}

/** The score's factor for diverging claims, basis points (see the module's comment). */
function divergenceFactor(d: UsageDivergence): number {
  if (d.excluded) return 0;
  if (d.claimed < divergenceMinClaims || d.shareBps === undefined) return 10000;
  // One payer's requests cannot cost an offer its score (divergence.ts: independent payers).
  if (d.payers < divergenceFlagMinPayers) return 10000;
  return Math.max(0, 10000 - flagPenalty * d.shareBps);
}

/** Whether `provider.sort` sorts the offer last for failing (see `failingBelowBps`). */
export function isFailing(measured: OfferMeasurement | undefined): boolean {
  if (measured === undefined) return false;
  const requests = measured.served + measured.failed;
  return requests >= failingMinRequests && bps(measured.served, requests) < failingBelowBps;
}
