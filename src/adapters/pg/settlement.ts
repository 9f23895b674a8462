import type pg from "pg";
import { BaseError } from "../../domain/base-error.js";
import type { Hex } from "viem";
import type {
  PaymentItem,
  BatchCharge,
  InFlightBatch,
  PendingCharge,
  SettlementAttempt,
  SettlementStore,
  UnsettleableMark,
} from "../../domain/settlement/index.js";
import { inTransaction } from "./ledger-tx.js";
import { markPaymentsFailed, markPaymentsSettled } from "./x402.js";

/**
 * The settlement tables (migration 008) behind the flusher's {@link SettlementStore} port.
 *
 * Every write a flusher makes on behalf of its account is fenced by the account's lease: the
 * transaction first locks the account row and checks that this holder's lease is still live on
 * the database clock, so a flusher that lost its lease (a long pause, a partition) can store
 * nothing more, and two flushers can never both store a batch for one nonce or one charge.
 *
 * Lock order, the ledger's (quote, request, offers, permit) with the settlement rows in front:
 * account row, batch row, request rows, permit rows (ascending permit id). The requests this
 * module writes are final ones; the ledger's own transactions only ever lock open requests.
 */
export class LeaseLostError extends BaseError {
  readonly reason = "settlement_lease_lost";
  override readonly name = "LeaseLostError";
  constructor(account: string) {
    super(`the settlement lease of ${account} is no longer held by this flusher`);
  }
}

interface ChargeRow {
  id: string;
  permit_id: string;
  offer_id: string;
  credits_charged: string;
  closable_at: string | null;
  payment?: PaymentItem | null;
}

const toCharge = (row: ChargeRow): PendingCharge => ({
  requestId: row.id,
  permitId: row.permit_id as Hex,
  offerId: row.offer_id as Hex,
  credits: BigInt(row.credits_charged),
  closableAt: row.closable_at === null ? undefined : Number(row.closable_at),
  ...(row.payment == null ? {} : { payment: row.payment }),
});

interface AttemptRow {
  tx_hash: string;
  nonce: string;
  raw_tx: string;
  gas_limit: string;
  max_fee_per_gas: string;
  max_priority_fee_per_gas: string;
  head_block: string;
  sent_block: string | null;
}

const toAttempt = (row: AttemptRow): SettlementAttempt => ({
  txHash: row.tx_hash as Hex,
  nonce: Number(row.nonce),
  raw: row.raw_tx as Hex,
  gas: BigInt(row.gas_limit),
  maxFeePerGas: BigInt(row.max_fee_per_gas),
  maxPriorityFeePerGas: BigInt(row.max_priority_fee_per_gas),
  headBlock: BigInt(row.head_block),
  sentBlock: row.sent_block === null ? undefined : BigInt(row.sent_block),
});

async function lockAccount(client: pg.PoolClient, account: string, holder: string) {
  const { rows } = await client.query<{ next_nonce: string }>(
    `SELECT next_nonce FROM settlement_accounts
     WHERE account = $1 AND holder = $2 AND lease_expires_at > now() FOR UPDATE`,
    [account, holder],
  );
  if (rows[0] === undefined) throw new LeaseLostError(account);
  return Number(rows[0].next_nonce);
}

/** Adds `amounts` to one column of the permits' ledger rows, in ascending permit order. */
async function addToPermits(
  client: pg.PoolClient,
  column: "settled" | "unsettleable",
  amounts: Map<string, bigint>,
): Promise<void> {
  for (const permitId of [...amounts.keys()].sort()) {
    const { rowCount } = await client.query(
      `UPDATE permit_ledgers SET ${column} = ${column} + $2::numeric, updated_at = now()
       WHERE permit_id = $1`,
      [permitId, amounts.get(permitId)!.toString()],
    );
    if (rowCount !== 1) throw new Error(`ledger inconsistency: permit ledger ${permitId} missing`);
  }
}

function sumByPermit(rows: readonly { permit_id: string; credits_charged: string }[]) {
  const sums = new Map<string, bigint>();
  for (const row of rows)
    sums.set(row.permit_id, (sums.get(row.permit_id) ?? 0n) + BigInt(row.credits_charged));
  return sums;
}

/** The account's lease: who may flush it, on the database clock. */
function leaseMethods(pool: pg.Pool): Pick<SettlementStore, "takeLease" | "releaseLease"> {
  return {
    async takeLease(account, holder, seconds) {
      const { rows } = await pool.query(
        `INSERT INTO settlement_accounts AS a (account, holder, lease_expires_at)
         VALUES ($1, $2, now() + make_interval(secs => $3))
         ON CONFLICT (account) DO UPDATE
           SET holder = EXCLUDED.holder, lease_expires_at = EXCLUDED.lease_expires_at
           WHERE a.holder IS NULL OR a.holder = EXCLUDED.holder OR a.lease_expires_at <= now()
         RETURNING holder`,
        [account, holder, seconds],
      );
      return rows.length === 1;
    },

    async releaseLease(account, holder) {
      await pool.query(
        `UPDATE settlement_accounts SET holder = NULL, lease_expires_at = NULL
         WHERE account = $1 AND holder = $2`,
        [account, holder],
      );
    },
  };
}

/** The queue of unsettled charges, and taking out those that can never settle. */
function queueMethods(
  pool: pg.Pool,
): Pick<SettlementStore, "pendingCharges" | "closingPermitsWithCharges" | "markUnsettleable"> {
  return {
    async pendingCharges({ limit, permits }) {
      // Charges on permits in their close grace period first (soonest closable first), then
      // the oldest; each query walks a partial index of the unsettled requests (migration 031:
      // by permit, and by admission, since no index names the close's completed_at). Open
      // requests are unsettled too, and left out by their charge (none yet).
      const closing = await pool.query<ChargeRow>(
        `SELECT r.id, r.permit_id, r.offer_id, r.credits_charged, c.closable_at
         FROM permit_closings c
         JOIN inference_requests r ON r.permit_id = c.permit_id
           AND r.settlement_status = 'unsettled' AND r.credits_charged > 0
           AND r.status IN ('completed', 'failed', 'cancelled')
         WHERE $2::text[] IS NULL OR c.permit_id = ANY ($2)
         ORDER BY c.closable_at, r.created_at, r.id
         LIMIT $1`,
        [limit, permits ?? null],
      );
      const charges = closing.rows.map(toCharge);
      if (permits !== undefined || charges.length >= limit) return charges;
      const taken = charges.map((c) => c.requestId);
      const rest = await pool.query<ChargeRow>(
        `SELECT r.id, r.permit_id, r.offer_id, r.credits_charged, NULL AS closable_at,
           (SELECT x.payload FROM x402_payments x WHERE x.permit_id = r.permit_id) AS payment
         FROM inference_requests r
         WHERE r.settlement_status = 'unsettled' AND r.credits_charged > 0
           AND NOT (r.id = ANY ($2::text[]))
         ORDER BY r.created_at, r.id
         LIMIT $1`,
        [limit - charges.length, taken],
      );
      return charges.concat(rest.rows.map(toCharge));
    },

    async closingPermitsWithCharges() {
      const { rows } = await pool.query<{ permit_id: string; closable_at: string }>(
        `SELECT c.permit_id, c.closable_at FROM permit_closings c
         WHERE EXISTS (SELECT 1 FROM inference_requests r WHERE r.permit_id = c.permit_id
           AND r.settlement_status = 'unsettled' AND r.credits_charged > 0
           AND r.status IN ('completed', 'failed', 'cancelled'))
         ORDER BY c.closable_at`,
      );
      return rows.map((r) => ({ permitId: r.permit_id as Hex, closableAt: Number(r.closable_at) }));
    },

    async markUnsettleable(account, holder, marks: readonly UnsettleableMark[]) {
      if (marks.length === 0) return;
      await inTransaction(pool, async (client) => {
        await lockAccount(client, account, holder);
        const ids = marks.flatMap((m) => m.requestIds).sort();
        const reasons = new Map(marks.flatMap((m) => m.requestIds.map((id) => [id, m.reason])));
        const { rows } = await client.query<{
          id: string;
          permit_id: string;
          credits_charged: string;
        }>(
          `UPDATE inference_requests r
           SET settlement_status = 'unsettleable', settlement_reason = m.reason
           FROM unnest($1::text[], $2::text[]) AS m(id, reason)
           WHERE r.id = m.id AND r.settlement_status = 'unsettled'
           RETURNING r.id, r.permit_id, r.credits_charged`,
          [ids, ids.map((id) => reasons.get(id)!)],
        );
        const byPermit = rows.map((r) => ({ permitId: r.permit_id, reason: reasons.get(r.id)! }));
        await markPaymentsFailed(client, byPermit, Math.floor(Date.now() / 1000));
        await addToPermits(client, "unsettleable", sumByPermit(rows));
      });
    },
  };
}

/** A batch and its signed attempts, stored before anything is broadcast. */
function batchWrites(
  pool: pg.Pool,
): Pick<SettlementStore, "storeBatch" | "recordAttempt" | "markSent"> {
  return {
    async storeBatch(input, sign) {
      return inTransaction(pool, async (client) => {
        await lockAccount(client, input.account, input.holder);
        // One transaction in flight per account: the chain's count of mined transactions is
        // the next free nonce. The stored next_nonce is the record of what was used.
        const nonce = input.chainNonce;
        const ids = input.charges.flatMap((c) => c.requestIds).sort();
        const { rowCount } = await client.query(
          `UPDATE inference_requests SET settlement_status = 'settling', batch_id = $2,
             tx_hash = NULL, settled_at = NULL
           WHERE id = ANY ($1::text[]) AND settlement_status = 'unsettled'`,
          [ids, input.batchId],
        );
        if (rowCount !== ids.length) {
          throw new Error(
            `settlement: ${ids.length - (rowCount ?? 0)} charges of batch ${input.batchId} are no longer unsettled`,
          );
        }
        const attempt = await sign(nonce);
        const charges = input.charges.map((c) => ({
          permit_id: c.permitId,
          offer_id: c.offerId,
          amount: c.amount.toString(),
          requests: c.requestIds.length,
        }));
        await client.query(
          `INSERT INTO settlement_batches (batch_id, account, status, charges, calldata, requests,
             credits, created_at)
           VALUES ($1, $2, 'pending', $3, $4, $5, $6, $7)`,
          [
            input.batchId,
            input.account,
            JSON.stringify(charges),
            input.calldata,
            ids.length,
            input.charges.reduce((sum, c) => sum + c.amount, 0n).toString(),
            input.now,
          ],
        );
        await insertAttempt(client, input.batchId, attempt, input.now);
        await client.query("UPDATE settlement_accounts SET next_nonce = $2 WHERE account = $1", [
          input.account,
          nonce + 1,
        ]);
        return attempt;
      });
    },

    async recordAttempt(input, sign) {
      return inTransaction(pool, async (client) => {
        const nextNonce = await lockAccount(client, input.account, input.holder);
        const nonce = input.nonce ?? input.chainNonce;
        const attempt = await sign(nonce);
        await insertAttempt(client, input.batchId, attempt, input.now);
        if (nonce + 1 > nextNonce) {
          await client.query("UPDATE settlement_accounts SET next_nonce = $2 WHERE account = $1", [
            input.account,
            nonce + 1,
          ]);
        }
        return attempt;
      });
    },

    async markSent(batchId, txHash, head) {
      await inTransaction(pool, async (client) => {
        await client.query(
          `UPDATE settlement_attempts SET sent_block = $3
           WHERE tx_hash = $2 AND batch_id = $1 AND sent_block IS NULL`,
          [batchId, txHash, head.toString()],
        );
        await client.query(
          "UPDATE settlement_batches SET status = 'submitted' WHERE batch_id = $1 AND status = 'pending'",
          [batchId],
        );
      });
    },
  };
}

/** The batches in flight and their attempts, as stored. */
function batchReads(pool: pg.Pool): Pick<SettlementStore, "inFlight" | "attempts"> {
  return {
    async inFlight(account) {
      const { rows } = await pool.query<{
        batch_id: string;
        status: "pending" | "submitted";
        charges: { permit_id: string; offer_id: string; amount: string; requests: number }[];
        calldata: string;
        requests: number;
        credits: string;
      }>(
        `SELECT batch_id, status, charges, calldata, requests, credits FROM settlement_batches
         WHERE account = $1 AND status IN ('pending', 'submitted') ORDER BY created_at, batch_id`,
        [account],
      );
      const batches: InFlightBatch[] = [];
      for (const row of rows) {
        batches.push({
          batchId: row.batch_id as Hex,
          status: row.status,
          calldata: row.calldata as Hex,
          requests: row.requests,
          credits: BigInt(row.credits),
          charges: row.charges.map((c): BatchCharge => ({
            permitId: c.permit_id as Hex,
            offerId: c.offer_id as Hex,
            amount: BigInt(c.amount),
            requests: c.requests,
          })),
          attempts: await this.attempts(row.batch_id as Hex),
        });
      }
      return batches;
    },

    async attempts(batchId) {
      const { rows } = await pool.query<AttemptRow>(
        `SELECT tx_hash, nonce, raw_tx, gas_limit, max_fee_per_gas, max_priority_fee_per_gas,
           head_block, sent_block
         FROM settlement_attempts WHERE batch_id = $1 ORDER BY nonce, max_fee_per_gas`,
        [batchId],
      );
      return rows.map(toAttempt);
    },
  };
}

/** A batch's end: settled (the permits' `settled` raised) or failed (its charges unsettled again). */
function outcomeMethods(pool: pg.Pool): Pick<SettlementStore, "markSettled" | "markFailed"> {
  return {
    async markSettled(batchId, outcome) {
      return inTransaction(pool, async (client) => {
        const batch = await client.query(
          `UPDATE settlement_batches SET status = 'settled', tx_hash = $2, block_number = $3,
             gas_used = $4, settled_at = $5, error = NULL
           WHERE batch_id = $1 AND status IN ('pending', 'submitted')`,
          [
            batchId,
            outcome.txHash,
            outcome.blockNumber.toString(),
            outcome.gasUsed.toString(),
            outcome.settledAt,
          ],
        );
        if (batch.rowCount !== 1) return false;
        const { rows } = await client.query<{ permit_id: string; credits_charged: string }>(
          `WITH settled AS (
             UPDATE inference_requests SET settlement_status = 'settled', tx_hash = $2,
               settled_at = $3
             WHERE batch_id = $1 AND settlement_status = 'settling'
             RETURNING permit_id, credits_charged)
           SELECT permit_id, sum(credits_charged) AS credits_charged FROM settled
           GROUP BY permit_id`,
          [batchId, outcome.txHash, outcome.settledAt],
        );
        await addToPermits(client, "settled", sumByPermit(rows));
        await markPaymentsSettled(
          client,
          rows.map((r) => r.permit_id),
          outcome.settledAt,
        );
        return true;
      });
    },

    async markFailed(batchId, outcome) {
      return inTransaction(pool, async (client) => {
        const batch = await client.query(
          `UPDATE settlement_batches SET status = 'failed', tx_hash = $2, block_number = $3,
             gas_used = $4, error = $5
           WHERE batch_id = $1 AND status IN ('pending', 'submitted')`,
          [
            batchId,
            outcome.txHash ?? null,
            outcome.blockNumber?.toString() ?? null,
            outcome.gasUsed?.toString() ?? null,
            outcome.error,
          ],
        );
        if (batch.rowCount !== 1) return false;
        await client.query(
          `UPDATE inference_requests SET settlement_status = 'unsettled', batch_id = NULL,
             tx_hash = NULL
           WHERE batch_id = $1 AND settlement_status = 'settling'`,
          [batchId],
        );
        return true;
      });
    },
  };
}

export function createPgSettlementStore(pool: pg.Pool): SettlementStore {
  return {
    ...leaseMethods(pool),
    ...queueMethods(pool),
    ...batchWrites(pool),
    ...batchReads(pool),
    ...outcomeMethods(pool),
  };
}

async function insertAttempt(
  client: pg.PoolClient,
  batchId: Hex,
  attempt: SettlementAttempt,
  now: number,
): Promise<void> {
  await client.query(
    `INSERT INTO settlement_attempts (tx_hash, batch_id, nonce, raw_tx, gas_limit,
       max_fee_per_gas, max_priority_fee_per_gas, head_block, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    [
      attempt.txHash,
      batchId,
      attempt.nonce,
      attempt.raw,
      attempt.gas.toString(),
      attempt.maxFeePerGas.toString(),
      attempt.maxPriorityFeePerGas.toString(),
      attempt.headBlock.toString(),
      now,
    ],
  );
}

/** Per permit and per offer, what the gateway holds as settled and unsettleable (reconciliation). */
export async function settledSums(pool: pg.Pool): Promise<{
  permits: { permitId: Hex; settled: bigint; unsettleable: bigint; ledgerSettled: bigint }[];
  offers: { offerId: Hex; settled: bigint }[];
}> {
  const permits = await pool.query<{
    permit_id: string;
    settled: string;
    unsettleable: string;
    ledger_settled: string;
  }>(
    `SELECT l.permit_id,
       COALESCE(s.settled, 0) AS settled, COALESCE(s.unsettleable, 0) AS unsettleable,
       l.settled AS ledger_settled
     FROM permit_ledgers l
     LEFT JOIN (
       SELECT permit_id,
         sum(credits_charged) FILTER (WHERE settlement_status = 'settled') AS settled,
         sum(credits_charged) FILTER (WHERE settlement_status = 'unsettleable') AS unsettleable
       FROM inference_requests WHERE settlement_status IN ('settled', 'unsettleable')
       GROUP BY permit_id
     ) s ON s.permit_id = l.permit_id
     ORDER BY l.permit_id`,
  );
  const offers = await pool.query<{ offer_id: string; settled: string }>(
    `SELECT offer_id, sum(credits_charged) AS settled FROM inference_requests
     WHERE settlement_status = 'settled' GROUP BY offer_id ORDER BY offer_id`,
  );
  return {
    permits: permits.rows.map((r) => ({
      permitId: r.permit_id as Hex,
      settled: BigInt(r.settled),
      unsettleable: BigInt(r.unsettleable),
      ledgerSettled: BigInt(r.ledger_settled),
    })),
    offers: offers.rows.map((r) => ({ offerId: r.offer_id as Hex, settled: BigInt(r.settled) })),
  };
}

/**
 * Records a permit's close request (the indexer, in its pass's transaction). A newer request
 * (a later block) wins; replaying a range changes nothing.
 */
export async function recordPermitClosing(
  db: Pick<pg.PoolClient, "query">,
  permitId: Hex,
  closableAt: number,
  blockNumber: bigint,
): Promise<void> {
  await db.query(
    `INSERT INTO permit_closings (permit_id, closable_at, block_number) VALUES ($1, $2, $3)
     ON CONFLICT (permit_id) DO UPDATE
       SET closable_at = EXCLUDED.closable_at, block_number = EXCLUDED.block_number
       WHERE permit_closings.block_number < EXCLUDED.block_number`,
    [permitId, closableAt, blockNumber.toString()],
  );
}
