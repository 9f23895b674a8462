/**
 * Reservation leases in PostgreSQL (migration 010): the statements behind the lease ledger of
 * `domain/chat/leases.ts`. Taking and giving back a lease is one function call each, committed
 * on its own; a leased request's record and its close are written in batches (group commit),
 * so under load many requests share one transaction and no row every request of a permit or an
 * offer shares is written per request.
 */
import type pg from "pg";
import type {
  LeasedClose,
  LeasedRecord,
  LeaseStore,
  PermitLeaseRequest,
  OfferLeaseRequest,
} from "../../domain/leases/store.js";
import { createBatcher, type ItemOutcome } from "./batcher.js";
import { closeColumns, databaseNow, heartbeat } from "./ledger/index.js";
import type { Queryable } from "./registrations.js";

export interface PgLeaseStoreOptions {
  /** Items waiting per batch kind before a submit is refused (backpressure). */
  readonly maxQueued?: number | undefined;
  readonly maxWaitMs?: number | undefined;
}

/** A record write the store may skip: its close was decided before it was sent. */
interface OpenItem {
  readonly record: LeasedRecord;
  readonly state: { sent: boolean; skip: boolean; streaming: boolean };
}

export function createPgLeaseStore(pool: pg.Pool, options: PgLeaseStoreOptions = {}): LeaseStore {
  const bounds = { maxQueued: options.maxQueued, maxWaitMs: options.maxWaitMs };
  const opens = createBatcher<OpenItem, void>({
    ...bounds,
    run: async (items) => {
      for (const item of items) item.state.sent = true;
      const rows = items.filter((i) => !i.state.skip).map((i) => recordRow(i));
      // `created_at` is the database's clock, as heartbeats are: the orphan rule compares the
      // two (docs/decisions/chat-quotes-and-money.md, "Orphans"), so a host's clock must not enter it.
      if (rows.length > 0) {
        await pool.query(
          `INSERT INTO inference_requests (id, api_key_id, instance_id, model, model_id, offer_id,
             permit_id, quote_id, stream, status, input_tokens, maximum_credits, tariff_version,
             created_at, leased, authorization_id)
           SELECT x.id, x.api_key_id, x.holder, x.model, x.model_id, x.offer_id, x.permit_id,
             x.quote_id, x.stream, x.status, x.input_tokens, x.maximum, x.tariff_version,
             extract(epoch from clock_timestamp())::bigint, true, x.authorization_id
           FROM jsonb_to_recordset($1::jsonb) AS x(id text, api_key_id text, holder text,
             model text, model_id text, offer_id text, permit_id text, quote_id text,
             stream boolean, status text, input_tokens numeric, maximum numeric,
             tariff_version numeric, authorization_id text)
           ON CONFLICT (id) DO NOTHING`,
          [JSON.stringify(rows)],
        );
      }
      return items.map((): ItemOutcome<void> => ({ ok: true, value: undefined }));
    },
  });
  const marks = createBatcher<string, void>({
    ...bounds,
    run: async (ids) => {
      await pool.query(
        "UPDATE inference_requests SET status = 'streaming' WHERE id = ANY ($1::text[]) AND status = 'pending'",
        [ids],
      );
      return ids.map((): ItemOutcome<void> => ({ ok: true, value: undefined }));
    },
  });
  const closes = createBatcher<LeasedClose, { finalized: boolean; creditsCharged: bigint }>({
    ...bounds,
    run: async (items) => {
      const { rows } = await pool.query<{
        idx: number;
        finalized: boolean;
        credits_charged: string;
      }>("SELECT idx, finalized, credits_charged::text FROM gw_close_leased_batch($1::jsonb)", [
        JSON.stringify(items.map(closeRow)),
      ]);
      if (rows.length !== items.length) {
        throw new Error(`gw_close_leased_batch returned ${rows.length} rows for ${items.length}`);
      }
      const out = new Array<ItemOutcome<{ finalized: boolean; creditsCharged: bigint }>>(
        items.length,
      );
      for (const row of rows) {
        out[row.idx - 1] = {
          ok: true,
          value: { finalized: row.finalized, creditsCharged: BigInt(row.credits_charged) },
        };
      }
      return out;
    },
  });

  return {
    async takePermit(r: PermitLeaseRequest) {
      const { rows } = await pool.query<{ granted: string }>(
        "SELECT gw_lease_permit($1, $2, $3::numeric, $4::numeric, $5::numeric, $6::numeric)::text AS granted",
        [
          r.holder,
          r.permitId.toLowerCase(),
          r.need.toString(),
          r.want.toString(),
          r.deposit.toString(),
          r.chainSettled.toString(),
        ],
      );
      return BigInt(rows[0]!.granted);
    },
    async takeOffer(r: OfferLeaseRequest) {
      const { rows } = await pool.query<{ granted: number }>(
        "SELECT gw_lease_offer($1, $2, $3::integer, $4::integer, $5::integer) AS granted",
        [r.holder, r.offerId.toLowerCase(), r.need, r.want, clampInt(r.maxConcurrency)],
      );
      return rows[0]!.granted;
    },
    async returnPermit(holder, permitId, credits) {
      const { rows } = await pool.query<{ returned: string }>(
        "SELECT gw_return_permit_lease($1, $2, $3::numeric)::text AS returned",
        [holder, permitId.toLowerCase(), credits === "all" ? null : credits.toString()],
      );
      return BigInt(rows[0]!.returned);
    },
    async returnOffer(holder, offerId, slots) {
      const { rows } = await pool.query<{ returned: number }>(
        "SELECT gw_return_offer_lease($1, $2, $3::integer) AS returned",
        [holder, offerId.toLowerCase(), slots === "all" ? null : slots],
      );
      return rows[0]!.returned;
    },
    heartbeat: (holder) => heartbeat(pool, holder),
    open(record, state) {
      return opens.submit({ record, state });
    },
    markStreaming: (requestId) => marks.submit(requestId),
    close: (item) => closes.submit(item),
  };
}

function clampInt(n: number): number {
  return Number.isFinite(n) ? Math.max(0, Math.min(2 ** 31 - 1, Math.floor(n))) : 0;
}

/** A leased record's columns, as the batch statements name them (amounts as decimal strings). */
function recordColumns(r: LeasedRecord) {
  return {
    id: r.requestId,
    api_key_id: r.apiKeyId,
    holder: r.holder,
    model: r.model,
    model_id: r.modelId.toLowerCase(),
    offer_id: r.offerId.toLowerCase(),
    permit_id: r.permitId.toLowerCase(),
    quote_id: r.quoteId,
    stream: r.stream,
    maximum: r.maximumCredits.toString(),
    tariff_version: r.tariffVersion.toString(),
    authorization_id: r.authorizationId ?? null,
  };
}

function recordRow({ record, state }: OpenItem) {
  return {
    ...recordColumns(record),
    status: state.streaming ? "streaming" : "pending",
    input_tokens: record.inputTokens.toString(),
  };
}

function closeRow(c: LeasedClose) {
  return { ...recordColumns(c.record), ...closeColumns(c) };
}

/**
 * The orphan rule for leases: releases every lease whose holder's last heartbeat (on the
 * database's clock) is older than `staleAfterSeconds`, one holder per transaction, re-checked
 * in it. Returns how many leases were released.
 */
export async function releaseOrphanedLeases(
  db: Queryable,
  input: { staleAfterSeconds: number; now?: number },
): Promise<number> {
  const now = input.now ?? (await databaseNow(db));
  const cutoff = now - input.staleAfterSeconds;
  const { rows } = await db.query<{ holder: string }>(
    `SELECT h.holder FROM (SELECT holder FROM permit_leases UNION SELECT holder FROM offer_leases) h
     LEFT JOIN gateway_instances g ON g.instance_id = h.holder
     WHERE g.heartbeat_at IS NULL OR g.heartbeat_at < $1`,
    [cutoff],
  );
  let released = 0;
  for (const { holder } of rows) {
    const result = await db.query<{ n: number }>("SELECT gw_release_holder($1, $2) AS n", [
      holder,
      cutoff,
    ]);
    released += result.rows[0]!.n;
  }
  return released;
}
