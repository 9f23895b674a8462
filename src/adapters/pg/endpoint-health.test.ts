import pg from "pg";
import type { Hex } from "viem";
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDatabase } from "../../../test/helpers/db.js";
import type { Queryable } from "./catalog.js";
import { claimWakeFee, recordProbe } from "./endpoint-health.js";
import { upsertProviderEndpoint } from "./registrations.js";

// The wake fee's claim on the endpoint's row (migration 025; docs/decisions/chat-quotes-and-money.md "Wake fees").

const modelId = `0x${"11".repeat(32)}` as Hex;
const address = `0x${"33".repeat(20)}` as Hex;
const window = 300;
const t0 = 1_700_000_000;

const test = useTestDatabase();
let db: Queryable;
let offerCounter = 0;

beforeAll(async () => {
  db = test.db.pool;
  await db.query(
    `INSERT INTO models (model_id, creator, credit_token, repository, revision, task, pool_id,
       position_token_id, status, indexed_block)
     VALUES ($1, $2, $2, 'acme/llama', 'main', 'chat', $1, 1, 'active', 1)`,
    [modelId, address],
  );
});

async function endpoint(): Promise<Hex> {
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

const claimed = async (offerId: Hex, now: number) =>
  (await claimWakeFee(db, offerId, now, window)).claimed;

describe("claimWakeFee", () => {
  it("claims only an endpoint the probe last saw down", async () => {
    const offerId = await endpoint();
    expect(await claimWakeFee(db, offerId, t0, window)).toEqual({
      claimed: false,
      chargedAt: undefined,
    });
    await recordProbe(db, offerId, true, t0);
    expect(await claimed(offerId, t0 + 1)).toBe(false);
    await recordProbe(db, offerId, false, t0 + 2);
    expect(await claimWakeFee(db, offerId, t0 + 3, window)).toEqual({
      claimed: true,
      chargedAt: t0 + 3,
    });
  });

  it("claims once per window, and again only after a later probe saw the endpoint down", async () => {
    const offerId = await endpoint();
    await recordProbe(db, offerId, false, t0);
    expect(await claimed(offerId, t0 + 1)).toBe(true);
    expect(await claimWakeFee(db, offerId, t0 + 2, window)).toEqual({
      claimed: false,
      chargedAt: t0 + 1,
    });
    // A probe inside the window: still none.
    await recordProbe(db, offerId, false, t0 + 100);
    expect(await claimed(offerId, t0 + window)).toBe(false);
    // The window has passed and the probe at t0 + 100 came after the fee: one more.
    expect(await claimed(offerId, t0 + 1 + window)).toBe(true);
    // The window passes again, but no probe has seen it down since the last fee: none.
    expect(await claimed(offerId, t0 + 2 + 2 * window)).toBe(false);
    // A probe that saw it running, then the window: none either.
    await recordProbe(db, offerId, true, t0 + 3 + 2 * window);
    expect(await claimed(offerId, t0 + 4 + 2 * window)).toBe(false);
  });

  it("keeps the last fee across a re-registration (a new endpoint opens no new window)", async () => {
    const offerId = await endpoint();
    await recordProbe(db, offerId, false, t0);
    expect(await claimed(offerId, t0 + 1)).toBe(true);
    await upsertProviderEndpoint(db, {
      offerId,
      operator: address,
      endpointSealed: Buffer.from("sealed again"),
      registeredAt: t0 + 2,
    });
    await recordProbe(db, offerId, false, t0 + 3);
    expect(await claimWakeFee(db, offerId, t0 + 4, window)).toEqual({
      claimed: false,
      chargedAt: t0 + 1,
    });
  });

  it("lets exactly one of many concurrent claims through, from every pool sharing the database", async () => {
    const offerId = await endpoint();
    await recordProbe(db, offerId, false, t0);
    // A second pool stands for a second gateway process (PostgreSQL only: PGlite has one).
    const other = test.url === undefined ? undefined : new pg.Pool({ connectionString: test.url });
    try {
      const pools: Queryable[] = other === undefined ? [db] : [db, other];
      const results = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          claimWakeFee(pools[i % pools.length]!, offerId, t0 + 1, window),
        ),
      );
      expect(results.filter((r) => r.claimed)).toEqual([{ claimed: true, chargedAt: t0 + 1 }]);
      expect(await claimWakeFee(db, offerId, t0 + 2, window)).toEqual({
        claimed: false,
        chargedAt: t0 + 1,
      });
    } finally {
      await other?.end();
    }
  });
});
