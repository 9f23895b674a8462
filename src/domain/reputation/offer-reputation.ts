import type { Hex } from "viem";
import { reputationOf, type Reputation } from "./reputation.js";
import type { MeasurementSync, OfferMeasurements } from "./measurement-types.js";
import type { AuditStandings } from "../audits/standing.js";

/**
 * Each offer's reputation, from memory (the catalog's; docs/decisions/providers-and-routing.md, "Offer reputation"): what this process
 * measured over the reputation's window, with the record counts the sharing round read, and
 * whether its audits found it serving another model (`audits`, also from memory).
 */
export function offerReputation(
  measurements: OfferMeasurements,
  sync: Pick<MeasurementSync, "counts">,
  audits?: Pick<AuditStandings, "stateOf">,
): (offerId: Hex) => Reputation {
  return (offerId) =>
    reputationOf(
      measurements.get(offerId),
      sync.counts(offerId),
      measurements.windowSeconds,
      audits?.stateOf(offerId),
    );
}
