import { GatewayError } from "./errors.js";
import { setBounded } from "./bounded-cache.js";

/**
 * Per-API-key limits (docs/decisions/errors-and-rate-limits.md, "Rate limits"): a token bucket on requests, and a
 * count of the key's chat streams in flight. `createRateLimiter` keeps both in memory for one
 * process (and is the fallback of a fleet limiter while its database is unreachable);
 * `createFleetRateLimiter` enforces them across every replica through the database, leasing
 * tokens and stream slots in chunks so that no row is written per request.
 */

export interface RateLimitOptions {
  /** Fleet-wide requests per second per API key; 0 turns the request limit off. */
  readonly rps: number;
  /** Fleet-wide burst (bucket size) per API key; 0 means the per-second rate, at least 1. */
  readonly burst: number;
  /** Fleet-wide concurrent chat streams per API key; 0 turns the stream limit off. */
  readonly maxStreams: number;
  /** Milliseconds, monotonic (tests). Default `performance.now`. */
  readonly now?: () => number;
  /** Buckets kept at most; beyond it the ones idle longest go first. Default 100 000. */
  readonly maxKeys?: number;
}

export interface RateLimiter {
  /** Takes one request's token for `key`; throws 429 `rate_limited` (with its retry delay) when none is left. */
  take(key: string): void | Promise<void>;
  /**
   * Admits one stream of `key`: returns its release (idempotent), or throws 429 `rate_limited`
   * (retry after 1 s) when the key has its limit of streams in flight.
   */
  acquireStream(key: string): (() => void) | Promise<() => void>;
  /** Buckets held now (tests: they must not grow without bound). */
  readonly size: number;
}

/** The in-memory limiter of one process: answers at once. */
export interface LocalRateLimiter extends RateLimiter {
  take(key: string): void;
  acquireStream(key: string): () => void;
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

export function createRateLimiter(options: RateLimitOptions): LocalRateLimiter {
  const now = options.now ?? (() => performance.now());
  const maxKeys = options.maxKeys ?? 100_000;
  // Tokens per millisecond, and the bucket size.
  const rate = options.rps / 1000;
  const capacity = Math.max(1, options.burst > 0 ? options.burst : options.rps);
  const maxStreams = options.maxStreams > 0 ? options.maxStreams : 0;
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
      if (bucket === undefined) bucket = { tokens: capacity, at: t };
      else {
        bucket.tokens = Math.min(capacity, bucket.tokens + (t - bucket.at) * rate);
        bucket.at = t;
      }
      setBounded(buckets, key, bucket, maxKeys);
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

/** The database side of a fleet limiter (src/adapters/pg/rate-limits.ts). */
export interface RateLimitStore {
  /**
   * Gives back `giveBack` unused tokens of `key`'s fleet bucket and takes up to `want`:
   * returns the tokens granted and the (fractional) tokens left in the bucket.
   */
  leaseTokens(
    key: string,
    want: number,
    giveBack: number,
    rps: number,
    burst: number,
  ): Promise<{ granted: number; tokensLeft: number }>;
  /**
   * Sets the stream slots this process holds of `key` to `slots` for `ttlSeconds` if every live
   * holder's then fit within `max` (a decrease always does): returns the slots held after it.
   */
  setStreams(key: string, slots: number, max: number, ttlSeconds: number): Promise<number>;
}

export interface FleetRateLimitOptions extends RateLimitOptions {
  readonly store: RateLimitStore;
  /** Seconds of the fleet rate one token lease asks for (at least 1 token). Default 0.05. */
  readonly chunkSeconds?: number;
  /** Milliseconds a token lease is used before its unused tokens go back. Default 500. */
  readonly tokenLeaseMs?: number;
  /** Milliseconds a process's stream slots count after its last renewal. Default 10 000. */
  readonly streamTtlMs?: number;
  /** Milliseconds an unused stream slot is kept before it goes back. Default 250. */
  readonly idleMs?: number;
  /** Milliseconds a database call may take before the local fallback answers. Default 1000. */
  readonly storeTimeoutMs?: number;
  /** Called (at most once per 10 s) when the database failed and the local fallback answered. */
  readonly onFallback?: (error: unknown) => void;
}

export interface FleetRateLimiter extends RateLimiter {
  take(key: string): Promise<void>;
  acquireStream(key: string): Promise<() => void>;
  /** Stops the timer and gives back every lease (best effort). */
  close(): Promise<void>;
}

interface TokenLease {
  tokens: number;
  /** performance.now() after which the unused tokens go back. */
  expiresAt: number;
  /** After a refusal: no new lease is asked before this (a whole chunk has refilled by then). */
  quietUntil: number;
  /** After a refusal: when the fleet bucket has a token again (the Retry-After). */
  nextTokenAt: number;
  refill: Promise<boolean> | undefined;
}

interface StreamLease {
  held: number;
  inUse: number;
  /** Streams waiting for a slot here (one growth covers them all). */
  waiting: number;
  changedAt: number;
  renewedAt: number;
  busy: Promise<void> | undefined;
}

/**
 * Per-API-key limits across every replica, the database the arbiter (docs/decisions/errors-and-rate-limits.md, "Rate
 * limits"). Requests: a replica leases a chunk of the key's fleet bucket (about `chunkSeconds`
 * of its rate), admits requests against it in memory, leases again when it is spent, and gives
 * back what is unused after `tokenLeaseMs`. Streams: a replica holds slots of the key's fleet
 * count, grown when a stream finds none free and shrunk to those in use after `idleMs`; its
 * slots are renewed while it lives and stop counting `streamTtlMs` after it dies.
 * A database that fails or takes longer than `storeTimeoutMs` fails open to the local limiter
 * (the whole configured limit in this process) for that request.
 */
export function createFleetRateLimiter(options: FleetRateLimitOptions): FleetRateLimiter {
  const fleet = fleetOf(options);
  const { tokens, streams } = fleet;

  let ticking: Promise<void> | undefined;
  const timer = setInterval(
    () => {
      if (ticking !== undefined) return;
      ticking = tick(fleet).finally(() => (ticking = undefined));
    },
    Math.min(fleet.idleMs, fleet.tokenLeaseMs),
  );
  timer.unref();

  return {
    take: (key) => take(fleet, key),
    acquireStream: (key) => acquireStream(fleet, key),
    async close() {
      clearInterval(timer);
      await ticking;
      for (const lease of tokens.values()) lease.expiresAt = 0;
      for (const lease of streams.values()) {
        lease.changedAt = -Infinity;
        lease.inUse = 0;
      }
      await tick(fleet);
    },
    get size() {
      return tokens.size;
    },
  };
}

/** A fleet limiter's settings and leases, shared by the functions below. */
interface Fleet {
  readonly store: RateLimitStore;
  readonly rps: number;
  readonly burst: number;
  readonly maxStreams: number;
  readonly now: () => number;
  /** Tokens one lease asks for. */
  readonly chunk: number;
  readonly tokenLeaseMs: number;
  readonly streamTtlMs: number;
  readonly idleMs: number;
  readonly fallback: LocalRateLimiter;
  readonly tokens: Map<string, TokenLease>;
  readonly streams: Map<string, StreamLease>;
  /** `work`, or a rejection once it took over `storeTimeoutMs`. */
  bounded<T>(work: Promise<T>): Promise<T>;
  /** The database failed and the local fallback answers (reported at most once per 10 s). */
  failedOpen(error: unknown): void;
}

function fleetOf(options: FleetRateLimitOptions): Fleet {
  const { store, rps, maxStreams } = options;
  const now = options.now ?? (() => performance.now());
  const burst = Math.max(1, options.burst > 0 ? options.burst : rps);
  const chunk = Math.max(
    1,
    Math.min(Math.floor(burst), Math.ceil(rps * (options.chunkSeconds ?? 0.05))),
  );
  const timeoutMs = options.storeTimeoutMs ?? 1000;
  let warnedAt = -Infinity;
  return {
    store,
    rps,
    burst,
    maxStreams,
    now,
    chunk,
    tokenLeaseMs: options.tokenLeaseMs ?? 500,
    streamTtlMs: options.streamTtlMs ?? 10_000,
    idleMs: options.idleMs ?? 250,
    fallback: createRateLimiter(options),
    tokens: new Map(),
    streams: new Map(),
    bounded<T>(work: Promise<T>): Promise<T> {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`rate limit store took over ${timeoutMs} ms`)),
          timeoutMs,
        );
      });
      return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
    },
    failedOpen(error) {
      const t = now();
      if (t - warnedAt < 10_000) return;
      warnedAt = t;
      options.onFallback?.(error);
    },
  };
}

/** One lease call of `key`: whether it granted anything. */
async function refill(fleet: Fleet, key: string, lease: TokenLease): Promise<boolean> {
  const { now, chunk, rps } = fleet;
  const t = now();
  let giveBack = 0;
  if (lease.expiresAt <= t) {
    giveBack = Math.floor(lease.tokens);
    lease.tokens = 0;
  }
  const { granted, tokensLeft } = await fleet.bounded(
    fleet.store.leaseTokens(key, chunk, giveBack, rps, fleet.burst),
  );
  const after = now();
  lease.tokens += granted;
  lease.expiresAt = after + fleet.tokenLeaseMs;
  if (granted === 0) {
    // Asking again before a whole chunk refilled would write per request at the limit.
    lease.nextTokenAt = after + (Math.max(0, 1 - tokensLeft) / rps) * 1000;
    lease.quietUntil = after + (Math.max(0, chunk - tokensLeft) / rps) * 1000;
  }
  return granted > 0;
}

function refuse(fleet: Fleet, lease: TokenLease): GatewayError {
  return rateLimited(
    "too many requests for this API key; retry after the Retry-After delay",
    Math.max(0.001, (lease.nextTokenAt - fleet.now()) / 1000),
  );
}

async function take(fleet: Fleet, key: string): Promise<void> {
  const { now } = fleet;
  if (fleet.rps <= 0) return;
  let lease = fleet.tokens.get(key);
  if (lease === undefined) {
    lease = { tokens: 0, expiresAt: 0, quietUntil: 0, nextTokenAt: 0, refill: undefined };
    fleet.tokens.set(key, lease);
  }
  for (;;) {
    if (lease.tokens >= 1 && lease.expiresAt > now()) {
      lease.tokens -= 1;
      return;
    }
    if (lease.quietUntil > now()) throw refuse(fleet, lease);
    const current = lease;
    const pending = (current.refill ??= refill(fleet, key, current).finally(
      () => (current.refill = undefined),
    ));
    let granted: boolean;
    try {
      granted = await pending;
    } catch (error) {
      fleet.failedOpen(error);
      fleet.fallback.take(key);
      return;
    }
    if (!granted && lease.tokens < 1) throw refuse(fleet, lease);
  }
}

/** Runs `work` on `key`'s stream lease once the one running before it is done. */
async function exclusive(lease: StreamLease, work: () => Promise<void>): Promise<void> {
  while (lease.busy !== undefined) await lease.busy.catch(() => {});
  const run = work();
  lease.busy = run.then(
    () => (lease.busy = undefined),
    () => (lease.busy = undefined),
  );
  return run;
}

async function acquireStream(fleet: Fleet, key: string): Promise<() => void> {
  const { now, maxStreams, store, streamTtlMs } = fleet;
  if (maxStreams <= 0) return () => {};
  let lease = fleet.streams.get(key);
  if (lease === undefined) {
    lease = {
      held: 0,
      inUse: 0,
      waiting: 0,
      changedAt: now(),
      renewedAt: now(),
      busy: undefined,
    };
    fleet.streams.set(key, lease);
  }
  const current = lease;
  const refusal = () =>
    rateLimited(
      `this API key has ${maxStreams} streams open across the gateway, its limit; retry shortly`,
      1,
    );
  // Each round either admits, or grows the holding in the database, or is refused by it.
  while (current.inUse >= current.held) {
    if (current.held >= maxStreams) throw refusal();
    let refused = false;
    current.waiting += 1;
    try {
      await exclusive(current, async () => {
        if (current.inUse < current.held) return;
        // What the waiting streams lack, and a quarter of those in use as headroom.
        const need = current.inUse + current.waiting;
        const want = Math.min(maxStreams, need + Math.floor(need / 4));
        let held = await fleet.bounded(store.setStreams(key, want, maxStreams, streamTtlMs / 1000));
        if (held < current.inUse + 1 && want > current.inUse + 1) {
          held = await fleet.bounded(
            store.setStreams(key, current.inUse + 1, maxStreams, streamTtlMs / 1000),
          );
        }
        refused = held < current.inUse + 1;
        current.held = held;
        current.renewedAt = now();
      });
    } catch (error) {
      fleet.failedOpen(error);
      return fleet.fallback.acquireStream(key);
    } finally {
      current.waiting -= 1;
    }
    if (refused && current.inUse >= current.held) throw refusal();
  }
  current.inUse += 1;
  current.changedAt = now();
  let released = false;
  return () => {
    if (released) return;
    released = true;
    current.inUse -= 1;
    current.changedAt = now();
  };
}

/** Gives back unused tokens and idle stream slots, renews held slots. */
async function tick(fleet: Fleet): Promise<void> {
  const { store, rps, burst, maxStreams, streamTtlMs, idleMs } = fleet;
  const t = fleet.now();
  const calls: Promise<unknown>[] = [];
  for (const [key, lease] of fleet.tokens) {
    if (lease.refill !== undefined || lease.expiresAt > t) continue;
    fleet.tokens.delete(key);
    const giveBack = Math.floor(lease.tokens);
    if (giveBack > 0) calls.push(fleet.bounded(store.leaseTokens(key, 0, giveBack, rps, burst)));
  }
  for (const [key, lease] of fleet.streams) {
    if (lease.busy !== undefined) continue;
    const idle = lease.held > lease.inUse && t - lease.changedAt >= idleMs;
    const renew = lease.held > 0 && t - lease.renewedAt >= streamTtlMs / 3;
    if (!idle && !renew) {
      if (lease.held === 0 && lease.inUse === 0) fleet.streams.delete(key);
      continue;
    }
    const target = idle ? lease.inUse : lease.held;
    // Fewer slots count here before the database hears of it: never more in use than held.
    lease.held = target;
    lease.renewedAt = t;
    calls.push(
      exclusive(lease, async () => {
        const held = await fleet.bounded(
          store.setStreams(key, target, maxStreams, streamTtlMs / 1000),
        );
        lease.held = Math.min(lease.held, held);
      }),
    );
  }
  const results = await Promise.allSettled(calls);
  const failed = results.find((r) => r.status === "rejected");
  if (failed !== undefined) fleet.failedOpen(failed.reason);
}
