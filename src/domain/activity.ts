/**
 * What a payer sees (DESIGN.md section 13): a key's requests and the usage of a key or a permit,
 * as lists and groups the database answers by index (adapters/pg/activity.ts). The rules here
 * are the shapes and bounds of those questions, so a caller cannot make one read without end.
 */
import type { Hex } from "viem";
import { GatewayError } from "./errors.js";
import type { RequestStatus } from "./requests.js";

/** Records per page of the request list: the default and the most. */
export const requestPage = { default: 50, max: 100 } as const;

/** What a request list is narrowed to; an absent member does not narrow. */
export interface RequestFilter {
  readonly model?: string | undefined;
  readonly permitId?: Hex | undefined;
  readonly status?: RequestStatus | undefined;
  /** Unix seconds: made at or after. */
  readonly createdAfter?: number | undefined;
  /** Unix seconds: made before. */
  readonly createdBefore?: number | undefined;
}

export type UsageBucket = "hour" | "day";

export const bucketSeconds: Readonly<Record<UsageBucket, number>> = { hour: 3600, day: 86_400 };

/**
 * The longest range a usage question may span, per bucket: 93 days of days (a quarter), 7 days
 * of hours. Each group is a read of the rows in range, so the range bounds the work.
 */
export const usageRangeMaxSeconds: Readonly<Record<UsageBucket, number>> = {
  hour: 7 * 86_400,
  day: 93 * 86_400,
};

/** The range asked when none is: the last 7 days. */
export const usageDefaultSeconds = 7 * 86_400;

/**
 * Whose usage: a key's (or an x402 payer's, its caller id) requests, a permit's, or a payer's
 * (every request admitted through an authorization it signed, and its x402 payments, whose
 * caller id is `x402Caller`).
 */
export type UsageScope =
  | { readonly apiKeyId: string }
  | { readonly permitId: Hex }
  | { readonly payer: Hex; readonly x402Caller: string };

/** The usage of one model on one offer in one bucket (sums over its requests). */
export interface UsageGroup {
  /** Unix seconds: the start of the UTC hour or day. */
  readonly startsAt: number;
  readonly model: string;
  readonly offerId: string;
  readonly requests: bigint;
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly claimedInputTokens: bigint;
  readonly claimedOutputTokens: bigint;
  readonly countedInputTokens: bigint;
  readonly countedOutputTokens: bigint;
  readonly credits: bigint;
}

/**
 * The range `[from, to)` of a usage question: `to` defaults to `now + 2`, so that a request made
 * this second is in (a record's `created_at` is the database's clock rounded to the nearest
 * second, migration 016: up to a second past the gateway's floor of the same instant), `from` to
 * 7 days before `to`; refused (400 `invalid_request`) when empty, negative or longer than the
 * bucket allows.
 */
export function usageRange(
  bucket: UsageBucket,
  asked: { from?: number | undefined; to?: number | undefined },
  now: number,
): { from: number; to: number } {
  const to = asked.to ?? now + 2;
  const from = asked.from ?? to - usageDefaultSeconds;
  if (!Number.isSafeInteger(from) || !Number.isSafeInteger(to) || from < 0 || to <= from) {
    throw new GatewayError(
      "invalid_request",
      "'from' and 'to' must be Unix seconds with from < to",
    );
  }
  const max = usageRangeMaxSeconds[bucket];
  if (to - from > max) {
    throw new GatewayError(
      "invalid_request",
      `a usage range by ${bucket} spans at most ${max / 86_400} days; ask in parts`,
    );
  }
  return { from, to };
}
