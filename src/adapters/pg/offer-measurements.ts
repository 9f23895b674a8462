import type { Hex } from "viem";
import { median } from "../../domain/reputation/measurements.js";
import {
  keptDivergedPayers,
  type DueExclusion,
  type Histogram,
  type MeasurementStore,
  type OfferRecordCounts,
  type SharedMeasurement,
  type UsageExclusion,
  type WindowSummary,
} from "../../domain/reputation/measurement-types.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

// `offer_measurements` (migrations 019, 023): each process's window of the offers it served;
// `offer_verification_runs` (023) and `offer_flags` (004) counted for the catalog's reputation;
// `offer_usage_exclusions` (024): offers out of routing for diverging usage claims; the
// distinct payers of the diverged answers (032): `diverged_payers`, `payers`.

interface Row {
  offer_id: string;
  instance_id: string;
  served: string;
  failed: string;
  latency_histogram: unknown;
  throughput_histogram: unknown;
  claimed: string;
  diverged: string;
  diverged_payers: unknown;
  divergence_since: string;
}

/** Verification runs older than this are pruned (the longest window is a day). */
const verificationRetentionSeconds = 7 * 86_400;

/**
 * Upserts one process's windows, one statement for all its offers, and deletes its rows of
 * offers no longer in its window (a stale row would go on counting).
 */
export async function writeMeasurements(
  db: Queryable,
  instanceId: string,
  rows: ReadonlyMap<Hex, WindowSummary>,
): Promise<void> {
  const entries = [...rows].map(([offerId, m]) => ({
    offer_id: offerId,
    served: m.served,
    failed: m.failed,
    latency_ms: median(m.latency) ?? null,
    throughput: median(m.throughput) ?? null,
    samples: m.latency.reduce((n, [, count]) => n + count, 0),
    latency_histogram: m.latency,
    throughput_histogram: m.throughput,
    claimed: m.claimed,
    diverged: m.diverged,
    diverged_payers: m.divergedPayers,
    divergence_since: m.divergenceSince,
  }));
  await db.query(
    `WITH m AS (
       SELECT * FROM jsonb_to_recordset($2::jsonb) AS m(offer_id text, served bigint,
         failed bigint, latency_ms float8, throughput float8, samples bigint,
         latency_histogram jsonb, throughput_histogram jsonb, claimed bigint, diverged bigint,
         diverged_payers jsonb, divergence_since bigint)
     ), gone AS (
       DELETE FROM offer_measurements o WHERE o.instance_id = $1
         AND NOT EXISTS (SELECT 1 FROM m WHERE m.offer_id = o.offer_id)
     )
     INSERT INTO offer_measurements (offer_id, instance_id, latency_ms, throughput, samples,
       served, failed, latency_histogram, throughput_histogram, claimed, diverged,
       diverged_payers, divergence_since, updated_at)
     SELECT offer_id, $1, latency_ms, throughput, samples, served, failed, latency_histogram,
       throughput_histogram, claimed, diverged, diverged_payers, divergence_since, now() FROM m
     ON CONFLICT (offer_id, instance_id) DO UPDATE SET latency_ms = EXCLUDED.latency_ms,
       throughput = EXCLUDED.throughput, samples = EXCLUDED.samples, served = EXCLUDED.served,
       failed = EXCLUDED.failed, latency_histogram = EXCLUDED.latency_histogram,
       throughput_histogram = EXCLUDED.throughput_histogram, claimed = EXCLUDED.claimed,
       diverged = EXCLUDED.diverged, diverged_payers = EXCLUDED.diverged_payers,
       divergence_since = EXCLUDED.divergence_since,
       updated_at = now()`,
    [instanceId, JSON.stringify(entries)],
  );
}

/** A histogram as stored, or an empty one where a row holds something else. */
function histogram(value: unknown): Histogram {
  const parsed: unknown = typeof value === "string" ? JSON.parse(value) : value;
  if (!Array.isArray(parsed)) return [];
  return parsed.filter(
    (cell): cell is [number, number, number] =>
      Array.isArray(cell) &&
      cell.length === 3 &&
      cell.every((n) => typeof n === "number" && Number.isFinite(n)),
  );
}

/**
 * Payers as stored: lower-case addresses, at most `keptDivergedPayers` (anything else in a row is
 * left out, so a row can neither add payers nor grow the merge).
 */
function payers(value: unknown): Hex[] {
  const parsed: unknown = typeof value === "string" ? JSON.parse(value) : value;
  if (!Array.isArray(parsed)) return [];
  return parsed
    .filter((p): p is Hex => typeof p === "string" && /^0x[0-9a-f]{40}$/.test(p))
    .slice(0, keptDivergedPayers);
}

/**
 * Every process's windows written in the last `maxAgeSeconds` (the database's clock); older
 * rows (processes that stopped) are deleted on the way.
 */
export async function readMeasurements(
  db: Queryable,
  maxAgeSeconds: number,
): Promise<SharedMeasurement[]> {
  await db.query(
    "DELETE FROM offer_measurements WHERE updated_at < now() - make_interval(secs => $1 * 10)",
    [maxAgeSeconds],
  );
  const { rows } = await db.query<Row>(
    `SELECT offer_id, instance_id, served, failed, latency_histogram, throughput_histogram,
       claimed, diverged, diverged_payers, divergence_since
     FROM offer_measurements WHERE updated_at >= now() - make_interval(secs => $1)`,
    [maxAgeSeconds],
  );
  return rows.map((r) => ({
    offerId: r.offer_id as Hex,
    instanceId: r.instance_id,
    served: Number(r.served),
    failed: Number(r.failed),
    latency: histogram(r.latency_histogram),
    throughput: histogram(r.throughput_histogram),
    claimed: Number(r.claimed),
    diverged: Number(r.diverged),
    divergedPayers: payers(r.diverged_payers),
    divergenceSince: Number(r.divergence_since),
  }));
}

/**
 * Verification runs (passed, rejected) and flags per offer since `since` (Unix seconds, the
 * gateway's clock, as both are written); runs older than the retention are pruned on the way.
 */
export async function readRecordCounts(
  db: Queryable,
  since: number,
): Promise<Map<Hex, OfferRecordCounts>> {
  await db.query("DELETE FROM offer_verification_runs WHERE ran_at < $1", [
    since - verificationRetentionSeconds,
  ]);
  const { rows } = await db.query<{
    offer_id: string;
    passed: string;
    rejected: string;
    flags: string;
  }>(
    `SELECT offer_id, sum(passed) AS passed, sum(rejected) AS rejected, sum(flags) AS flags FROM (
       SELECT offer_id, count(*) FILTER (WHERE outcome = 'verified') AS passed,
         count(*) FILTER (WHERE outcome = 'rejected') AS rejected, 0 AS flags
       FROM offer_verification_runs WHERE ran_at >= $1 GROUP BY offer_id
       UNION ALL
       SELECT offer_id, 0, 0, count(*) FROM offer_flags WHERE created_at >= $1 GROUP BY offer_id
     ) AS c GROUP BY offer_id`,
    [since],
  );
  return new Map(
    rows.map((r) => [
      r.offer_id as Hex,
      {
        verificationsPassed: Number(r.passed),
        verificationsRejected: Number(r.rejected),
        flags: Number(r.flags),
      },
    ]),
  );
}

/** Every offer's usage exclusion, standing (`cleared_at` NULL) or cleared. */
export async function readUsageExclusions(db: Queryable): Promise<UsageExclusion[]> {
  const { rows } = await db.query<{
    offer_id: string;
    excluded_at: string;
    cleared_at: string | null;
  }>("SELECT offer_id, excluded_at, cleared_at FROM offer_usage_exclusions");
  return rows.map((r) => ({
    offerId: r.offer_id as Hex,
    excludedAt: Number(r.excluded_at),
    clearedAt: r.cleared_at === null ? undefined : Number(r.cleared_at),
  }));
}

/**
 * Excludes an offer at `at` unless an exclusion of it stands, or was cleared after the
 * clearing its counts follow (`due.since`): a process that has not yet seen a verification
 * pass cannot exclude the offer again with counts from before it. Whether it was written.
 */
export async function excludeOffer(db: Queryable, due: DueExclusion, at: number): Promise<boolean> {
  const { rowCount } = await db.query(
    `INSERT INTO offer_usage_exclusions (offer_id, excluded_at, claimed, diverged, payers,
       cleared_at)
     VALUES ($1, $2, $3, $4, $6, NULL)
     ON CONFLICT (offer_id) DO UPDATE SET excluded_at = EXCLUDED.excluded_at,
       claimed = EXCLUDED.claimed, diverged = EXCLUDED.diverged, payers = EXCLUDED.payers,
       cleared_at = NULL
     WHERE offer_usage_exclusions.cleared_at IS NOT NULL
       AND offer_usage_exclusions.cleared_at <= $5`,
    [normalizeHex(due.offerId), at, due.claimed, due.diverged, due.since, due.payers ?? null],
  );
  return (rowCount ?? 0) > 0;
}

export function createPgMeasurementStore(db: Queryable): MeasurementStore {
  return {
    write: (instanceId, rows) => writeMeasurements(db, instanceId, rows),
    read: (maxAgeSeconds) => readMeasurements(db, maxAgeSeconds),
    readCounts: (since) => readRecordCounts(db, since),
    readExclusions: () => readUsageExclusions(db),
    exclude: (due, at) => excludeOffer(db, due, at),
  };
}
