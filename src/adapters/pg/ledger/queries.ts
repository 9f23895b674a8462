/**
 * Reads and records beside the ledger (ledger.ts): a permit's ledger row, and an offer's flags.
 */
import type { Hex } from "viem";
import {
  availableCredits,
  emptyPermitLedger,
  type PermitLedger,
} from "../../../domain/permit-balance.js";
import type { Queryable } from "../registrations.js";

export interface OfferFlagInput {
  readonly offerId: Hex;
  readonly requestId: string;
  /** Why, e.g. that the provider reported more usage than the gateway could account for. */
  readonly reason: string;
  readonly now: number;
}

/** Flags an offer for review; flags are evidence, they do not change routing by themselves. */
export async function recordOfferFlag(db: Queryable, flag: OfferFlagInput): Promise<void> {
  await db.query(
    "INSERT INTO offer_flags (offer_id, request_id, reason, created_at) VALUES ($1, $2, $3, $4)",
    [flag.offerId.toLowerCase(), flag.requestId, flag.reason, flag.now],
  );
}

// The ledger's shape and the availability rule are the domain's (src/domain/permit-balance.ts),
// shared with the permit balance; re-exported for this module's callers.
export { availableCredits, type PermitLedger };

/** The permit's ledger; zeros when the gateway has never reserved against it. */
export async function permitLedger(db: Queryable, permitId: Hex): Promise<PermitLedger> {
  const { rows } = await db.query<{
    reserved: string;
    charged: string;
    settled: string;
    unsettleable: string;
  }>("SELECT reserved, charged, settled, unsettleable FROM permit_ledgers WHERE permit_id = $1", [
    permitId.toLowerCase(),
  ]);
  const row = rows[0];
  if (!row) return { ...emptyPermitLedger };
  return {
    reserved: BigInt(row.reserved),
    charged: BigInt(row.charged),
    settled: BigInt(row.settled),
    unsettleable: BigInt(row.unsettleable),
  };
}
