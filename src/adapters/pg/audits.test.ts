import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { describeIfPostgres, useTestDatabase } from "../../../test/helpers/db.js";
import type { AuditState, OfferAuditVerdict } from "../../domain/audits/types.js";
import { readAuditStandings, saveAuditVerdicts } from "./audits.js";
import type { Queryable } from "./catalog.js";
import { recordVerification } from "./endpoint-health.js";

// `offer_audit_standings` (migration 042; docs/decisions/audits.md): what the judging
// process writes, what every process reads, and what a passing verification clears.

const modelId = `0x${"11".repeat(32)}` as Hex;
const address = `0x${"33".repeat(20)}` as Hex;
const t0 = 1_700_000_000;

let offerCounter = 0;

async function seedModel(db: Queryable): Promise<void> {
  await db.query(
    `INSERT INTO models (model_id, creator, credit_token, repository, revision, task, pool_id,
       position_token_id, status, indexed_block)
     VALUES ($1, $2, $2, 'acme/llama', 'main', 'chat', $1, 1, 'active', 1)`,
    [modelId, address],
  );
}

/** An offer with a registered endpoint (a verification of it can be recorded). */
async function endpoint(db: Queryable): Promise<Hex> {
  const offerId = `0x${(++offerCounter).toString(16).padStart(64, "0")}` as Hex;
  await db.query(
    `INSERT INTO offers (offer_id, model_id, owner, operator, payout, status, tariff_version,
       input_price_per_mtok, output_price_per_mtok, wake_fee, region, hardware, max_concurrency,
       capabilities, indexed_block)
     VALUES ($1, $2, $3, $3, $3, 'active', 1, 1, 1, 5, 'eu', 'gpu', 4, '{}', 1)`,
    [offerId, modelId, address],
  );
  await db.query(
    `INSERT INTO provider_endpoints (offer_id, operator, endpoint_sealed, registered_at)
     VALUES ($1, $2, $3, $4)`,
    [offerId, address, Buffer.from("sealed"), t0],
  );
  return offerId;
}

function verdict(offerId: Hex, state: AuditState, eValue: number): OfferAuditVerdict {
  return {
    offerId,
    modelId,
    state,
    eValue,
    flagAt: 40,
    excludeAt: 400,
    reference: { kind: "anchor", offerId: `0x${"aa".repeat(32)}` as Hex },
    tests: [
      { test: "border_probe", samples: 30, referenceSamples: 30, statistic: 0.4, eValue },
      { test: "mmd", samples: 64, referenceSamples: 64, statistic: 0.01, pValue: 0.002, eValue: 3 },
    ],
  };
}

const passed = (at: number) => ({ ok: true as const, verifiedAt: at, expiresAt: at + 3600 });
const stateOf = async (db: Queryable, offerId: Hex) =>
  (await readAuditStandings(db)).get(offerId)?.state;

describe("the audit standings' store", () => {
  const test = useTestDatabase();
  let db: Queryable;
  beforeAll(async () => {
    db = test.db.pool;
    await seedModel(db);
  });

  it("keeps a verdict as written, an infinite e-value and the evidence included", async () => {
    const offerId = await endpoint(db);
    const written = verdict(offerId, "flagged", Number.POSITIVE_INFINITY);
    await saveAuditVerdicts(db, [written], { readAtMs: t0 * 1000, nowMs: t0 * 1000 + 5 });
    expect((await readAuditStandings(db)).get(offerId)).toEqual({
      ...written,
      updatedAtMs: t0 * 1000 + 5,
    });
  });

  it("keeps an exclusion whatever a later verdict says, until a passing verification clears it", async () => {
    const offerId = await endpoint(db);
    const at = { readAtMs: t0 * 1000, nowMs: t0 * 1000 };
    await saveAuditVerdicts(db, [verdict(offerId, "excluded", 900)], at);
    await saveAuditVerdicts(db, [verdict(offerId, "passing", 2)], at);
    const kept = (await readAuditStandings(db)).get(offerId)!;
    expect(kept).toMatchObject({ state: "excluded", eValue: 2 });
    // A run that answered wrongly clears nothing.
    await recordVerification(db, offerId, {
      ok: false,
      check: "completion_failed",
      message: "no",
      transport: false,
      ranAt: t0 + 10,
    });
    expect(await stateOf(db, offerId)).toBe("excluded");
    await recordVerification(db, offerId, passed(t0 + 20));
    expect((await readAuditStandings(db)).get(offerId)).toEqual({
      ...kept,
      state: "unaudited",
      eValue: 1,
      tests: [],
      updatedAtMs: (t0 + 21) * 1000,
      clearedAtMs: (t0 + 21) * 1000,
    });
    // A verdict judged from samples read before the clearing is not written over it; one read
    // after it is.
    await saveAuditVerdicts(db, [verdict(offerId, "excluded", 901)], {
      readAtMs: (t0 + 20) * 1000 + 999,
      nowMs: (t0 + 30) * 1000,
    });
    expect(await stateOf(db, offerId)).toBe("unaudited");
    await saveAuditVerdicts(db, [verdict(offerId, "flagged", 60)], {
      readAtMs: (t0 + 21) * 1000,
      nowMs: (t0 + 30) * 1000,
    });
    expect(await stateOf(db, offerId)).toBe("flagged");
  });

  it("does not clear a flag, nor a passing offer's evidence, on a verification", async () => {
    const [flagged, passing] = [await endpoint(db), await endpoint(db)];
    await saveAuditVerdicts(db, [verdict(flagged, "flagged", 50), verdict(passing, "passing", 3)], {
      readAtMs: t0 * 1000,
      nowMs: t0 * 1000,
    });
    const before = await readAuditStandings(db);
    await recordVerification(db, flagged, passed(t0 + 40));
    await recordVerification(db, passing, passed(t0 + 40));
    const after = await readAuditStandings(db);
    expect(after.get(flagged)).toEqual(before.get(flagged));
    expect(after.get(passing)).toEqual(before.get(passing));
  });
});

describeIfPostgres("a verdict racing a verification's clearing (real PostgreSQL)", () => {
  const test = useTestDatabase();
  let db: Queryable;
  beforeAll(async () => {
    db = test.db.pool;
    await seedModel(db);
  });

  it("never leaves an offer excluded by samples read before the verification that cleared it", async () => {
    const offers: Hex[] = [];
    for (let i = 0; i < 40; i++) offers.push(await endpoint(db));
    const at = { readAtMs: t0 * 1000, nowMs: t0 * 1000 };
    await saveAuditVerdicts(
      db,
      offers.map((o) => verdict(o, "excluded", 1000)),
      at,
    );
    // Each offer: the stale verdict (read before the run) and the run that passed, at once, in
    // either order the database picks.
    await Promise.all(
      offers.flatMap((o, i) => {
        const stale = saveAuditVerdicts(db, [verdict(o, "excluded", 2000)], {
          readAtMs: (t0 + 5) * 1000,
          nowMs: (t0 + 6) * 1000,
        });
        const cleared = recordVerification(db, o, passed(t0 + 5));
        return i % 2 === 0 ? [stale, cleared] : [cleared, stale];
      }),
    );
    const standings = await readAuditStandings(db);
    expect(offers.map((o) => standings.get(o)?.state)).toEqual(offers.map(() => "unaudited"));
  });
});
