import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import {
  cooldownSeconds,
  createOfferCooldowns,
  isRepeat,
  parseRetryAfter,
  type Cooldown,
  type CooldownStore,
} from "./cooldowns.js";

const bounds = { maxSeconds: 300, defaultSeconds: 10 };
const now = Date.UTC(2026, 10, 29, 12, 0, 0);
const offer = `0x${"0b".repeat(32)}` as Hex;

describe("Retry-After", () => {
  it("reads delta-seconds and HTTP-dates, nothing else", () => {
    expect(parseRetryAfter("30", now)).toBe(30);
    expect(parseRetryAfter(" 0 ", now)).toBe(0);
    expect(parseRetryAfter("Sun, 29 Nov 2026 12:00:45 GMT", now)).toBe(45);
    // A date already past asks for no wait.
    expect(parseRetryAfter("Sun, 29 Nov 2026 11:00:00 GMT", now)).toBe(0);
    for (const bad of [undefined, "", "-5", "1.5", "soon", "2026-11-29T12:00:45Z", "1e3"])
      expect(parseRetryAfter(bad, now), String(bad)).toBeUndefined();
  });

  it("bounds a cooldown: the default for a bare 429, at least 1 s, at most the maximum", () => {
    expect(cooldownSeconds(429, "30", now, bounds)).toBe(30);
    expect(cooldownSeconds(429, undefined, now, bounds)).toBe(10);
    expect(cooldownSeconds(429, "garbage", now, bounds)).toBe(10);
    expect(cooldownSeconds(429, "0", now, bounds)).toBe(1);
    expect(cooldownSeconds(429, "86400", now, bounds)).toBe(300);
    expect(cooldownSeconds(503, "Sun, 29 Nov 2026 12:01:00 GMT", now, bounds)).toBe(60);
    // A 503 without Retry-After is a failure (failover, reputation), not a request for rest.
    expect(cooldownSeconds(503, undefined, now, bounds)).toBeUndefined();
    expect(cooldownSeconds(500, "30", now, bounds)).toBeUndefined();
    expect(cooldownSeconds(400, "30", now, bounds)).toBeUndefined();
  });

  it("judges a 429 a repeat while the last cooldown runs or within as long again after it", () => {
    const last = { startedMs: now, untilMs: now + 30_000 };
    expect(isRepeat(undefined, now)).toBe(false);
    expect(isRepeat(last, now + 10_000)).toBe(true);
    expect(isRepeat(last, now + 59_999)).toBe(true);
    expect(isRepeat(last, now + 60_000)).toBe(false);
  });
});

/** A store in memory (the PostgreSQL one: src/adapters/pg/offer-cooldowns.test.ts). */
function memoryStore(): CooldownStore & { rows: Map<Hex, Cooldown> } {
  const rows = new Map<Hex, Cooldown>();
  return {
    rows,
    async write(offerId, c) {
      const stored = rows.get(offerId);
      if (stored === undefined || stored.untilMs < c.untilMs) rows.set(offerId, c);
    },
    async read(sinceMs) {
      return new Map([...rows].filter(([, c]) => c.untilMs > sinceMs));
    },
  };
}

describe("offer cooldowns", () => {
  it("cools at once where the 429 was seen, and in another process once it reads", async () => {
    let clock = now;
    const store = memoryStore();
    const one = createOfferCooldowns({ store, bounds, intervalMs: 1000, nowMs: () => clock });
    const two = createOfferCooldowns({ store, bounds, intervalMs: 1000, nowMs: () => clock });
    expect(one.cool(offer, 30)).toEqual({ repeated: false });
    expect(one.remainingMs(offer)).toBe(30_000);
    expect(one.until(offer)).toBe(Math.ceil((now + 30_000) / 1000));
    expect(two.remainingMs(offer)).toBeUndefined();
    await two.refresh();
    expect(two.remainingMs(offer)).toBe(30_000);
    expect(two.coolingCount()).toBe(1);
    clock += 30_000;
    expect(one.remainingMs(offer)).toBeUndefined();
    expect(one.until(offer)).toBeUndefined();
    expect(two.coolingCount()).toBe(0);
    // Soon after it ended, the provider asks again: a repeat, seen by the other process too.
    clock += 10_000;
    expect(two.cool(offer, 5)).toEqual({ repeated: true });
    clock += 60_000;
    expect(one.cool(offer, 5)).toEqual({ repeated: false });
  });

  it("keeps the longer of two cooldowns, whichever process wrote it", async () => {
    const store = memoryStore();
    const one = createOfferCooldowns({ store, bounds, intervalMs: 1000, nowMs: () => now });
    one.cool(offer, 60);
    const two = createOfferCooldowns({ store, bounds, intervalMs: 1000, nowMs: () => now });
    two.cool(offer, 5);
    expect(store.rows.get(offer)?.untilMs).toBe(now + 60_000);
    await two.refresh();
    expect(two.remainingMs(offer)).toBe(60_000);
  });
});
