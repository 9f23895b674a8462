/**
 * x402 payments in PostgreSQL (issue 37, migration 035): one signature pays one request on
 * every gateway process (the (payer, nonce) key), within the in-flight exposure caps, and a
 * payer whose settlement failed is refused until an operator clears it.
 */
import type pg from "pg";
import type { Hex } from "viem";
import { paymentItemOf, type OpenRefusal, type X402Store } from "../../domain/x402/index.js";
import { inTransaction } from "./ledger-tx.js";

export interface X402Caps {
  /** Most credits (base units of one token) a payer's open payments may hold at once. */
  readonly perPayer: bigint;
  /** Most credits (base units of one token) the open payments of everyone may hold at once. */
  readonly perDeployment: bigint;
}

/**
 * The open payments' exposure, per payer and in all, of one token: an open request counts its
 * maximum, a closed one its charge (until settlement ends the payment), a payment without an
 * unsettled request (never recorded, or in a batch being settled) counts its maximum until its
 * signature expires (it can never settle after).
 *
 * Each open payment finds its request through the partial index of unsettled requests by permit
 * (`inference_requests_unsettled_permit`, migration 031): the cost is the open payments', never
 * the request table's. (A join on `settlement_status IN ('unsettled', 'settling')` matched no
 * index and read every request row: 64 ms of PostgreSQL CPU per paid request at `npm run
 * bench`'s table size; bench/figures/issue-37-x402.md.) A request in a batch being settled
 * counts its payment's maximum for those seconds: more than its charge, never less.
 */
export const exposureSql = `
  SELECT
    coalesce(sum(e.amount) FILTER (WHERE e.payer = $2), 0)::text AS payer,
    coalesce(sum(e.amount), 0)::text AS total
  FROM (
    SELECT p.payer, CASE
      WHEN r.status IS NULL THEN CASE WHEN p.deadline < $3 THEN 0 ELSE p.maximum END
      WHEN r.status IN ('pending', 'streaming') THEN p.maximum
      ELSE r.credits_charged END AS amount
    FROM x402_payments p
    LEFT JOIN LATERAL (
      SELECT u.status, u.credits_charged FROM inference_requests u
      WHERE u.permit_id = p.permit_id AND u.settlement_status = 'unsettled'
      LIMIT 1
    ) r ON true
    WHERE p.state = 'open' AND p.token = $1
  ) e`;

export function createPgX402Store(pool: pg.Pool, caps: X402Caps): X402Store {
  return {
    async open(opened) {
      const { payment, permitId, maximum, now } = opened;
      const payer = payment.payer.toLowerCase();
      const token = payment.token.toLowerCase();
      return inTransaction(pool, async (client): Promise<{ ok: true } | OpenRefusal> => {
        // One open at a time per token, on every process: the caps are sums over the token.
        await client.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 402))", [
          `x402:${token}`,
        ]);
        const blocked = await client.query<{ reason: string; permit_id: string }>(
          "SELECT reason, permit_id FROM x402_blocked_payers WHERE payer = $1",
          [payer],
        );
        const block = blocked.rows[0];
        if (block !== undefined)
          return refusal(
            "payer_blocked",
            `payer ${payment.payer} is refused x402 payments: the settlement of ${block.permit_id} failed (${block.reason}); an operator must clear it`,
          );
        const { rows } = await client.query<{ payer: string; total: string }>(exposureSql, [
          token,
          payer,
          now,
        ]);
        const exposure = rows[0]!;
        if (BigInt(exposure.payer) + maximum > caps.perPayer)
          return refusal(
            "payment_exposure_exceeded",
            `payer ${payment.payer} has ${exposure.payer} in payments not yet settled; with this request's ${maximum} that passes the cap of ${caps.perPayer}: retry once they settle`,
          );
        if (BigInt(exposure.total) + maximum > caps.perDeployment)
          return refusal(
            "payment_exposure_exceeded",
            `the gateway holds ${exposure.total} in x402 payments not yet settled; with this request's ${maximum} that passes its cap of ${caps.perDeployment}: retry shortly`,
          );
        const inserted = await client.query(
          `INSERT INTO x402_payments (payer, nonce, permit_id, token, signed_amount, maximum,
             deadline, payload, created_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
           ON CONFLICT DO NOTHING`,
          [
            payer,
            payment.nonce.toString(),
            permitId,
            token,
            payment.signedAmount.toString(),
            maximum.toString(),
            payment.deadline.toString(),
            JSON.stringify(paymentItemOf(opened.payment)),
            now,
          ],
        );
        if (inserted.rowCount !== 1)
          return refusal(
            "payment_used",
            `this payment (payer ${payment.payer}, nonce ${payment.nonce}) has already paid for a request: sign a new one`,
          );
        return { ok: true };
      });
    },

    async release(permitId) {
      // Only a payment no request to settle was recorded for: a recorded one is the
      // settlement's (found through the partial index of unsettled requests by permit).
      await pool.query(
        `DELETE FROM x402_payments p WHERE p.permit_id = $1 AND p.state = 'open'
           AND NOT EXISTS (SELECT 1 FROM inference_requests r
                           WHERE r.permit_id = p.permit_id AND r.settlement_status = 'unsettled')`,
        [permitId],
      );
    },
  };
}

function refusal(code: OpenRefusal["code"], message: string): OpenRefusal {
  return { ok: false, code, message } as OpenRefusal;
}

/** Payments of these permits settled (in the batch's transaction). */
export async function markPaymentsSettled(
  client: pg.PoolClient,
  permitIds: readonly string[],
  now: number,
): Promise<void> {
  if (permitIds.length === 0) return;
  await client.query(
    `UPDATE x402_payments SET state = 'settled', ended_at = $2
     WHERE permit_id = ANY ($1::text[]) AND state = 'open'`,
    [permitIds, now],
  );
}

/**
 * Payments of these permits that the chain refused: failed with their reason, and their payers
 * refused further x402 payments until an operator clears them (in the marking's transaction).
 */
export async function markPaymentsFailed(
  client: pg.PoolClient,
  failed: readonly { readonly permitId: string; readonly reason: string }[],
  now: number,
): Promise<void> {
  if (failed.length === 0) return;
  const ids = failed.map((f) => f.permitId);
  const reasons = failed.map((f) => f.reason);
  await client.query(
    `WITH failed AS (
       UPDATE x402_payments p SET state = 'failed', reason = m.reason, ended_at = $3
       FROM unnest($1::text[], $2::text[]) AS m(permit_id, reason)
       WHERE p.permit_id = m.permit_id AND p.state = 'open'
       RETURNING p.payer, p.permit_id, p.reason)
     INSERT INTO x402_blocked_payers (payer, permit_id, reason, blocked_at)
     SELECT DISTINCT ON (payer) payer, permit_id, reason, $3 FROM failed
     ON CONFLICT (payer) DO NOTHING`,
    [ids, reasons, now],
  );
}

/** A payer refused x402 payments after a failed settlement, as an operator reviews it. */
export interface BlockedPayer {
  readonly payer: string;
  /** The payment whose settlement failed. */
  readonly permitId: string;
  readonly reason: string;
  /** Unix seconds. */
  readonly blockedAt: number;
}

/** The payers refused x402 payments, the latest first. */
export async function listBlockedPayers(pool: pg.Pool): Promise<BlockedPayer[]> {
  const { rows } = await pool.query<{
    payer: string;
    permit_id: string;
    reason: string;
    blocked_at: string;
  }>(
    "SELECT payer, permit_id, reason, blocked_at FROM x402_blocked_payers ORDER BY blocked_at DESC, payer",
  );
  return rows.map((r) => ({
    payer: r.payer,
    permitId: r.permit_id,
    reason: r.reason,
    blockedAt: Number(r.blocked_at),
  }));
}

/** An operator clears a payer refused after a failed settlement; true if it was blocked. */
export async function clearBlockedPayer(pool: pg.Pool, payer: Hex): Promise<boolean> {
  const { rowCount } = await pool.query("DELETE FROM x402_blocked_payers WHERE payer = $1", [
    payer.toLowerCase(),
  ]);
  return rowCount === 1;
}
