import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { createPeriodic } from "../periodic.js";
import type { AuditState, OfferAuditStanding, OfferAuditVerdict } from "./types.js";

/**
 * The audit standing every process holds (issue 39, item 4; DESIGN.md section 12;
 * docs/decisions/audits.md): the market's latest verdict per offer, kept in PostgreSQL
 * (migration 042, src/adapters/pg/audits.ts) and read by every process on a short round, as
 * offer cooldowns are (src/domain/reputation/cooldowns.ts). Routing reads memory only:
 *
 * - `flagged` (and `excluded`) offers sort after every offer that is not (with the usage
 *   divergence flag);
 * - `excluded` offers are out of routing, pinned requests included (503 `offer_model_mismatch`),
 *   until a verification of the offer passes again, which clears the evidence in the statement
 *   that records the run (adapters/pg/endpoint-health.ts);
 * - `provider.require_audited` routes only to offers whose state is `passing`.
 *
 * An offer without a standing is `unaudited`. A failed round changes nothing here: routing keeps
 * what it had (an exclusion is not lifted by a database that does not answer).
 */

/** Where the standings are kept (src/adapters/pg/audits.ts). */
export interface AuditStandingStore {
  /**
   * Writes the market's verdicts, all in one statement. `readAtMs`: when the samples they were
   * judged from were read; a verdict is not written over an offer whose evidence was cleared
   * after that (a verification passed meanwhile: the verdict judged samples that no longer
   * count). An `excluded` offer stays excluded, whatever the verdict, until it is cleared.
   */
  save(
    verdicts: readonly OfferAuditVerdict[],
    at: { readonly readAtMs: number; readonly nowMs: number },
  ): Promise<void>;
  /** Every standing (one row per offer ever judged). */
  read(): Promise<Map<Hex, OfferAuditStanding>>;
}

/** When each offer's evidence was last cleared (samples before no longer count), by offer. */
export async function clearedTimes(
  store: Pick<AuditStandingStore, "read">,
): Promise<ReadonlyMap<Hex, number>> {
  const cleared = new Map<Hex, number>();
  for (const [offerId, standing] of await store.read())
    if (standing.clearedAtMs !== undefined) cleared.set(offerId, standing.clearedAtMs);
  return cleared;
}

/** How many offers stand in each audit state (a metric's figures). */
export function auditStateCounts(standings: readonly OfferAuditStanding[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const { state } of standings) counts.set(state, (counts.get(state) ?? 0) + 1);
  return counts;
}

export interface AuditStandings {
  /** The offer's standing; undefined: never judged (`unaudited`). */
  get(offerId: Hex): OfferAuditStanding | undefined;
  /** The offer's state (`unaudited` without a standing). */
  stateOf(offerId: Hex): AuditState;
  /** Every standing this process knows, in no particular order. */
  all(): readonly OfferAuditStanding[];
  /** Reads the shared standings now (a round). */
  refresh(): Promise<void>;
  start(): void;
  stop(): Promise<void>;
}

/** Whether the catalog shows the offer as `model_mismatch` (flagged or excluded). */
export function isModelMismatch(state: AuditState): boolean {
  return state === "flagged" || state === "excluded";
}

/**
 * The standings of this process, read every `intervalMs` (and by {@link AuditStandings.refresh}).
 * A failed read is told to `onError` and changes nothing here.
 */
export function createAuditStandings(deps: {
  readonly store: Pick<AuditStandingStore, "read">;
  readonly intervalMs: number;
  readonly onError?: (error: unknown) => void;
}): AuditStandings {
  let known = new Map<Hex, OfferAuditStanding>();
  const refresh = async () => {
    known = await deps.store.read();
  };
  const rounds = createPeriodic({
    run: refresh,
    intervalMs: deps.intervalMs,
    onError: deps.onError,
  });
  return {
    get: (offerId) => known.get(offerId),
    stateOf: (offerId) => known.get(offerId)?.state ?? "unaudited",
    all: () => [...known.values()],
    refresh,
    start: rounds.start,
    stop: rounds.stop,
  };
}

/**
 * The refusal of a request whose every remaining offer is excluded by its audits (a pinned one:
 * its offer): 503 `offer_model_mismatch`, naming the offer and how it comes back.
 */
export function modelMismatch(offerIds: readonly Hex[]): GatewayError {
  const [only] = offerIds;
  const which =
    offerIds.length === 1 && only !== undefined
      ? `offer ${only} is out of routing`
      : "every eligible offer of this model is out of routing";
  return new GatewayError(
    "offer_model_mismatch",
    `${which}: its audits found it serving another model than the one it sells; it returns once its operator verifies it again`,
  );
}

/** Significant digits a statistic keeps where it leaves the process (types.ts). */
export const statisticDigits = 6;

/**
 * A statistic as a decimal string with {@link statisticDigits} significant digits, never in
 * exponent notation (`1.5e-7` -> `"0.000000150000"` trimmed to `"0.00000015"`); an infinite
 * e-value (a product that overflowed) is shown as the largest finite double, NaN as `"0"`.
 */
export function decimalString(value: number, digits: number = statisticDigits): string {
  if (Number.isNaN(value)) return "0";
  const finite = Number.isFinite(value) ? value : Math.sign(value) * Number.MAX_VALUE;
  if (finite === 0) return "0";
  const sign = finite < 0 ? "-" : "";
  const [mantissa, exp] = Math.abs(finite)
    .toExponential(digits - 1)
    .split("e") as [string, string];
  const e = Number(exp);
  const figures = mantissa.replace(".", "");
  let text: string;
  if (e >= figures.length - 1) text = figures + "0".repeat(e - (figures.length - 1));
  else if (e >= 0) text = `${figures.slice(0, e + 1)}.${figures.slice(e + 1)}`;
  else text = `0.${"0".repeat(-e - 1)}${figures}`;
  if (text.includes(".")) text = text.replace(/\.?0+$/, "");
  return sign + text;
}
