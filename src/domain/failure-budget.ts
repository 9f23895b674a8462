import { setBounded } from "./bounded-cache.js";
/**
 * The failure budget of client addresses: how many failed authentications an address may make
 * before it is refused (split from src/domain/rate-limit.ts, which re-exports it).
 */

/** An address's bucket of failures. */
interface Bucket {
  tokens: number;
  /** When `tokens` was computed, ms. */
  at: number;
}

/**
 * Failed authentications per client address (ADDRESS_RATE_LIMIT_RPS, ADDRESS_RATE_LIMIT_BURST;
 * docs/decisions/authority-and-signing.md "Unknown keys cost nothing"): a token bucket per address that only failures
 * take from. It is asked before a request's credentials are examined: an address with no token
 * left is refused (429 `address_rate_limited`) unless its credentials are plausible from memory
 * (a key this gateway issued, or the operator's token), so a paying client sharing the address
 * with someone guessing keys is never refused by it. Per process, in memory.
 */
export interface FailureBudget {
  /** Seconds until `address` may fail again; undefined while it has budget left. */
  exhausted(address: string): number | undefined;
  /** Takes one failure from `address`'s budget. */
  failed(address: string): void;
  /** Addresses held now (tests: they must not grow without bound). */
  readonly size: number;
}

export function createFailureBudget(options: {
  /** Failures per second an address gets back; 0 turns the budget off. */
  readonly rps: number;
  /** Most failures an address has in store (the bucket); 0 means ten seconds' worth. */
  readonly burst: number;
  /** Addresses kept at most; beyond it the ones idle longest go first. Default 100 000. */
  readonly maxAddresses?: number;
  /** Milliseconds, monotonic (tests). Default `performance.now`. */
  readonly now?: () => number;
}): FailureBudget {
  const now = options.now ?? (() => performance.now());
  const maxAddresses = options.maxAddresses ?? 100_000;
  const rate = options.rps / 1000;
  const capacity = Math.max(1, options.burst > 0 ? options.burst : options.rps * 10);
  // Insertion order is kept fresh (a failing address moves to the end): the first are the ones
  // idle longest, and a full bucket is the same as none, so dropping one loses nothing.
  const buckets = new Map<string, Bucket>();
  const level = (bucket: Bucket, t: number): number =>
    Math.min(capacity, bucket.tokens + (t - bucket.at) * rate);
  return {
    exhausted(address) {
      if (rate <= 0) return undefined;
      const bucket = buckets.get(address);
      if (bucket === undefined) return undefined;
      const tokens = level(bucket, now());
      return tokens >= 1 ? undefined : Math.max(1, Math.ceil((1 - tokens) / rate / 1000));
    },
    failed(address) {
      if (rate <= 0) return;
      const t = now();
      const bucket = buckets.get(address);
      const tokens = bucket === undefined ? capacity : level(bucket, t);
      setBounded(buckets, address, { tokens: Math.max(0, tokens - 1), at: t }, maxAddresses);
    },
    get size() {
      return buckets.size;
    },
  };
}

/**
 * The address a failure budget counts: an IPv4 address as it is (an IPv4-mapped IPv6 one as its
 * IPv4), an IPv6 address by its /64 (one subscriber's usual allocation, which a client can
 * otherwise walk through), anything else as it is.
 */
export function budgetAddress(remote: string | undefined): string {
  if (remote === undefined || remote === "") return "unknown";
  const mapped = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(remote);
  if (mapped !== null) return mapped[1]!;
  if (!remote.includes(":")) return remote;
  const [head = "", tail = ""] = remote.split("%")[0]!.split("::");
  const left = head === "" ? [] : head.split(":");
  const right = tail === "" ? [] : tail.split(":");
  const groups = remote.includes("::")
    ? [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill("0"), ...right]
    : left;
  return `${groups
    .slice(0, 4)
    .map((g) => (g === "" ? "0" : g.toLowerCase().replace(/^0+(?=.)/, "")))
    .join(":")}::/64`;
}
