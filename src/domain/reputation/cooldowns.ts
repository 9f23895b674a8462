import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import { createPeriodic } from "../periodic.js";

/**
 * Offers cooling down (issue 38, item 5; docs/decisions/providers-and-routing.md "Cooldowns: a
 * provider's 429"): a provider that answers 429 (or 503 with `Retry-After`) asked not to be called
 * for a while, so its offer is out of routing until then, in every process. The process that saw
 * the answer sets it at once and writes it to the database (one row per offer, migration 037);
 * every process reads the rows on a short round. Routing reads memory only.
 */

/** How long a cooldown may last (UPSTREAM_COOLDOWN_MAX_SECONDS, UPSTREAM_COOLDOWN_DEFAULT_SECONDS). */
export interface CooldownBounds {
  readonly maxSeconds: number;
  /** A 429 without a readable `Retry-After`. */
  readonly defaultSeconds: number;
}

/** One offer's cooldown, in Unix milliseconds. */
export interface Cooldown {
  readonly startedMs: number;
  readonly untilMs: number;
}

/**
 * `Retry-After` (RFC 9110 section 10.2.3) in seconds from `nowMs`: delta-seconds, or an HTTP-date
 * (a date already past is 0). Undefined when absent or unreadable.
 */
export function parseRetryAfter(value: string | undefined, nowMs: number): number | undefined {
  if (value === undefined) return undefined;
  const text = value.trim();
  if (/^\d{1,12}$/.test(text)) return Number(text);
  // An HTTP-date names its weekday and its zone (GMT); a bare number or an ISO string is not one.
  if (!/^[A-Za-z]{3},? /.test(text) || !/GMT$/.test(text)) return undefined;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, (at - nowMs) / 1000);
}

/**
 * How long an answer takes its offer out of routing, in whole seconds: a 429 for its
 * `Retry-After` (the default without one), a 503 only when it carries one; at least a second (the
 * provider said it was busy just now) and at most the maximum. Undefined: no cooldown.
 */
export function cooldownSeconds(
  status: number,
  retryAfter: string | undefined,
  nowMs: number,
  bounds: CooldownBounds,
): number | undefined {
  const asked = parseRetryAfter(retryAfter, nowMs);
  let seconds: number;
  if (status === 429) seconds = asked ?? bounds.defaultSeconds;
  else if (status === 503 && asked !== undefined) seconds = asked;
  else return undefined;
  return Math.min(bounds.maxSeconds, Math.max(1, Math.ceil(seconds)));
}

/**
 * Whether a 429 seen at `nowMs` repeats the offer's last cooldown `previous`: it came while that
 * cooldown ran (another process called before it heard) or within as long again after it ended.
 * Only a repeat counts against the offer's reputation: one 429 is any provider's answer to a burst.
 */
export function isRepeat(previous: Cooldown | undefined, nowMs: number): boolean {
  if (previous === undefined) return false;
  return nowMs < previous.untilMs + (previous.untilMs - previous.startedMs);
}

/** Where cooldowns are shared (src/adapters/pg/offer-cooldowns.ts). */
export interface CooldownStore {
  /** Upserts the offer's row; a cooldown that ends sooner than the stored one changes nothing. */
  write(offerId: Hex, cooldown: Cooldown): Promise<void>;
  /** Every cooldown that ended after `sinceMs` (running ones, and recent ones for repeats). */
  read(sinceMs: number): Promise<Map<Hex, Cooldown>>;
}

export interface OfferCooldowns {
  /** Milliseconds left of the offer's cooldown; undefined when it is not cooling down. */
  remainingMs(offerId: Hex): number | undefined;
  /** When the offer's cooldown ends (Unix seconds, rounded up); undefined when none runs. */
  until(offerId: Hex): number | undefined;
  /**
   * The offer's provider asked for `seconds` of rest: out of routing here at once, and written for
   * the others. `repeated`: it had asked shortly before ({@link isRepeat}).
   */
  cool(offerId: Hex, seconds: number): { readonly repeated: boolean };
  /** Offers cooling down now (the gauge). */
  coolingCount(): number;
  /** Reads the shared cooldowns now (a round). */
  refresh(): Promise<void>;
  start(): void;
  stop(): Promise<void>;
}

/**
 * The cooldowns of this process: set locally by {@link OfferCooldowns.cool} and written at once,
 * the others' read every `intervalMs`. A failed write or read is told to `onError` and changes
 * nothing here: the process that saw the 429 keeps its cooldown, the others learn it on a later
 * round or from their own 429.
 */
export function createOfferCooldowns(deps: {
  readonly store: CooldownStore;
  readonly bounds: CooldownBounds;
  readonly intervalMs: number;
  /** Unix milliseconds. */
  readonly nowMs?: () => number;
  readonly onError?: (error: unknown) => void;
}): OfferCooldowns {
  const now = deps.nowMs ?? Date.now;
  const known = new Map<Hex, Cooldown>();
  const merge = (offerId: Hex, cooldown: Cooldown) => {
    const mine = known.get(offerId);
    if (mine === undefined || mine.untilMs < cooldown.untilMs) known.set(offerId, cooldown);
  };
  // Kept while a repeat could still be judged against it: at most twice the longest cooldown.
  const forgetBefore = () => now() - 2 * deps.bounds.maxSeconds * 1000;
  const refresh = async () => {
    const shared = await deps.store.read(forgetBefore());
    const horizon = forgetBefore();
    for (const [offerId, c] of known) if (c.untilMs < horizon) known.delete(offerId);
    for (const [offerId, c] of shared) merge(offerId, c);
  };
  const rounds = createPeriodic({
    run: refresh,
    intervalMs: deps.intervalMs,
    onError: deps.onError,
  });
  const remainingMs = (offerId: Hex) => {
    const c = known.get(offerId);
    if (c === undefined) return undefined;
    const left = c.untilMs - now();
    return left > 0 ? left : undefined;
  };
  return {
    remainingMs,
    until(offerId) {
      const c = known.get(offerId);
      return c === undefined || remainingMs(offerId) === undefined
        ? undefined
        : Math.ceil(c.untilMs / 1000);
    },
    cool(offerId, seconds) {
      const at = now();
      const previous = known.get(offerId);
      const repeated = isRepeat(previous, at);
      const cooldown = { startedMs: at, untilMs: at + seconds * 1000 };
      merge(offerId, cooldown);
      deps.store.write(offerId, cooldown).catch((error: unknown) => deps.onError?.(error));
      return { repeated };
    },
    coolingCount() {
      let n = 0;
      for (const offerId of known.keys()) if (remainingMs(offerId) !== undefined) n++;
      return n;
    },
    refresh,
    start: rounds.start,
    stop: rounds.stop,
  };
}

/**
 * The refusal of a request whose every remaining offer is cooling down (a pinned one: its offer),
 * with `Retry-After` the seconds left of the soonest to end.
 */
export function coolingDown(offerIds: readonly Hex[], leftMs: number): GatewayError {
  const seconds = Math.max(1, Math.ceil(leftMs / 1000));
  const [only] = offerIds;
  const which =
    offerIds.length === 1 && only !== undefined
      ? `offer ${only} is cooling down`
      : `every eligible offer of this model is cooling down`;
  return new GatewayError(
    "offer_cooling_down",
    `${which}: its provider answered that it is busy (429, or 503 with Retry-After); retry after ${seconds} s`,
    { retryAfterSeconds: seconds },
  );
}
