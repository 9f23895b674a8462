/**
 * Liveness at the ledger (ledger.ts): the database's clock, each process's heartbeat, and the
 * orphan rule that ends the requests of processes that died.
 */
import type pg from "pg";
import type { Queryable } from "../registrations.js";
import { closeRequest } from "./close.js";

/** The database's clock in Unix seconds: liveness is judged on one clock for every process. */
export async function databaseNow(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ now: string }>(
    "SELECT extract(epoch from clock_timestamp())::bigint AS now",
  );
  return Number(rows[0]!.now);
}

/**
 * Records that the process `instanceId` is alive, on the database's clock (`now`, Unix seconds,
 * only where a test places a heartbeat in time). Every process calls this periodically, well
 * within the `staleAfterSeconds` given to {@link reconcileOrphans}. Hosts' own clocks are never
 * compared: a process whose clock runs minutes behind must not look dead to the others.
 */
export async function heartbeat(db: Queryable, instanceId: string, now?: number): Promise<void> {
  await db.query(
    `INSERT INTO gateway_instances AS g (instance_id, started_at, heartbeat_at)
     VALUES ($1, COALESCE($2::bigint, extract(epoch from clock_timestamp())::bigint),
       COALESCE($2::bigint, extract(epoch from clock_timestamp())::bigint))
     ON CONFLICT (instance_id) DO UPDATE
       SET heartbeat_at = GREATEST(g.heartbeat_at, EXCLUDED.heartbeat_at)`,
    [instanceId, now ?? null],
  );
}

export interface ReconcileOrphansInput {
  /** Unix seconds; absent (as in production): the database's clock, the one heartbeats use. */
  readonly now?: number;
  readonly staleAfterSeconds: number;
  /** At most this many orphans per call (default 1000); call again for more. */
  readonly limit?: number;
}

/**
 * Ends the requests of processes that died. The rule:
 *
 * A request that is still pending or streaming is an **orphan** when the last sign of life of
 * the process serving it is more than `staleAfterSeconds` old, that sign being the later of
 * the process's heartbeat (none if its `gateway_instances` row is missing) and the request's
 * own creation (a process that just made a request was alive then, even if it has not sent
 * its first heartbeat yet). Both are the database's clock (`created_at` is written by the
 * database at insert, migration 016), so no host's clock enters the rule. An orphan is finalized `failed`, billing `void`, charged 0, with
 * error `orphaned`, and its reservation and offer slot are released. Its client got no
 * complete answer, and the gateway cannot know what was delivered before the crash, so the
 * client is never charged for it (the provider's work is lost to the crash, as it would be
 * without the gateway).
 *
 * Each orphan is ended by the same exactly-once update as {@link finalize}, with the staleness
 * re-checked in it, so this is safe to run from every process at once and concurrently with
 * the owners' own finalize: whichever comes first wins, the others change nothing. If a process
 * was only paused and comes back, its `finalize` returns `finalized: false` and its
 * `markStreaming` false.
 *
 * @returns how many requests this call finalized.
 */
export async function reconcileOrphans(
  pool: pg.Pool,
  input: ReconcileOrphansInput,
): Promise<number> {
  const now = input.now ?? (await databaseNow(pool));
  const cutoff = now - input.staleAfterSeconds;
  // No index names a request's status (migration 031: the close is a HOT update). The open
  // requests that hold a reservation of their own are indexed by holds_reservation; the open
  // records of leased requests are found among the unsettled requests (an open record is always
  // 'unsettled'; the settlement queue's index), whether or not their dead holder still leases
  // their permit: a lease recalled or returned while the holder was dead must not leave its open
  // records open (the soak's killed gateway on a closing permit).
  const { rows } = await pool.query<{ id: string }>(
    `SELECT o.id FROM (
       SELECT r.id, r.created_at FROM inference_requests r
       LEFT JOIN gateway_instances g ON g.instance_id = r.instance_id
       WHERE r.holds_reservation AND GREATEST(g.heartbeat_at, r.created_at) < $1
       UNION ALL
       SELECT r.id, r.created_at FROM inference_requests r
       LEFT JOIN gateway_instances g ON g.instance_id = r.instance_id
       WHERE r.settlement_status = 'unsettled' AND r.leased
         AND r.status IN ('pending', 'streaming') AND r.created_at < $1
         AND (g.heartbeat_at IS NULL OR g.heartbeat_at < $1)
     ) o
     ORDER BY o.created_at, o.id
     LIMIT $2`,
    [cutoff, input.limit ?? 1000],
  );
  let finalized = 0;
  for (const { id } of rows) {
    const result = await closeRequest(
      pool,
      id,
      {
        status: "failed",
        inputTokens: null,
        outputTokens: null,
        creditsCharged: 0n,
        billing: "void",
        usageSource: null,
        error: "orphaned",
        now,
      },
      cutoff,
    );
    if (result.finalized) finalized++;
  }
  return finalized;
}
