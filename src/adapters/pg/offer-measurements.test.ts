import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import { createOfferMeasurements } from "../../domain/reputation/measurements.js";
import { keptDivergedPayers } from "../../domain/reputation/measurement-types.js";
import type { Queryable } from "./catalog.js";
import { excludeOffer, readMeasurements, writeMeasurements } from "./offer-measurements.js";

// The distinct payers of diverged answers, shared between processes (migration 032;
// docs/decisions/metering-and-tokens.md "Usage divergence").

const offer = `0x${"0a".repeat(32)}` as Hex;
const payer = (i: number) => `0x${i.toString(16).padStart(40, "0")}` as Hex;

const test = useTestDatabase();
let db: Queryable;

beforeAll(() => {
  db = test.db.pool;
});

describe("offer measurements in the database: diverged payers", () => {
  it("writes each process's payers and reads them back for the others to merge", async () => {
    const one = createOfferMeasurements({ instanceId: "gw_one" });
    for (let i = 0; i < 12; i++) one.claimed(offer, true, payer(1 + (i % 2)));
    await writeMeasurements(db, "gw_one", one.local());
    const two = createOfferMeasurements({ instanceId: "gw_two" });
    for (let i = 0; i < 12; i++) two.claimed(offer, true, payer(2));
    expect(two.exclusionsDue()).toEqual([]);
    two.absorb(await readMeasurements(db, 60));
    // 24 of 24 diverged, from payers 1 and 2: flagged but not excluded; a third payer excludes.
    expect(two.get(offer)).toMatchObject({ claimed: 24, diverged: 24, divergedPayers: 2 });
    expect(two.exclusionsDue()).toEqual([]);
    two.claimed(offer, true, payer(3));
    expect(two.exclusionsDue()).toMatchObject([{ offerId: offer, payers: 3 }]);
  });

  it("reads no more payers than are kept, and nothing that is not an address", async () => {
    await db.query(
      `UPDATE offer_measurements SET diverged_payers = $1::jsonb WHERE instance_id = 'gw_one'`,
      [JSON.stringify(["junk", 7, ...Array.from({ length: 40 }, (_, i) => payer(100 + i))])],
    );
    const [row] = (await readMeasurements(db, 60)).filter((r) => r.instanceId === "gw_one");
    expect(row?.divergedPayers).toHaveLength(keptDivergedPayers);
    expect(row?.divergedPayers[0]).toBe(payer(100));
  });

  it("records the payers of the window that excluded an offer", async () => {
    expect(
      await excludeOffer(db, { offerId: offer, claimed: 25, diverged: 25, payers: 3, since: 0 }, 9),
    ).toBe(true);
    const { rows } = await db.query<{ payers: number }>(
      "SELECT payers FROM offer_usage_exclusions WHERE offer_id = $1",
      [offer],
    );
    expect(rows).toEqual([{ payers: 3 }]);
  });
});
