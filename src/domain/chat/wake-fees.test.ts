import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { createWakeFees, type WakeFeeClaimer } from "./wake-fees.js";

const offer = `0x${"0a".repeat(32)}` as Hex;
const other = `0x${"0b".repeat(32)}` as Hex;

/** A store that charges the first claim of each offer and remembers when. */
function store() {
  const chargedAt = new Map<Hex, number>();
  const calls: Hex[] = [];
  const claim: WakeFeeClaimer = async (offerId, now, windowSeconds) => {
    calls.push(offerId);
    const last = chargedAt.get(offerId);
    if (last === undefined || last <= now - windowSeconds) {
      chargedAt.set(offerId, now);
      return { claimed: true, chargedAt: now };
    }
    return { claimed: false, chargedAt: last };
  };
  return { claim, calls };
}

describe("wake fees", () => {
  it("asks the store once per offer per window: inside it, no claim can hold", async () => {
    let now = 1000;
    const { claim, calls } = store();
    const fees = createWakeFees({ claim, windowSeconds: 60, clock: () => now });
    expect(await fees.claim(offer)).toBe(true);
    expect(await fees.claim(offer)).toBe(false);
    now = 1059;
    expect(await fees.claim(offer)).toBe(false);
    expect(await fees.claim(other)).toBe(true);
    expect(calls).toEqual([offer, other]);
    now = 1060;
    expect(await fees.claim(offer)).toBe(true);
    expect(calls).toEqual([offer, other, offer]);
  });

  it("learns another process's claim from the store's answer", async () => {
    let now = 1000;
    const calls: number[] = [];
    const fees = createWakeFees({
      claim: async (_offerId, at) => {
        calls.push(at);
        return { claimed: false, chargedAt: 990 };
      },
      windowSeconds: 60,
      clock: () => now,
    });
    expect(await fees.claim(offer)).toBe(false);
    now = 1049;
    expect(await fees.claim(offer)).toBe(false);
    now = 1050;
    expect(await fees.claim(offer)).toBe(false);
    expect(calls).toEqual([1000, 1050]);
  });

  it("charges no fee when the store cannot answer, and says so", async () => {
    const errors: unknown[] = [];
    const fees = createWakeFees({
      claim: async () => {
        throw new Error("connection reset");
      },
      windowSeconds: 60,
      clock: () => 1000,
      onError: (offerId, error) => errors.push([offerId, (error as Error).message]),
    });
    expect(await fees.claim(offer)).toBe(false);
    expect(errors).toEqual([[offer, "connection reset"]]);
  });
});
