/** An API key's authorization by a payer: its record, its status, and its credit caps. */
import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { periodEnd, periodStart, type AuthorizationPeriod } from "./periods.js";
import { anyPermit } from "./typed-data.js";

export type AuthorizationStatus = "active" | "expired" | "revoked";

/** One API key's authority over a payer's permits. Hex values are lower-case. */
export interface PermitAuthorization {
  readonly id: string;
  readonly apiKeyId: string;
  readonly payer: Hex;
  /** {@link anyPermit}: every permit of the payer. */
  readonly permitId: Hex;
  /** Unix seconds. */
  readonly expiresAt: number;
  /** Unix seconds: when the gateway issued the challenge the payer signed. */
  readonly issuedAt: number;
  /** Credits the key may spend through it in all; 0n: no cap. */
  readonly totalCap: bigint;
  /** Credits one request may reserve through it; 0n: no cap. */
  readonly perRequestCap: bigint;
  /** The periodic cap's UTC calendar period (issue 38); "": none. */
  readonly period: AuthorizationPeriod;
  /** Credits the key may spend through it per period; 0n: none. */
  readonly periodCap: bigint;
  /**
   * The payer's soft threshold (issue 38; checks.ts `readCaps`): from this use on (the current
   * period's with a periodic cap, else the total's), answers carry a warning; 0n: none. Signed
   * in AuthorizeKey: the key holder can neither change nor drop it.
   */
  readonly warnAt: bigint;
  /** Unix seconds. */
  readonly createdAt: number;
  /** Unix seconds; null while not revoked. */
  readonly revokedAt: number | null;
  readonly revokedBy: "key" | "payer" | null;
  /** What its key has spent through it, where read (listings); absent elsewhere. */
  readonly use?: AuthorizationUse | undefined;
}

/**
 * An authorization's use (issue 28, item 7): every request records the authorization that
 * admitted it. With a total cap, `used + reserved` never exceeds it.
 */
export interface AuthorizationUse {
  /** Credits charged to the requests it admitted that have closed. */
  readonly creditsUsed: bigint;
  /** Credits its open requests hold (their maxima) until they close. */
  readonly creditsReserved: bigint;
  /** Unix seconds (the database's clock): when it last admitted a request; null: never. */
  readonly lastUsedAt: number | null;
  /**
   * A periodic cap's ledger (migration 039): the start (Unix seconds) of the period it last
   * admitted a request in, and what that period's requests were charged and hold. Absent: it
   * never admitted one. {@link periodUse} says what counts now.
   */
  readonly period?: { readonly start: number; readonly held: bigint };
}

/**
 * A periodic cap's use at `now`: what the current period's requests were charged and hold (0n
 * when the ledger's period is an earlier one: the period rolled over) and when the current
 * period renews (Unix seconds). Undefined without a periodic cap.
 */
export function periodUse(
  a: PermitAuthorization,
  now: number,
): { used: bigint; renewsAt: number } | undefined {
  if (a.period === "") return undefined;
  const current = periodStart(a.period, now);
  const ledger = a.use?.period;
  return {
    used: ledger !== undefined && ledger.start >= current ? ledger.held : 0n,
    renewsAt: periodEnd(a.period, now),
  };
}

export function authorizationStatus(a: PermitAuthorization, now: number): AuthorizationStatus {
  return grantStatus(a, now);
}

/**
 * Where a grant that lapses and can be revoked stands (an authorization, an offer's key
 * binding): revoked first, then expired once `expiresAt` (Unix seconds) is reached.
 */
export function grantStatus(
  grant: { readonly revokedAt: number | null; readonly expiresAt: number },
  now: number,
): AuthorizationStatus {
  if (grant.revokedAt !== null) return "revoked";
  return grant.expiresAt <= now ? "expired" : "active";
}

/** Whether `a` lets its key spend `permit` at `now`. */
export function covers(
  a: PermitAuthorization,
  permit: { permitId: Hex; payer: Hex },
  now: number,
): boolean {
  return (
    a.revokedAt === null &&
    a.expiresAt > now &&
    a.payer === permit.payer.toLowerCase() &&
    (a.permitId === anyPermit || a.permitId === permit.permitId.toLowerCase())
  );
}

// ------------------------------------------------------------------------------ credit caps

/**
 * The order in which a request is admitted through the authorizations that cover its permit
 * (issue 28, item 7): one without any cap first (nothing to check or reserve), then those with
 * only a per-request cap (checked in memory; the largest first), then those with a total cap
 * or a periodic cap (the maximum is reserved against the cap, per request; in the order they
 * were made). So a
 * payer's narrow authorization never spends what a wider one of the same key would cover.
 */
export function byCapOrder(a: PermitAuthorization, b: PermitAuthorization): number {
  const rank = (x: PermitAuthorization) =>
    reservesAgainstCap(x) ? 2 : x.perRequestCap !== 0n ? 1 : 0;
  const byRank = rank(a) - rank(b);
  if (byRank !== 0) return byRank;
  if (rank(a) === 1 && a.perRequestCap !== b.perRequestCap)
    return a.perRequestCap > b.perRequestCap ? -1 : 1;
  return a.createdAt - b.createdAt;
}

/** Whether a request whose maximum is `maximum` credits fits `a`'s per-request cap. */
export function fitsPerRequestCap(a: PermitAuthorization, maximum: bigint): boolean {
  return a.perRequestCap === 0n || maximum <= a.perRequestCap;
}

/**
 * The refusal (403 `authorization_per_request_cap_exceeded`) of a request whose maximum fits no
 * covering authorization's per-request cap: it names the largest cap and the request's maximum,
 * so that the client can lower its output limit.
 */
export function perRequestCapRefusal(
  grants: readonly PermitAuthorization[],
  maximum: bigint,
): GatewayError {
  const widest = grants.reduce((w, a) => (a.perRequestCap > w.perRequestCap ? a : w));
  return new GatewayError(
    "authorization_per_request_cap_exceeded",
    `this request's maximum of ${maximum} credits is above the per-request cap of ` +
      `${widest.perRequestCap} credits that the payer set on authorization ${widest.id}; ` +
      "lower max_tokens (or the input), or ask the payer for a wider authorization",
  );
}

/**
 * The refusal (402 `authorization_cap_exhausted`) of a request whose maximum fits what remains
 * of none of the total caps it could be admitted through.
 */
export function totalCapRefusal(a: PermitAuthorization, maximum: bigint): GatewayError {
  return new GatewayError(
    "authorization_cap_exhausted",
    `this request's maximum of ${maximum} credits does not fit what remains of the total cap ` +
      `of ${a.totalCap} credits that the payer set on authorization ${a.id} (what it has used ` +
      "and holds: GET /v1/permit-authorizations)",
  );
}

/**
 * Whether a request admitted through `a` reserves its maximum against `a`'s own ledger (a total
 * or a periodic cap, issue 38): per request and durably, never against a lease.
 */
export function reservesAgainstCap(a: PermitAuthorization): boolean {
  return a.totalCap !== 0n || a.periodCap !== 0n;
}

/**
 * The refusal (402 `authorization_period_cap_exhausted`) of a request whose maximum does not fit
 * what remains of `a`'s periodic cap in the current period: it names the period and when it
 * renews (ISO and Unix seconds), so that an agent knows when to come back.
 */
export function periodCapRefusal(
  a: PermitAuthorization,
  maximum: bigint,
  now: number,
): GatewayError {
  const period = a.period === "" ? "day" : a.period;
  const renews = periodEnd(period, now);
  return new GatewayError(
    "authorization_period_cap_exhausted",
    `this request's maximum of ${maximum} credits does not fit what remains of this ${period}'s ` +
      `cap of ${a.periodCap} credits that the payer set on authorization ${a.id}; it renews at ` +
      `${new Date(renews * 1000).toISOString()} (${renews}, Unix seconds; UTC ${period}s)`,
    // Retry-After: when the period renews (a client that honours it comes back then).
    { retryAfterSeconds: Math.max(1, renews - now) },
  );
}

/**
 * A soft threshold reached (issue 38): the warning an answer admitted through `authorizationId`
 * carries in `x_gateway.budget_warning`. `used` is what counts against the cap the threshold is
 * measured on (charged and held: the maxima of open requests count until they close), of the
 * current `period` ("" the total's; `renewsAt` then absent).
 */
export interface BudgetWarning {
  readonly authorizationId: string;
  readonly warnAt: bigint;
  readonly used: bigint;
  /** The cap the threshold is measured against: the periodic cap, else the total. */
  readonly cap: bigint;
  readonly period: AuthorizationPeriod;
  /** Unix seconds: when the period renews; absent for the total. */
  readonly renewsAt?: number;
}

/** The cap `a`'s soft threshold is measured against: its periodic cap, else its total. */
export function warnedCap(a: PermitAuthorization): bigint {
  return a.periodCap !== 0n ? a.periodCap : a.totalCap;
}

/**
 * The warning of an answer admitted through `a` when `used` (read from its ledger just after the
 * admission) is at or over its soft threshold; undefined below it or without one.
 */
export function budgetWarning(
  a: PermitAuthorization,
  used: bigint,
  now: number,
): BudgetWarning | undefined {
  if (a.warnAt === 0n || used < a.warnAt) return undefined;
  return {
    authorizationId: a.id,
    warnAt: a.warnAt,
    used,
    cap: warnedCap(a),
    period: a.period,
    ...(a.period === "" ? {} : { renewsAt: periodEnd(a.period, now) }),
  };
}

/**
 * The use a listing compares with `a`'s soft threshold at `now`: the current period's (charged
 * and held) with a periodic cap, else what its requests were charged and hold; and whether it
 * is at or over the threshold. Undefined without one.
 */
export function warnUse(
  a: PermitAuthorization,
  now: number,
): { used: bigint; reached: boolean } | undefined {
  if (a.warnAt === 0n) return undefined;
  const period = periodUse(a, now);
  const used =
    period?.used ?? (a.use === undefined ? 0n : a.use.creditsUsed + a.use.creditsReserved);
  return { used, reached: used >= a.warnAt };
}

/** A {@link BudgetWarning} in words, for the person or agent reading the answer. */
export function budgetWarningText(w: BudgetWarning): string {
  const scope = w.period === "" ? "total cap" : `cap for this UTC ${w.period}`;
  const renews =
    w.renewsAt === undefined
      ? ""
      : `; the period renews at ${new Date(w.renewsAt * 1000).toISOString()}`;
  return (
    `authorization ${w.authorizationId} has used ${w.used} credits of its ${scope} of ` +
    `${w.cap}, at or over the ${w.warnAt} its payer asked to be warned at${renews}`
  );
}
