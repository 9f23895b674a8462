import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openDatabase, type Database } from "./database.js";
import {
  auditSamplesSince,
  auditSpendOn,
  insertAuditSample,
  reserveAuditSpend,
  settleAuditSpend,
} from "./audit-traffic.js";
import { describeIfPostgres, useTestDatabase } from "../../../test/helpers/db.js";

// The audits' tables (migration 043): the daily budget's reservations, and the samples.

const hex = (n: number): Hex => `0x${n.toString(16).padStart(64, "0")}`;
const model = hex(1);
const offerA = hex(2);
const offerB = hex(3);
const day = "2026-11-30";

describe("the audit budget's lines", () => {
  const test = useTestDatabase();

  it("reserves on the offer's and the model's line both or neither", async () => {
    const { pool } = test.db;
    const budget = { perOffer: 100n, perModel: 150n };
    expect(
      await reserveAuditSpend(pool, day, { modelId: model, offerId: offerA }, 90n, budget),
    ).toBe(true);
    // Offer B has room (it has no line yet), the model has not (90 + 70 > 150): neither moves.
    expect(
      await reserveAuditSpend(pool, day, { modelId: model, offerId: offerB }, 70n, budget),
    ).toBe(false);
    // Offer A's line has no room for 20 (90 + 20 > 100), the model has.
    expect(
      await reserveAuditSpend(pool, day, { modelId: model, offerId: offerA }, 20n, budget),
    ).toBe(false);
    let lines = await auditSpendOn(pool, day);
    expect(lines.map((l) => [l.scope, l.id, l.reserved, l.spent, l.requests])).toEqual([
      ["model", model, 90n, 0n, 1],
      ["offer", offerA, 90n, 0n, 1],
    ]);
    // Settled with the real charge: the reservation is given back, the charge spent.
    await settleAuditSpend(pool, day, { modelId: model, offerId: offerA }, 90n, 31n);
    expect(
      await reserveAuditSpend(pool, day, { modelId: model, offerId: offerB }, 70n, budget),
    ).toBe(true);
    lines = await auditSpendOn(pool, day);
    expect(lines.map((l) => [l.scope, l.id, l.reserved, l.spent])).toEqual([
      ["model", model, 70n, 31n],
      ["offer", offerA, 0n, 31n],
      ["offer", offerB, 70n, 0n],
    ]);
    // A charge above the reservation (it cannot happen: the ledger caps it) counts the reservation.
    await settleAuditSpend(pool, day, { modelId: model, offerId: offerB }, 70n, 500n);
    expect((await auditSpendOn(pool, day)).find((l) => l.id === offerB)?.spent).toBe(70n);
    // Another day starts empty.
    expect(await auditSpendOn(pool, "2026-12-01")).toEqual([]);
  });

  it("keeps samples per model, read since a time, oldest first", async () => {
    const { pool } = test.db;
    for (const [offerId, atMs, text] of [
      [offerA, 2000, "b"],
      [offerB, 1000, "a"],
      [offerA, 3000, "c"],
    ] as const)
      await insertAuditSample(pool, {
        modelId: model,
        offerId,
        test: "mmd",
        promptId: "en-question-01",
        text,
        atMs,
      });
    await insertAuditSample(pool, {
      modelId: hex(9),
      offerId: offerA,
      test: "border_probe",
      promptId: "p",
      text: "x",
      atMs: 5000,
    });
    const samples = await auditSamplesSince(pool, model, 1500);
    expect(samples.map((s) => [s.offerId, s.text, s.atMs])).toEqual([
      [offerA, "b", 2000],
      [offerA, "c", 3000],
    ]);
  });
});

describeIfPostgres("the audit budget under concurrent audits of two processes", () => {
  const test = useTestDatabase();
  let other: Database;
  beforeAll(async () => {
    other = await openDatabase({ url: test.url! });
  });
  afterAll(async () => {
    await other?.close();
  });

  it("never passes the budget: exactly as many reservations as fit succeed", async () => {
    const budget = { perOffer: 70n, perModel: 100n };
    const attempts = Array.from({ length: 40 }, (_, i) =>
      reserveAuditSpend(
        i % 2 === 0 ? test.db.pool : other.pool,
        day,
        { modelId: model, offerId: i % 4 < 2 ? offerA : offerB },
        7n,
        budget,
      ),
    );
    const results = await Promise.all(attempts);
    // The model's line holds 14 reservations of 7 (98 <= 100); each offer's at most 10.
    expect(results.filter(Boolean)).toHaveLength(14);
    const lines = await auditSpendOn(test.db.pool, day);
    const byId = new Map(lines.map((l) => [`${l.scope}:${l.id}`, l.reserved]));
    expect(byId.get(`model:${model}`)).toBe(98n);
    expect((byId.get(`offer:${offerA}`) ?? 0n) + (byId.get(`offer:${offerB}`) ?? 0n)).toBe(98n);
    expect(byId.get(`offer:${offerA}`)! <= 70n && byId.get(`offer:${offerB}`)! <= 70n).toBe(true);
  });
});
