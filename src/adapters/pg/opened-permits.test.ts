import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import type { Queryable } from "./catalog.js";
import { permitsOpenedBy, recordOpenedPermits } from "./opened-permits.js";

// The permits each payer opened, indexed from PermitOpened (migration 044).

const id = (n: number) => `0x${n.toString(16).padStart(64, "0")}` as Hex;
const payerA = `0x${"Aa".repeat(20)}` as Hex;
const payerB = `0x${"bB".repeat(20)}` as Hex;
const model = id(0xfeed);

const test = useTestDatabase();
let db: Queryable;

beforeAll(() => {
  db = test.db.pool;
});

describe("opened permits in the database", () => {
  it("keeps one row per permit (a replayed block changes nothing) and lists a payer's newest first", async () => {
    const opened = [
      { permitId: id(1), payer: payerA, modelId: model, blockNumber: 10n },
      { permitId: id(2), payer: payerB, modelId: model, blockNumber: 11n },
      { permitId: id(3), payer: payerA, modelId: model, blockNumber: 12n },
    ];
    await recordOpenedPermits(db, opened);
    // The indexer replays a range after a crash before its cursor advanced: same rows again.
    await recordOpenedPermits(db, [{ ...opened[0]!, blockNumber: 99n }]);
    expect(await permitsOpenedBy(db, [payerA], 10)).toEqual([id(3), id(1)]);
    // Addresses are compared in any case; several payers merge newest first; the limit holds.
    expect(await permitsOpenedBy(db, [payerA.toLowerCase() as Hex, payerB], 10)).toEqual([
      id(3),
      id(2),
      id(1),
    ]);
    expect(await permitsOpenedBy(db, [payerA, payerB], 2)).toEqual([id(3), id(2)]);
    expect(await permitsOpenedBy(db, [], 10)).toEqual([]);
  });
});
