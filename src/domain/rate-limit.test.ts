import { describe, expect, it } from "vitest";
import { GatewayError } from "./errors.js";
import { createFleetRateLimiter, createRateLimiter, type RateLimitStore } from "./rate-limit.js";
import { budgetAddress, createFailureBudget } from "./failure-budget.js";

function refusal(run: () => void): GatewayError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(GatewayError);
    return error as GatewayError;
  }
  throw new Error("expected a refusal");
}

describe("rate limiter", () => {
  it("spends the burst, refuses with the whole seconds until a token, and refills", () => {
    let t = 0;
    const limiter = createRateLimiter({ rps: 2, burst: 3, maxStreams: 0, now: () => t });
    for (let i = 0; i < 3; i++) limiter.take("k");
    const error = refusal(() => limiter.take("k"));
    expect(error.code).toBe("rate_limited");
    expect(error.retryAfterSeconds).toBe(1); // half a second, rounded up
    limiter.take("other"); // another key has its own bucket
    t += 499;
    expect(refusal(() => limiter.take("k")).code).toBe("rate_limited");
    t += 1;
    limiter.take("k");
  });

  it("says how long a slow refill takes", () => {
    const t = 0;
    const limiter = createRateLimiter({ rps: 1, burst: 1, maxStreams: 0, now: () => t });
    limiter.take("k");
    expect(refusal(() => limiter.take("k")).retryAfterSeconds).toBe(1);
    const slow = createRateLimiter({ rps: 0.25, burst: 1, maxStreams: 0, now: () => t });
    slow.take("k");
    // A token every 4 s.
    expect(refusal(() => slow.take("k")).retryAfterSeconds).toBe(4);
  });

  it("admits the burst at once, then refuses", () => {
    const t = 0;
    const limiter = createRateLimiter({ rps: 10, burst: 20, maxStreams: 0, now: () => t });
    for (let i = 0; i < 20; i++) limiter.take("k");
    expect(refusal(() => limiter.take("k")).code).toBe("rate_limited");
  });

  it("is off at 0", () => {
    const limiter = createRateLimiter({ rps: 0, burst: 0, maxStreams: 0 });
    for (let i = 0; i < 10_000; i++) limiter.take("k");
    expect(limiter.size).toBe(0);
    const release = limiter.acquireStream("k");
    release();
  });

  it("keeps no bucket of a key idle long enough to be full, and at most maxKeys", () => {
    let t = 0;
    const limiter = createRateLimiter({
      rps: 10,
      burst: 10,
      maxStreams: 0,
      now: () => t,
      maxKeys: 1000,
    });
    for (let i = 0; i < 5000; i++) limiter.take(`key-${i}`);
    expect(limiter.size).toBe(1000);
    t += 1000; // every bucket has refilled
    limiter.take("fresh");
    expect(limiter.size).toBe(1);
  });

  it("counts streams per key, releases each once, and refuses at the limit with retry 1", () => {
    const limiter = createRateLimiter({ rps: 0, burst: 0, maxStreams: 2 });
    const a = limiter.acquireStream("k");
    const b = limiter.acquireStream("k");
    const error = refusal(() => limiter.acquireStream("k"));
    expect(error.code).toBe("rate_limited");
    expect(error.retryAfterSeconds).toBe(1);
    limiter.acquireStream("other")();
    a();
    a(); // idempotent: does not free a second slot
    const c = limiter.acquireStream("k");
    expect(refusal(() => limiter.acquireStream("k")).code).toBe("rate_limited");
    b();
    c();
  });
});

describe("fleet rate limiter while its database fails (fail open, docs/decisions/errors-and-rate-limits.md)", () => {
  const hanging: RateLimitStore = {
    leaseTokens: () => new Promise(() => {}),
    setStreams: () => new Promise(() => {}),
  };
  const failing: RateLimitStore = {
    leaseTokens: () => Promise.reject(new Error("connection refused")),
    setStreams: () => Promise.reject(new Error("connection refused")),
  };

  it("a hung database delays a request by the store timeout, then the local limiter answers with the whole limit", async () => {
    const warnings: unknown[] = [];
    const limiter = createFleetRateLimiter({
      rps: 1,
      burst: 2,
      maxStreams: 1,
      store: hanging,
      storeTimeoutMs: 100,
      onFallback: (error) => warnings.push(error),
    });
    try {
      const started = performance.now();
      await limiter.take("k");
      const waited = performance.now() - started;
      expect(waited).toBeGreaterThanOrEqual(90);
      expect(waited).toBeLessThan(1000);
      await limiter.take("k");
      // The local limiter holds the whole burst of 2, no more.
      const refused = await limiter.take("k").catch((e: unknown) => e);
      expect((refused as GatewayError).code).toBe("rate_limited");
      const release = await limiter.acquireStream("k");
      const second = await limiter.acquireStream("k").catch((e: unknown) => e);
      expect((second as GatewayError).code).toBe("rate_limited");
      release();
      // Warned once (at most every 10 s), with what failed and no secret.
      expect(warnings).toHaveLength(1);
      expect(String(warnings[0])).toContain("rate limit store took over 100 ms");
    } finally {
      // Bounded too: a hung database does not hold the shutdown.
      const closing = performance.now();
      await limiter.close();
      expect(performance.now() - closing).toBeLessThan(1000);
    }
  });

  it("a refusing database: answered at once by the local limiter", async () => {
    const limiter = createFleetRateLimiter({ rps: 5, burst: 3, maxStreams: 0, store: failing });
    const started = performance.now();
    for (let i = 0; i < 3; i++) await limiter.take("k");
    expect(performance.now() - started).toBeLessThan(500);
    const refused = await limiter.take("k").catch((e: unknown) => e);
    expect((refused as GatewayError).code).toBe("rate_limited");
    expect((refused as GatewayError).retryAfterSeconds).toBe(1);
  });
});

describe("failed authentications per address", () => {
  it("refuses an address once it used its burst, says when to retry, and refills at the rate", () => {
    let ms = 0;
    const budget = createFailureBudget({ rps: 2, burst: 3, now: () => ms });
    expect(budget.exhausted("10.0.0.1")).toBeUndefined();
    for (let i = 0; i < 3; i++) budget.failed("10.0.0.1");
    expect(budget.exhausted("10.0.0.1")).toBe(1);
    expect(budget.exhausted("10.0.0.2")).toBeUndefined();
    ms = 499;
    expect(budget.exhausted("10.0.0.1")).toBe(1);
    ms = 500;
    expect(budget.exhausted("10.0.0.1")).toBeUndefined();
    budget.failed("10.0.0.1");
    expect(budget.exhausted("10.0.0.1")).toBe(1);
    // Failing on while refused does not dig deeper than empty: back after one token's time.
    for (let i = 0; i < 100; i++) budget.failed("10.0.0.1");
    ms = 1000;
    expect(budget.exhausted("10.0.0.1")).toBeUndefined();
  });

  it("is off at rate 0, defaults its burst to ten seconds' worth, and holds a bounded number of addresses", () => {
    const off = createFailureBudget({ rps: 0, burst: 0 });
    for (let i = 0; i < 10; i++) off.failed("a");
    expect(off.exhausted("a")).toBeUndefined();
    expect(off.size).toBe(0);

    const budget = createFailureBudget({ rps: 1, burst: 0, maxAddresses: 3, now: () => 0 });
    for (let i = 0; i < 9; i++) budget.failed("a");
    expect(budget.exhausted("a")).toBeUndefined();
    budget.failed("a");
    expect(budget.exhausted("a")).toBe(1);
    for (const address of ["b", "c", "d"]) budget.failed(address);
    expect(budget.size).toBe(3);
    expect(budget.exhausted("a")).toBeUndefined(); // dropped, idle longest: a full bucket again
  });

  it("counts IPv4 as it is (an IPv4-mapped IPv6 too) and IPv6 by its /64", () => {
    expect(budgetAddress("203.0.113.7")).toBe("203.0.113.7");
    expect(budgetAddress("::ffff:203.0.113.7")).toBe("203.0.113.7");
    expect(budgetAddress("2001:db8:1:2:aaaa::1")).toBe("2001:db8:1:2::/64");
    expect(budgetAddress("2001:0db8:0001:0002:ffff:ffff:ffff:ffff")).toBe("2001:db8:1:2::/64");
    expect(budgetAddress("2001:db8::1")).toBe("2001:db8:0:0::/64");
    expect(budgetAddress("::1")).toBe("0:0:0:0::/64");
    expect(budgetAddress("fe80::1%eth0")).toBe("fe80:0:0:0::/64");
    expect(budgetAddress(undefined)).toBe("unknown");
  });
});
