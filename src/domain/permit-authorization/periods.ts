/**
 * The periods of a periodic cap (issue 38, "Budgets that renew"): UTC calendar days, weeks
 * (Monday 00:00 UTC to the next Monday) and months. A period is named by its start in Unix
 * seconds: a request counts against the period it was admitted in, and the ledger keeps the
 * current period's start beside what it holds (adapters/pg, "Authorization caps").
 */
export const capPeriods = ["day", "week", "month"] as const;

export type CapPeriod = (typeof capPeriods)[number];

/** A signed period: one of {@link capPeriods}, or "" for none. */
export type AuthorizationPeriod = CapPeriod | "";

export function isAuthorizationPeriod(value: unknown): value is AuthorizationPeriod {
  return value === "" || (capPeriods as readonly unknown[]).includes(value);
}

const day = 86_400;

/** The start (Unix seconds) of the UTC period of `period` that holds `t` (Unix seconds). */
export function periodStart(period: CapPeriod, t: number): number {
  const startOfDay = Math.floor(t / day) * day;
  if (period === "day") return startOfDay;
  if (period === "week") {
    // 1970-01-01 was a Thursday: days since the epoch + 3, mod 7, counts from Monday.
    const weekday = (Math.floor(t / day) + 3) % 7;
    return startOfDay - weekday * day;
  }
  const d = new Date(t * 1000);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000;
}

/** When the period that holds `t` ends (Unix seconds): the start of the next one. */
export function periodEnd(period: CapPeriod, t: number): number {
  const start = periodStart(period, t);
  if (period === "day") return start + day;
  if (period === "week") return start + 7 * day;
  const d = new Date(start * 1000);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1) / 1000;
}
