import type pg from "pg";
import type { Hex } from "viem";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

/**
 * The permits the chain says each payer opened (migration 044), written by the catalog indexer
 * in the transaction that advances its cursor, read to list the permits of a payer that
 * authorized a key for all its permits (GET /v1/permits).
 */

export interface OpenedPermit {
  readonly permitId: Hex;
  readonly payer: Hex;
  readonly modelId: Hex;
  readonly blockNumber: bigint;
}

/** Records `PermitOpened` events (one row per permit; a replayed block changes nothing). */
export async function recordOpenedPermits(
  db: Pick<pg.PoolClient, "query">,
  opened: readonly OpenedPermit[],
): Promise<void> {
  if (opened.length === 0) return;
  await db.query(
    `INSERT INTO opened_permits (permit_id, payer, model_id, block_number)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
     ON CONFLICT (permit_id) DO NOTHING`,
    [
      opened.map((p) => normalizeHex(p.permitId)),
      opened.map((p) => normalizeHex(p.payer)),
      opened.map((p) => normalizeHex(p.modelId)),
      opened.map((p) => p.blockNumber.toString()),
    ],
  );
}

/** The newest `limit` permits the `payers` opened, newest first (by the payer index). */
export async function permitsOpenedBy(
  db: Queryable,
  payers: readonly Hex[],
  limit: number,
): Promise<Hex[]> {
  if (payers.length === 0) return [];
  const { rows } = await db.query<{ permit_id: string }>(
    `SELECT o.permit_id FROM unnest($1::text[]) AS p(payer)
     CROSS JOIN LATERAL (
       SELECT permit_id, block_number FROM opened_permits
       WHERE opened_permits.payer = p.payer
       ORDER BY block_number DESC, permit_id LIMIT $2
     ) o
     ORDER BY o.block_number DESC, o.permit_id LIMIT $2`,
    [payers.map((p) => normalizeHex(p)), limit],
  );
  return rows.map((r) => r.permit_id as Hex);
}
