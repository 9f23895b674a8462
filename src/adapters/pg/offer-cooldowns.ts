import type { Hex } from "viem";
import type { Cooldown, CooldownStore } from "../../domain/reputation/cooldowns.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

// `offer_cooldowns` (migration 037): one row per offer whose provider asked for rest.

/** Upserts an offer's cooldown; one that ends sooner than the stored one changes nothing. */
export async function writeCooldown(db: Queryable, offerId: Hex, c: Cooldown): Promise<void> {
  await db.query(
    `INSERT INTO offer_cooldowns (offer_id, started_ms, until_ms) VALUES ($1, $2, $3)
     ON CONFLICT (offer_id) DO UPDATE SET started_ms = EXCLUDED.started_ms,
       until_ms = EXCLUDED.until_ms
     WHERE offer_cooldowns.until_ms < EXCLUDED.until_ms`,
    [normalizeHex(offerId), Math.floor(c.startedMs), Math.ceil(c.untilMs)],
  );
}

/** Every cooldown that ends after `sinceMs` (one row per offer: the table is read whole). */
export async function readCooldowns(db: Queryable, sinceMs: number): Promise<Map<Hex, Cooldown>> {
  const { rows } = await db.query<{ offer_id: string; started_ms: string; until_ms: string }>(
    "SELECT offer_id, started_ms, until_ms FROM offer_cooldowns WHERE until_ms > $1",
    [Math.floor(sinceMs)],
  );
  return new Map(
    rows.map((r) => [
      r.offer_id as Hex,
      { startedMs: Number(r.started_ms), untilMs: Number(r.until_ms) },
    ]),
  );
}

export function createPgCooldownStore(db: Queryable): CooldownStore {
  return {
    write: (offerId, c) => writeCooldown(db, offerId, c),
    read: (sinceMs) => readCooldowns(db, sinceMs),
  };
}
