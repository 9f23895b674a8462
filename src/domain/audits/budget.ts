import type { Hex } from "viem";

/**
 * The audits' daily budget (issue 39, item 1): credits an operator lets audits spend per offer
 * and per model in one UTC day. An audit reserves the most it can cost (its quote's maximum)
 * against both before it is sent, and settles with what it was really charged after; a
 * reservation that would take either past its budget is refused, so concurrent audits (of every
 * gateway process sharing the database) never spend past it.
 */

export interface AuditBudget {
  /** Credits (credit token base units) per offer per UTC day. */
  readonly perOffer: bigint;
  /** Credits per model per UTC day (every offer of the model, the anchor's included). */
  readonly perModel: bigint;
}

/** The UTC day of `ms` as `YYYY-MM-DD`: budgets start again at midnight UTC. */
export function auditDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** One line of a day's spend: an offer's, or a model's (every offer of it). */
export interface AuditSpendLine {
  readonly scope: "offer" | "model";
  /** The OfferID or the ModelID. */
  readonly id: Hex;
  /** The model of an offer's line (the model itself on a model's line). */
  readonly modelId: Hex;
  /** Charged to the audit permit and settled into the budget. */
  readonly spent: bigint;
  /** Held by audits under way (their maximum). */
  readonly reserved: bigint;
  /** Audits that reserved on this line today. */
  readonly requests: number;
}

/** Where the budget is kept (src/adapters/pg/audit-spend.ts): shared by every process. */
export interface AuditSpendStore {
  /**
   * Reserves `amount` on `day` for the offer and its model, both or neither; false when either
   * line's spent + reserved + `amount` would pass its budget.
   */
  reserve(
    day: string,
    modelId: Hex,
    offerId: Hex,
    amount: bigint,
    budget: AuditBudget,
  ): Promise<boolean>;
  /** Gives the reservation back and adds what was charged (at most `reserved`) to the spend. */
  settle(day: string, modelId: Hex, offerId: Hex, reserved: bigint, charged: bigint): Promise<void>;
  /** Every line of `day`. */
  spendOn(day: string): Promise<AuditSpendLine[]>;
}
