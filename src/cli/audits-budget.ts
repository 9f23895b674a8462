import { auditSpendOn } from "../adapters/pg/audit-traffic.js";
import type { Queryable } from "../adapters/pg/catalog.js";
import { parseAuditBudgetConfig } from "../config/audits.js";
import type { Env } from "../config/read.js";
import { auditDay, type AuditSpendLine } from "../domain/audits/budget.js";

/**
 * `gateway audits budget [--day YYYY-MM-DD]` (issue 39): what the blind audits spent on a UTC day
 * (today by default), per model and per offer, against the daily budgets of the environment
 * (AUDIT_DAILY_BUDGET_PER_OFFER, AUDIT_DAILY_BUDGET_PER_MODEL): exact amounts in credit token
 * base units, from the database every gateway process reserves in (migration 043).
 */

export const auditsBudgetUsage = "audits budget [--day YYYY-MM-DD]";

/** Prints the day's spend; returns the exit status (1: a line is over its budget). */
export async function runAuditsBudget(
  db: Queryable,
  args: readonly string[],
  env: Env,
  io: { readonly out: (line: string) => void; readonly nowMs?: () => number },
): Promise<number> {
  let day = auditDay((io.nowMs ?? Date.now)());
  if (args[0] === "--day") {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(args[1] ?? "")) throw new RangeError("--day takes YYYY-MM-DD");
    day = args[1]!;
  } else if (args.length > 0) throw new RangeError(`usage: gateway ${auditsBudgetUsage}`);
  const budget = parseAuditBudgetConfig(env);
  const lines = await auditSpendOn(db, day);
  io.out(
    budget === undefined
      ? `audits on ${day} (UTC): AUDIT_PERMITS is not set here, budgets unknown`
      : `audits on ${day} (UTC): budget ${budget.perModel} per model, ${budget.perOffer} per offer (credits, base units)`,
  );
  if (lines.length === 0) io.out("no audit reserved anything that day");
  let over = false;
  for (const line of lines) {
    const limit = budget === undefined ? undefined : limitOf(line, budget);
    const left = limit === undefined ? "-" : (limit - line.spent - line.reserved).toString();
    if (limit !== undefined && line.spent + line.reserved > limit) over = true;
    io.out(
      [
        line.scope,
        line.id,
        `spent ${line.spent}`,
        `reserved ${line.reserved}`,
        `budget ${limit ?? "-"}`,
        `left ${left}`,
        `audits ${line.requests}`,
      ].join("\t"),
    );
  }
  return over ? 1 : 0;
}

function limitOf(line: AuditSpendLine, budget: { perOffer: bigint; perModel: bigint }): bigint {
  return line.scope === "offer" ? budget.perOffer : budget.perModel;
}
