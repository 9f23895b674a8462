import type { OfferMeasurement } from "./measurement-types.js";

/**
 * Divergence is the liar's cost (DESIGN.md section 10; docs/decisions/metering-and-tokens.md "Usage divergence"):
 * an offer whose usage claims run above the gateway's count beyond tolerance
 * (`judgeUsage(...).diverged`, chat/usage.ts) in more than a share of its claimed answers over
 * the reputation's window is flagged (shown in the catalog, the console and its reputation, and
 * sorted after every unflagged offer); above a higher share it leaves routing until a
 * verification of it passes again (the exclusion is kept in the database, so every process and
 * every restart agrees). Only answers the offer itself gave count: an honest offer's claims are
 * within tolerance whatever a competitor sends it, so no one but the offer can raise its share.
 *
 * Should a request still make an honest provider count what the client never sees (a member
 * no one thought of, a server's quirk), one payer must not be able to turn that into a flag or
 * an exclusion of a competitor (issue 35: 21 requests of one payer excluded the demo offer). So
 * the share counts only across independent payers: a flag needs diverged answers from at least
 * {@link divergenceFlagMinPayers} payers, an exclusion from at least
 * {@link divergenceExcludeMinPayers}. A payer is the address whose deposit pays (the permit's
 * `payer`): a payer's API keys and permits are one payer, since keys and permits cost it
 * nothing more, while another address needs its own deposit. A share past the exclusion bound
 * from fewer payers calls for the gateway's own probe instead (`isConfirmationDue`): a
 * verification whose counting step the gateway controls, which takes an overclaiming offer out
 * of routing by itself (`usage_diverged`).
 *
 * Shares are integers in basis points (10000 = 100 %), compared exactly (no rounding).
 */

/**
 * Claimed answers the window must hold before its share says anything: with fewer, no flag
 * and no exclusion. 20: one unlucky answer (even two) of a quiet offer cannot flag it, since
 * 2 of 20 is 10 %, not more.
 */
export const divergenceMinClaims = 20;
/** Flagged above this share of claimed answers diverged: 10 %. */
export const divergenceFlagAboveBps = 1000;
/** Out of routing above this share (until verified again): 50 %. */
export const divergenceExcludeAboveBps = 5000;
/** Distinct payers among the diverged answers a flag needs: more than one. */
export const divergenceFlagMinPayers = 2;
/** Distinct payers among the diverged answers an exclusion needs (else a probe confirms it). */
export const divergenceExcludeMinPayers = 3;

/** What the catalog and the reputation show of an offer's usage claims. */
export interface UsageDivergence {
  /** Answers of the window that carried a usage claim (since the last exclusion was cleared). */
  readonly claimed: number;
  /** Of those, the claims above the gateway's count plus tolerance. */
  readonly diverged: number;
  /** diverged / claimed, basis points, rounded down; undefined: no claim in the window. */
  readonly shareBps: number | undefined;
  /** Distinct payers of the diverged answers (counted up to `keptDivergedPayers`). */
  readonly payers: number;
  /** Sorted after every unflagged offer (an excluded offer is flagged too). */
  readonly flagged: boolean;
  /** Out of routing until a verification of the offer passes. */
  readonly excluded: boolean;
}

const above = (diverged: number, claimed: number, bps: number): boolean =>
  claimed >= divergenceMinClaims && diverged * 10000 > bps * claimed;

/** The offer's divergence from its measurement (undefined: nothing measured, nothing standing). */
export function usageDivergenceOf(measured: OfferMeasurement | undefined): UsageDivergence {
  const claimed = measured?.claimed ?? 0;
  const diverged = measured?.diverged ?? 0;
  const payers = measured?.divergedPayers ?? 0;
  const excluded = measured?.excluded ?? false;
  return {
    claimed,
    diverged,
    shareBps: claimed === 0 ? undefined : Math.floor((diverged * 10000) / claimed),
    payers,
    flagged:
      excluded ||
      (payers >= divergenceFlagMinPayers && above(diverged, claimed, divergenceFlagAboveBps)),
    excluded,
  };
}

/** Whether the offer is flagged: routing sorts it after every offer that is not. */
export function isDivergenceFlagged(measured: OfferMeasurement | undefined): boolean {
  return usageDivergenceOf(measured).flagged;
}

/** Whether the window's share takes a not yet excluded offer out of routing now. */
export function isExclusionDue(measured: OfferMeasurement | undefined): boolean {
  if (measured === undefined || measured.excluded) return false;
  return (
    (measured.divergedPayers ?? 0) >= divergenceExcludeMinPayers &&
    above(measured.diverged, measured.claimed, divergenceExcludeAboveBps)
  );
}

/**
 * Whether the window's share would take the offer out of routing but for too few independent
 * payers: the gateway's own probe is to confirm it (a verification of the offer).
 */
export function isConfirmationDue(measured: OfferMeasurement | undefined): boolean {
  if (measured === undefined || measured.excluded) return false;
  return (
    (measured.divergedPayers ?? 0) < divergenceExcludeMinPayers &&
    above(measured.diverged, measured.claimed, divergenceExcludeAboveBps)
  );
}
