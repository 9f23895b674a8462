import type pg from "pg";
import type { Hex } from "viem";
import type { AuditBudget, AuditSpendLine, AuditSpendStore } from "../../domain/audits/budget.js";
import type { AuditSampleStore, StoredAuditSample } from "../../domain/audits/runner.js";
import type { AuditSample, AuditTestName } from "../../domain/audits/types.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";
import { inTransaction, refuse } from "./ledger-tx.js";

// The audit traffic's tables (migration 043): its samples, and its daily spend.

/**
 * Reserves `amount` on the offer's and the model's lines of `day`, both or neither. The update
 * checks each line against its own budget; under READ COMMITTED a concurrent reservation of the
 * same line is waited for and the check made again on the line as it committed, so the budget
 * holds across processes.
 */
export function reserveAuditSpend(
  pool: pg.Pool,
  day: string,
  line: { modelId: Hex; offerId: Hex },
  amount: bigint,
  budget: AuditBudget,
): Promise<boolean> {
  const modelId = normalizeHex(line.modelId);
  const offerId = normalizeHex(line.offerId);
  return inTransaction(pool, async (client) => {
    // Lines made and locked in one order (the model's, then the offer's: 'model' < 'offer'), the
    // same in every transaction and in the settlement, so two audits never wait on each other
    // in a circle (a new row is held by the transaction that inserted it).
    await client.query(
      `INSERT INTO audit_spend (day, scope, id, model_id)
       VALUES ($1, 'model', $3, $3), ($1, 'offer', $2, $3)
       ON CONFLICT (day, scope, id) DO NOTHING`,
      [day, offerId, modelId],
    );
    await client.query(
      `SELECT 1 FROM audit_spend WHERE day = $1 AND ((scope = 'model' AND id = $3)
         OR (scope = 'offer' AND id = $2)) ORDER BY scope FOR UPDATE`,
      [day, offerId, modelId],
    );
    const { rowCount } = await client.query(
      `UPDATE audit_spend SET reserved = reserved + $4, requests = requests + 1
       WHERE day = $1 AND ((scope = 'offer' AND id = $2 AND spent + reserved + $4 <= $5)
         OR (scope = 'model' AND id = $3 AND spent + reserved + $4 <= $6))`,
      [
        day,
        offerId,
        modelId,
        amount.toString(),
        budget.perOffer.toString(),
        budget.perModel.toString(),
      ],
    );
    return rowCount === 2 ? true : refuse(false);
  });
}

/** Gives a reservation back and adds what was charged (capped at the reservation). */
export async function settleAuditSpend(
  db: Queryable,
  day: string,
  line: { modelId: Hex; offerId: Hex },
  reserved: bigint,
  charged: bigint,
): Promise<void> {
  const spent = charged < reserved ? charged : reserved;
  // The rows locked in the reservation's order first (a bare UPDATE locks them in the order it
  // finds them, and a reservation holding the model's line waiting for the offer's would
  // deadlock with it: seen on PostgreSQL under concurrent audits).
  await db.query(
    `WITH locked AS (
       SELECT day, scope, id FROM audit_spend
       WHERE day = $1 AND ((scope = 'offer' AND id = $2) OR (scope = 'model' AND id = $3))
       ORDER BY scope FOR UPDATE)
     UPDATE audit_spend a SET reserved = a.reserved - $4, spent = a.spent + $5
     FROM locked l WHERE a.day = l.day AND a.scope = l.scope AND a.id = l.id`,
    [
      day,
      normalizeHex(line.offerId),
      normalizeHex(line.modelId),
      reserved.toString(),
      spent.toString(),
    ],
  );
}

/** Every spend line of `day`, models first. */
export async function auditSpendOn(db: Queryable, day: string): Promise<AuditSpendLine[]> {
  const { rows } = await db.query<{
    scope: "offer" | "model";
    id: string;
    model_id: string;
    spent: string;
    reserved: string;
    requests: number;
  }>(
    `SELECT scope, id, model_id, spent::text, reserved::text, requests FROM audit_spend
     WHERE day = $1 ORDER BY model_id, scope, id`,
    [day],
  );
  return rows.map((r) => ({
    scope: r.scope,
    id: r.id as Hex,
    modelId: r.model_id as Hex,
    spent: BigInt(r.spent),
    reserved: BigInt(r.reserved),
    requests: Number(r.requests),
  }));
}

export function createPgAuditSpendStore(pool: pg.Pool): AuditSpendStore {
  return {
    reserve: (day, modelId, offerId, amount, budget) =>
      reserveAuditSpend(pool, day, { modelId, offerId }, amount, budget),
    settle: (day, modelId, offerId, reserved, charged) =>
      settleAuditSpend(pool, day, { modelId, offerId }, reserved, charged),
    spendOn: (day) => auditSpendOn(pool, day),
  };
}

export async function insertAuditSample(db: Queryable, sample: StoredAuditSample): Promise<void> {
  await db.query(
    `INSERT INTO audit_samples
       (model_id, offer_id, test, prompt_id, text, mean_logprob, at_ms, request_id)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    [
      normalizeHex(sample.modelId),
      normalizeHex(sample.offerId),
      sample.test,
      sample.promptId,
      sample.text ?? null,
      sample.meanLogprob ?? null,
      Math.floor(sample.atMs),
      sample.requestId === undefined ? null : normalizeHex(sample.requestId),
    ],
  );
}

/** A model's samples since `sinceMs`, oldest first (audit_samples_model_at). */
export async function auditSamplesSince(
  db: Queryable,
  modelId: Hex,
  sinceMs: number,
): Promise<AuditSample[]> {
  const { rows } = await db.query<{
    offer_id: string;
    test: AuditTestName;
    prompt_id: string;
    text: string | null;
    mean_logprob: number | null;
    at_ms: string;
  }>(
    `SELECT offer_id, test, prompt_id, text, mean_logprob, at_ms::text FROM audit_samples
     WHERE model_id = $1 AND at_ms >= $2 ORDER BY at_ms, id`,
    [normalizeHex(modelId), Math.floor(sinceMs)],
  );
  return rows.map((r) => ({
    offerId: r.offer_id as Hex,
    modelId: normalizeHex(modelId),
    test: r.test,
    promptId: r.prompt_id,
    text: r.text ?? undefined,
    meanLogprob: r.mean_logprob ?? undefined,
    atMs: Number(r.at_ms),
  }));
}

export function createPgAuditSampleStore(db: Queryable): AuditSampleStore {
  return {
    add: (sample) => insertAuditSample(db, sample),
    since: (modelId, sinceMs) => auditSamplesSince(db, modelId, sinceMs),
  };
}
