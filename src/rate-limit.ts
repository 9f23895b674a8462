import { GatewayError } from "./domain/errors.js";

/**
 * Per-API-key limits of one gateway process (docs/decisions.md, "Rate limits"): a token bucket
 * on requests, and a count of the key's chat streams in flight. Both are in memory and per
 * replica, with the fleet-wide limits divided by the number of replicas: a bucket shared through
 * PostgreSQL would write one row per request, which this project never does.
 */

export interface RateLimitOptions {
  /** Fleet-wide requests per second per API key; 0 turns the request limit off. */
  readonly rps: number;
  /** Fleet-wide burst (bucket size) per API key; 0 means the per-second rate, at least 1. */
  readonly burst: number;
  /** Fleet-wide concurrent chat streams per API key; 0 turns the stream limit off. */
  readonly maxStreams: number;
  /** Gateway processes sharing the limits (each enforces its share). Default 1. */
  readonly replicas?: number;
  /** Milliseconds, monotonic (tests). Default `performance.now`. */
  readonly now?: () => number;
  /** Buckets kept at most; beyond it the ones idle longest go first. Default 100 000. */
  readonly maxKeys?: number;
}

export interface RateLimiter {
  /** Takes one request's token for `key`; throws 429 `rate_limited` (with its retry delay) when none is left. */
  take(key: string): void;
  /**
   * Admits one stream of `key`: returns its release (idempotent), or throws 429 `rate_limited`
   * (retry after 1 s) when the key has its limit of streams in flight here.
   */
  acquireStream(key: string): () => void;
  /** Buckets held now (tests: they must not grow without bound). */
  readonly size: number;
}

interface Bucket {
  tokens: number;
  /** When `tokens` was computed, ms. */
  at: number;
}

/** A refused request: 429 `rate_limited` carrying the whole seconds until a retry can pass. */
export function rateLimited(message: string, retryAfterSeconds: number): GatewayError {
  return new GatewayError("rate_limited", message, {
    retryAfterSeconds: Math.max(1, Math.ceil(retryAfterSeconds)),
  });
}

export function createRateLimiter(options: RateLimitOptions): RateLimiter {
  const replicas = Math.max(1, options.replicas ?? 1);
  const now = options.now ?? (() => performance.now());
  const maxKeys = options.maxKeys ?? 100_000;
  // This replica's share, in tokens per millisecond, and its bucket size.
  const rate = options.rps / replicas / 1000;
  const capacity = Math.max(1, (options.burst > 0 ? options.burst : options.rps) / replicas);
  const maxStreams =
    options.maxStreams > 0 ? Math.max(1, Math.ceil(options.maxStreams / replicas)) : 0;
  // Insertion order is kept fresh (a used key moves to the end), so the first entries are the
  // ones idle longest. A full bucket is the same as no bucket, so dropping one loses nothing.
  const buckets = new Map<string, Bucket>();
  const streams = new Map<string, number>();
  let sweptAt = now();

  /** Drops every bucket that has refilled (idle long enough to be full). */
  const sweep = (t: number): void => {
    sweptAt = t;
    const fullAfterMs = capacity / rate;
    // Least recently used first: the first bucket still refilling ends the sweep.
    for (const [key, bucket] of buckets) {
      if (t - bucket.at < fullAfterMs) break;
      buckets.delete(key);
    }
  };

  return {
    take(key) {
      if (rate <= 0) return;
      const t = now();
      // Idle buckets go once per refill period (amortised: a sweep costs one pass per period).
      if (t - sweptAt >= capacity / rate) sweep(t);
      let bucket = buckets.get(key);
      if (bucket === undefined) {
        bucket = { tokens: capacity, at: t };
        if (buckets.size >= maxKeys) {
          const oldest = buckets.keys().next();
          if (oldest.done !== true) buckets.delete(oldest.value);
        }
      } else {
        bucket.tokens = Math.min(capacity, bucket.tokens + (t - bucket.at) * rate);
        bucket.at = t;
        buckets.delete(key);
      }
      buckets.set(key, bucket);
      if (bucket.tokens >= 1) {
        bucket.tokens -= 1;
        return;
      }
      throw rateLimited(
        "too many requests for this API key; retry after the Retry-After delay",
        (1 - bucket.tokens) / rate / 1000,
      );
    },
    acquireStream(key) {
      if (maxStreams === 0) return () => {};
      const open = streams.get(key) ?? 0;
      if (open >= maxStreams) {
        throw rateLimited(`this API key has ${open} streams open, its limit; retry shortly`, 1);
      }
      streams.set(key, open + 1);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        const left = (streams.get(key) ?? 1) - 1;
        if (left > 0) streams.set(key, left);
        else streams.delete(key);
      };
    },
    get size() {
      return buckets.size;
    },
  };
}
