import type { Hex } from "viem";
import type { AuditStandingStore } from "../../domain/audits/standing.js";
import type {
  AuditState,
  AuditTestEvidence,
  AuditTestName,
  OfferAuditStanding,
  OfferAuditVerdict,
} from "../../domain/audits/types.js";
import { normalizeHex } from "../../domain/hex.js";
import type { Queryable } from "./catalog.js";

// `offer_audit_standings` (migration 042): one row per offer the market's audits judged.

/** A number as JSON keeps it: finite ones as numbers, the others as the text float8 reads. */
const jsonNumber = (n: number): number | string => (Number.isFinite(n) ? n : String(n));
const fromJson = (v: unknown): number => (typeof v === "number" ? v : Number(v));

function evidenceToJson(t: AuditTestEvidence): Record<string, unknown> {
  return {
    test: t.test,
    samples: t.samples,
    reference_samples: t.referenceSamples,
    statistic: jsonNumber(t.statistic),
    ...(t.pValue === undefined ? {} : { p_value: jsonNumber(t.pValue) }),
    e_value: jsonNumber(t.eValue),
  };
}

function evidenceFromJson(v: Record<string, unknown>): AuditTestEvidence {
  return {
    test: v["test"] as AuditTestName,
    samples: fromJson(v["samples"]),
    referenceSamples: fromJson(v["reference_samples"]),
    statistic: fromJson(v["statistic"]),
    ...(v["p_value"] === undefined ? {} : { pValue: fromJson(v["p_value"]) }),
    eValue: fromJson(v["e_value"]),
  };
}

/**
 * Writes the market's verdicts in one statement (an upsert per offer from one JSON array).
 * Skipped for an offer whose evidence was cleared after `readAtMs` (a verification passed since
 * its samples were read); an `excluded` offer keeps its state, whatever the verdict, until a
 * passing verification clears it (the verdict's evidence is still written, for the operator).
 */
export async function saveAuditVerdicts(
  db: Queryable,
  verdicts: readonly OfferAuditVerdict[],
  at: { readonly readAtMs: number; readonly nowMs: number },
): Promise<void> {
  if (verdicts.length === 0) return;
  const rows = verdicts.map((v) => ({
    offer_id: normalizeHex(v.offerId),
    model_id: normalizeHex(v.modelId),
    state: v.state,
    e_value: String(v.eValue),
    flag_at: String(v.flagAt),
    exclude_at: String(v.excludeAt),
    reference_kind: v.reference.kind,
    reference_offer_id:
      v.reference.offerId === undefined ? null : normalizeHex(v.reference.offerId),
    tests: v.tests.map(evidenceToJson),
  }));
  await db.query(
    `INSERT INTO offer_audit_standings AS s (offer_id, model_id, state, e_value, flag_at,
       exclude_at, reference_kind, reference_offer_id, tests, updated_at_ms)
     SELECT r.offer_id, r.model_id, r.state, r.e_value::float8, r.flag_at::float8,
       r.exclude_at::float8, r.reference_kind, r.reference_offer_id, r.tests, $2
     FROM jsonb_to_recordset($1::jsonb) AS r(offer_id text, model_id text, state text,
       e_value text, flag_at text, exclude_at text, reference_kind text,
       reference_offer_id text, tests jsonb)
     ON CONFLICT (offer_id) DO UPDATE SET model_id = EXCLUDED.model_id,
       state = CASE WHEN s.state = 'excluded' THEN 'excluded' ELSE EXCLUDED.state END,
       e_value = EXCLUDED.e_value, flag_at = EXCLUDED.flag_at, exclude_at = EXCLUDED.exclude_at,
       reference_kind = EXCLUDED.reference_kind,
       reference_offer_id = EXCLUDED.reference_offer_id, tests = EXCLUDED.tests,
       updated_at_ms = EXCLUDED.updated_at_ms
     WHERE s.cleared_at_ms IS NULL OR s.cleared_at_ms <= $3`,
    [JSON.stringify(rows), Math.floor(at.nowMs), Math.floor(at.readAtMs)],
  );
}

interface StandingRow {
  offer_id: string;
  model_id: string;
  state: AuditState;
  e_value: number | string;
  flag_at: number | string;
  exclude_at: number | string;
  reference_kind: "anchor" | "majority" | "data";
  reference_offer_id: string | null;
  tests: Record<string, unknown>[] | string;
  updated_at_ms: string;
  cleared_at_ms: string | null;
}

function standingOf(r: StandingRow): OfferAuditStanding {
  const tests =
    typeof r.tests === "string" ? (JSON.parse(r.tests) as StandingRow["tests"]) : r.tests;
  return {
    offerId: r.offer_id as Hex,
    modelId: r.model_id as Hex,
    state: r.state,
    eValue: Number(r.e_value),
    flagAt: Number(r.flag_at),
    excludeAt: Number(r.exclude_at),
    reference: {
      kind: r.reference_kind,
      ...(r.reference_offer_id === null ? {} : { offerId: r.reference_offer_id as Hex }),
    },
    tests: (tests as Record<string, unknown>[]).map(evidenceFromJson),
    updatedAtMs: Number(r.updated_at_ms),
    ...(r.cleared_at_ms === null ? {} : { clearedAtMs: Number(r.cleared_at_ms) }),
  };
}

/** Every standing (one row per offer judged: the table is read whole). */
export async function readAuditStandings(db: Queryable): Promise<Map<Hex, OfferAuditStanding>> {
  const { rows } = await db.query<StandingRow>(
    `SELECT offer_id, model_id, state, e_value, flag_at, exclude_at, reference_kind,
       reference_offer_id, tests, updated_at_ms::text, cleared_at_ms::text
     FROM offer_audit_standings`,
  );
  return new Map(rows.map((r) => [r.offer_id as Hex, standingOf(r)]));
}

export function createPgAuditStandingStore(db: Queryable): AuditStandingStore {
  return {
    save: (verdicts, at) => saveAuditVerdicts(db, verdicts, at),
    read: () => readAuditStandings(db),
  };
}
