import type { Hex } from "viem";
import type {
  MeasurementStore,
  OfferMeasurement,
  SharedMeasurement,
} from "../../domain/chat/measurements.js";
import type { Queryable } from "./catalog.js";

// `offer_measurements` (migration 019): each process's moving averages of the offers it served.

interface Row {
  offer_id: string;
  instance_id: string;
  latency_ms: number | null;
  throughput: number | null;
  samples: string;
}

/** Upserts one process's averages, one statement for all its offers. */
export async function writeMeasurements(
  db: Queryable,
  instanceId: string,
  rows: ReadonlyMap<Hex, OfferMeasurement>,
): Promise<void> {
  const entries = [...rows];
  await db.query(
    `INSERT INTO offer_measurements (offer_id, instance_id, latency_ms, throughput, samples, updated_at)
     SELECT o, $1, l, t, s, now()
     FROM unnest($2::text[], $3::float8[], $4::float8[], $5::bigint[]) AS m(o, l, t, s)
     ON CONFLICT (offer_id, instance_id) DO UPDATE SET latency_ms = EXCLUDED.latency_ms,
       throughput = EXCLUDED.throughput, samples = EXCLUDED.samples, updated_at = now()`,
    [
      instanceId,
      entries.map(([id]) => id),
      entries.map(([, m]) => m.latencyMs ?? null),
      entries.map(([, m]) => m.throughput ?? null),
      entries.map(([, m]) => String(m.samples)),
    ],
  );
}

/**
 * Every process's averages written in the last `maxAgeSeconds` (the database's clock); older
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
    `SELECT offer_id, instance_id, latency_ms, throughput, samples FROM offer_measurements
     WHERE updated_at >= now() - make_interval(secs => $1)`,
    [maxAgeSeconds],
  );
  return rows.map((r) => ({
    offerId: r.offer_id as Hex,
    instanceId: r.instance_id,
    latencyMs: r.latency_ms ?? undefined,
    throughput: r.throughput ?? undefined,
    samples: Number(r.samples),
  }));
}

export function createPgMeasurementStore(db: Queryable): MeasurementStore {
  return {
    write: (instanceId, rows) => writeMeasurements(db, instanceId, rows),
    read: (maxAgeSeconds) => readMeasurements(db, maxAgeSeconds),
  };
}
