import type { Hex } from "viem";
import type { AuditCorpusSource } from "../domain/audits/types.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import { envReader, ConfigError, type Env, type EnvReader } from "./read.js";

/**
 * The blind audits' settings (issue 39; docs/operators.md, "Blind audits"). Audits run when
 * AUDIT_API_KEY and AUDIT_PERMITS are set: the key is one of this gateway's API keys that the
 * payer of the audit permits (the operator) authorized, each permit pays the audits of its model,
 * and the budgets bound what they spend a day.
 */
export interface AuditConfig {
  /** The API key audits are sent with (a secret: never logged). */
  readonly auditApiKey: string;
  /** The audit permit of each audited model (ModelID -> PermitID). */
  readonly permits: ReadonlyMap<Hex, Hex>;
  /** The anchor offer of a model, when the operator names one (ModelID -> OfferID). */
  readonly anchors: ReadonlyMap<Hex, Hex>;
  readonly budgetPerOffer: bigint;
  readonly budgetPerModel: bigint;
  readonly requestsPerOfferPerDay: number;
  readonly evaluateIntervalMs: number;
  readonly evidenceWindowDays: number;
  /**
   * The operator's own corpus (a folder laid out as src/adapters/audits/data/), or undefined:
   * the shipped one, which anyone can read.
   */
  readonly corpusDir: string | undefined;
}

/** `MODEL_ID=VALUE,...` with Hex32 on both sides. */
function pairs(r: EnvReader, key: string, what: string): Map<Hex, Hex> {
  const out = new Map<Hex, Hex>();
  const raw = r.str(key);
  if (raw === undefined) return out;
  for (const item of raw.split(",")) {
    const [model, value, ...extra] = item.trim().split("=");
    if (model === undefined || value === undefined || extra.length > 0) {
      r.problems.push(`${key} must be MODEL_ID=${what} pairs separated by commas`);
      return out;
    }
    if (!isHex32(model.trim()) || !isHex32(value.trim())) {
      r.problems.push(`${key}: ${item.trim()} must pair a Hex32 model id with a Hex32 ${what}`);
      continue;
    }
    out.set(normalizeHex(model.trim()), normalizeHex(value.trim()));
  }
  return out;
}

/** A daily budget in credits (base units, a decimal integer). */
function credits(r: EnvReader, key: string): bigint {
  const raw = r.str(key);
  if (raw === undefined) {
    r.problems.push(`${key} is required with AUDIT_PERMITS (credits a day, base units)`);
    return 0n;
  }
  if (!/^\d{1,78}$/.test(raw)) {
    r.problems.push(`${key} must be a whole number of credits (base units), got "${raw}"`);
    return 0n;
  }
  return BigInt(raw);
}

/** The audit settings, or undefined when audits are off (no AUDIT_PERMITS). */
export function auditSettings(r: EnvReader): AuditConfig | undefined {
  const permits = pairs(r, "AUDIT_PERMITS", "PERMIT_ID");
  const anchors = pairs(r, "AUDIT_ANCHORS", "OFFER_ID");
  if (permits.size === 0) {
    if (anchors.size > 0) r.problems.push("AUDIT_ANCHORS needs AUDIT_PERMITS");
    if (r.str("AUDIT_CORPUS_DIR") !== undefined)
      r.problems.push("AUDIT_CORPUS_DIR needs AUDIT_PERMITS");
    return undefined;
  }
  const auditApiKey = r.required("AUDIT_API_KEY", "the API key audits are sent with");
  for (const model of anchors.keys())
    if (!permits.has(model))
      r.problems.push(`AUDIT_ANCHORS names model ${model}, which AUDIT_PERMITS does not audit`);
  return {
    auditApiKey,
    permits,
    anchors,
    budgetPerOffer: credits(r, "AUDIT_DAILY_BUDGET_PER_OFFER"),
    budgetPerModel: credits(r, "AUDIT_DAILY_BUDGET_PER_MODEL"),
    requestsPerOfferPerDay: r.int("AUDIT_REQUESTS_PER_OFFER_PER_DAY", 100, 1, 100_000),
    evaluateIntervalMs: r.int("AUDIT_EVALUATE_INTERVAL_MS", 3_600_000, 1000, 7 * 86_400_000),
    evidenceWindowDays: r.int("AUDIT_EVIDENCE_WINDOW_DAYS", 30, 1, 365),
    corpusDir: r.str("AUDIT_CORPUS_DIR"),
  };
}

/** The budgets alone (`gateway audits budget`): undefined when audits are off. */
export function parseAuditBudgetConfig(
  env: Env,
): { readonly perOffer: bigint; readonly perModel: bigint } | undefined {
  const r = envReader(env);
  const permits = pairs(r, "AUDIT_PERMITS", "PERMIT_ID");
  const budget =
    permits.size === 0
      ? undefined
      : {
          perOffer: credits(r, "AUDIT_DAILY_BUDGET_PER_OFFER"),
          perModel: credits(r, "AUDIT_DAILY_BUDGET_PER_MODEL"),
        };
  if (r.problems.length > 0) throw new ConfigError(r.problems);
  return budget;
}

/** The corpus the audits ask, or undefined when audits are off. */
export function auditCorpusSource(audits: AuditConfig | undefined): AuditCorpusSource | undefined {
  if (audits === undefined) return undefined;
  return audits.corpusDir === undefined ? "shipped" : "operator";
}

/** `AUDIT_CORPUS_DIR` alone (`gateway audits export-reference`): undefined when not set. */
export function parseAuditCorpusDir(env: Env): string | undefined {
  return envReader(env).str("AUDIT_CORPUS_DIR");
}

/**
 * The anchors alone (`gateway audits export-reference`): ModelID -> OfferID from AUDIT_ANCHORS,
 * empty when it is not set.
 */
export function parseAuditAnchors(env: Env): ReadonlyMap<Hex, Hex> {
  const r = envReader(env);
  const anchors = pairs(r, "AUDIT_ANCHORS", "OFFER_ID");
  if (r.problems.length > 0) throw new ConfigError(r.problems);
  return anchors;
}
