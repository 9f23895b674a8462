import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import type { Queryable } from "./catalog.js";
import { readCooldowns, writeCooldown } from "./offer-cooldowns.js";

// Cooldowns shared between processes (migration 037): one row per offer, upserted.

const offer = `0x${"0C".repeat(32)}` as Hex;
const id = offer.toLowerCase() as Hex;
const t = 1_800_000_000_000;

const test = useTestDatabase();
let db: Queryable;

beforeAll(() => {
  db = test.db.pool;
});

describe("offer cooldowns in the database", () => {
  it("keeps one row per offer, the cooldown that ends last, and reads those ending after a time", async () => {
    await writeCooldown(db, offer, { startedMs: t, untilMs: t + 30_000 });
    // One that ends sooner changes nothing; one that ends later replaces it.
    await writeCooldown(db, offer, { startedMs: t + 1000, untilMs: t + 5_000 });
    expect(await readCooldowns(db, t)).toEqual(
      new Map([[id, { startedMs: t, untilMs: t + 30_000 }]]),
    );
    await writeCooldown(db, offer, { startedMs: t + 40_000, untilMs: t + 50_000 });
    expect(await readCooldowns(db, t)).toEqual(
      new Map([[id, { startedMs: t + 40_000, untilMs: t + 50_000 }]]),
    );
    expect(await readCooldowns(db, t + 50_000)).toEqual(new Map());
    const { rows } = await db.query<{ n: string }>(
      "SELECT count(*)::text AS n FROM offer_cooldowns",
    );
    expect(rows[0]!.n).toBe("1");
  });
});
