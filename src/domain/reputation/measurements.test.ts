import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { isDivergenceFlagged } from "./divergence.js";
import { createMeasurementSync } from "./measurement-sync.js";
import { binOf, createOfferMeasurements, median } from "./measurements.js";
import { keptDivergedPayers, type SharedMeasurement } from "./measurement-types.js";

const offer = `0x${"01".repeat(32)}` as Hex;

describe("offer measurements", () => {
  it("counts served and failed requests, and the medians of latency and throughput", () => {
    const m = createOfferMeasurements();
    expect(m.get(offer)).toBeUndefined();
    m.served(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    m.served(offer, { latencyMs: 300, outputTokens: 30n, generationMs: 1000 });
    m.served(offer, { latencyMs: 5000, outputTokens: 100n, generationMs: 1000 });
    // The lower median of three: 300 ms, 30 tokens/s; one outlier does not move it.
    expect(m.get(offer)).toEqual({
      latencyMs: 300,
      throughput: 30,
      served: 3,
      failed: 0,
      samples: 3,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: false,
    });
    // No measurable generation time: no throughput sample; no timing at all: counted only.
    m.served(offer, { latencyMs: 200, outputTokens: 1n, generationMs: 0 });
    m.served(offer);
    m.failed(offer);
    expect(m.get(offer)).toEqual({
      latencyMs: 200,
      throughput: 30,
      served: 5,
      failed: 1,
      samples: 4,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: false,
    });
  });

  it("forgets what left the window, bucket by bucket", () => {
    let now = 1_000_000;
    // A window of 150 s: 15 buckets of 10 s.
    const m = createOfferMeasurements({ windowSeconds: 150, now: () => now });
    m.served(offer, { latencyMs: 900, outputTokens: 10n, generationMs: 1000 });
    m.failed(offer);
    now += 100_000;
    m.served(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    m.served(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    expect(m.get(offer)).toMatchObject({ latencyMs: 100, served: 3, failed: 1 });
    now += 50_000;
    // The first bucket is now 150 s old: out.
    expect(m.get(offer)).toMatchObject({ latencyMs: 100, served: 2, failed: 0 });
    now += 100_000;
    expect(m.get(offer)).toBeUndefined();
    expect(m.local().size).toBe(0);
  });

  it("merges the other processes' windows with its own, ignoring its own rows", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    m.served(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    const rows: SharedMeasurement[] = [
      {
        offerId: offer,
        instanceId: "me",
        served: 50,
        failed: 50,
        latency: [[binOf(9999), 50, 9999 * 50]],
        throughput: [],
        claimed: 0,
        diverged: 0,
        divergedPayers: [],
        divergenceSince: 0,
      },
      {
        offerId: offer,
        instanceId: "other",
        served: 2,
        failed: 3,
        latency: [[binOf(400), 2, 800]],
        throughput: [],
        claimed: 0,
        diverged: 0,
        divergedPayers: [],
        divergenceSince: 0,
      },
    ];
    m.absorb(rows);
    // Latencies 100, 400, 400: median 400; served 1 + 2, failed 3.
    expect(m.get(offer)).toEqual({
      latencyMs: 400,
      throughput: 10,
      served: 3,
      failed: 3,
      samples: 3,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: false,
    });
  });

  it("takes the median as the mean of its bin's values", () => {
    expect(median([])).toBeUndefined();
    // 101 and 103 share a bin (bins span ~9 %); 1000 is its own.
    expect(binOf(101)).toBe(binOf(103));
    expect(
      median([
        [binOf(101), 2, 204],
        [binOf(1000), 1, 1000],
      ]),
    ).toBe(102);
    expect(
      median([
        [binOf(101), 1, 101],
        [binOf(1000), 1, 1000],
      ]),
    ).toBe(101);
  });

  it("shares by writing its own windows and reading the others' and the counts each round", async () => {
    const written: [string, number][] = [];
    const m = createOfferMeasurements({ instanceId: "me", windowSeconds: 600 });
    const since: number[] = [];
    const sync = createMeasurementSync({
      measurements: m,
      instanceId: "me",
      intervalMs: 1000,
      clock: () => 5000,
      store: {
        write: async (instanceId, rows) => {
          written.push([instanceId, rows.size]);
        },
        read: async () => [
          {
            offerId: offer,
            instanceId: "other",
            served: 1,
            failed: 0,
            latency: [[binOf(50), 1, 50]],
            throughput: [[binOf(5), 1, 5]],
            claimed: 0,
            diverged: 0,
            divergedPayers: [],
            divergenceSince: 0,
          },
        ],
        readCounts: async (from) => {
          since.push(from);
          return new Map([[offer, { verificationsPassed: 1, verificationsRejected: 0, flags: 2 }]]);
        },
        readExclusions: async () => [],
        exclude: async () => false,
      },
    });
    await sync.runOnce();
    // Nothing measured here yet: an empty write (it deletes this process's rows), the others'
    // windows read, the counts of the window read.
    expect(written).toEqual([["me", 0]]);
    expect(since).toEqual([4400]);
    expect(m.get(offer)).toEqual({
      latencyMs: 50,
      throughput: 5,
      served: 1,
      failed: 0,
      samples: 1,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: false,
    });
    expect(sync.counts(offer)).toEqual({
      verificationsPassed: 1,
      verificationsRejected: 0,
      flags: 2,
    });
    m.served(offer, { latencyMs: 150, outputTokens: 15n, generationMs: 1000 });
    await sync.runOnce();
    expect(written).toEqual([
      ["me", 0],
      ["me", 1],
    ]);
  });
});

describe("usage claims in the measurements (docs/decisions/metering-and-tokens.md, Usage divergence)", () => {
  const other = `0x${"02".repeat(32)}` as Hex;
  /** Three independent payers, in turn. */
  const payer = (i: number) => `0x${((i % 3) + 1).toString(16).padStart(40, "0")}` as Hex;
  const row = (
    instanceId: string,
    claimed: number,
    diverged: number,
    divergenceSince = 0,
    divergedPayers: Hex[] = [payer(0), payer(1), payer(2)],
  ): SharedMeasurement => ({
    offerId: offer,
    instanceId,
    served: claimed,
    failed: 0,
    latency: [],
    throughput: [],
    claimed,
    diverged,
    divergedPayers,
    divergenceSince,
  });

  it("counts each offer's claimed answers and diverged claims, its own only", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 7; i++) m.claimed(offer, i < 3);
    m.claimed(other, false);
    expect(m.get(offer)).toMatchObject({ claimed: 7, diverged: 3, excluded: false });
    expect(m.get(other)).toMatchObject({ claimed: 1, diverged: 0 });
    // A claim is not a served answer (the relay reports that on its own).
    expect(m.get(offer)).toMatchObject({ served: 0, failed: 0 });
    expect(m.local().get(offer)).toMatchObject({ claimed: 7, diverged: 3, divergenceSince: 0 });
    // Other processes' claims are merged.
    m.absorb([row("other", 13, 9)]);
    expect(m.get(offer)).toMatchObject({ claimed: 20, diverged: 12 });
  });

  it("calls for an exclusion above half of at least 20 claims, once", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 19; i++) m.claimed(offer, true, payer(i));
    // 19 of 19: too few claims to judge.
    expect(m.exclusionsDue()).toEqual([]);
    m.claimed(offer, false);
    // 19 of 20: 95 %.
    expect(m.exclusionsDue()).toEqual([
      { offerId: offer, claimed: 20, diverged: 19, payers: 3, since: 0 },
    ]);
    const half = createOfferMeasurements();
    for (let i = 0; i < 20; i++) half.claimed(offer, i < 10, payer(i));
    // 10 of 20 is half, not more.
    expect(half.exclusionsDue()).toEqual([]);
    half.claimed(offer, true, payer(0));
    expect(half.exclusionsDue()).toEqual([
      { offerId: offer, claimed: 21, diverged: 11, payers: 3, since: 0 },
    ]);
    // Standing already: nothing more to write.
    half.setExclusions([{ offerId: offer, excludedAt: 100, clearedAt: undefined }]);
    expect(half.exclusionsDue()).toEqual([]);
    expect(half.get(offer)).toMatchObject({ excluded: true });
  });

  it("holds an exclusion without a measurement; a clearing restarts the counts", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    // A restarted process: nothing measured, the exclusion read from the database.
    m.setExclusions([{ offerId: offer, excludedAt: 100, clearedAt: undefined }]);
    expect(m.get(offer)).toEqual({
      latencyMs: undefined,
      throughput: undefined,
      served: 0,
      failed: 0,
      samples: 0,
      claimed: 0,
      diverged: 0,
      divergedPayers: 0,
      excluded: true,
    });
    for (let i = 0; i < 20; i++) m.claimed(offer, true, payer(i));
    m.absorb([row("other", 10, 10), row("late", 4, 4)]);
    expect(m.get(offer)).toMatchObject({ claimed: 34, diverged: 34, excluded: true });

    // Verified again at 200: its own counts are dropped, the other processes' count once they
    // follow the same clearing.
    m.setExclusions([{ offerId: offer, excludedAt: 100, clearedAt: 200 }]);
    expect(m.get(offer)).toMatchObject({ claimed: 0, diverged: 0, excluded: false });
    expect(m.exclusionsDue()).toEqual([]);
    m.absorb([row("other", 2, 1, 200), row("late", 30, 30, 0)]);
    m.claimed(offer, false);
    expect(m.get(offer)).toMatchObject({ claimed: 3, diverged: 1, excluded: false });
    expect(m.local().get(offer)).toMatchObject({ claimed: 1, diverged: 0, divergenceSince: 200 });
    // The same clearing read again changes nothing.
    m.setExclusions([{ offerId: offer, excludedAt: 100, clearedAt: 200 }]);
    expect(m.get(offer)).toMatchObject({ claimed: 3, diverged: 1 });
    // What it measured since counts toward a new exclusion, with the clearing it follows.
    for (let i = 0; i < 19; i++) m.claimed(offer, true, payer(i));
    expect(m.exclusionsDue()).toEqual([
      { offerId: offer, claimed: 22, diverged: 20, payers: 3, since: 200 },
    ]);
  });

  it("excludes through the store in the sharing round, and reads exclusions at start", async () => {
    const m = createOfferMeasurements({ instanceId: "me", windowSeconds: 600 });
    const excluded: [Hex, number, number, number][] = [];
    let stored: { offerId: Hex; excludedAt: number; clearedAt: number | undefined }[] = [];
    const sync = createMeasurementSync({
      measurements: m,
      instanceId: "me",
      intervalMs: 60_000,
      clock: () => 5000,
      store: {
        write: async () => {},
        read: async () => [],
        readCounts: async () => new Map(),
        readExclusions: async () => stored,
        exclude: async (due, at) => {
          excluded.push([due.offerId, due.claimed, due.diverged, at]);
          stored = [{ offerId: due.offerId, excludedAt: at, clearedAt: undefined }];
          return true;
        },
      },
    });
    for (let i = 0; i < 20; i++) m.claimed(offer, i < 10, payer(i));
    await sync.runOnce();
    expect(excluded).toEqual([]);
    m.claimed(offer, true, payer(0));
    await sync.runOnce();
    expect(excluded).toEqual([[offer, 21, 11, 5000]]);
    expect(m.get(offer)?.excluded).toBe(true);
    // Standing: not written again.
    await sync.runOnce();
    expect(excluded).toHaveLength(1);

    // Another process (restarted) knows of it before it serves.
    const restarted = createOfferMeasurements({ instanceId: "me" });
    const again = createMeasurementSync({
      measurements: restarted,
      instanceId: "me",
      intervalMs: 60_000,
      clock: () => 5000,
      store: {
        write: async () => {},
        read: async () => [],
        readCounts: async () => new Map(),
        readExclusions: async () => stored,
        exclude: async () => false,
      },
    });
    await again.readExclusions();
    expect(restarted.get(offer)?.excluded).toBe(true);
  });

  it("flags and excludes only across independent payers: 25 diverged answers of one payer do neither (issue 35)", () => {
    const griefer = payer(0);
    const one = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 25; i++) one.claimed(offer, true, griefer);
    expect(one.get(offer)).toMatchObject({ claimed: 25, diverged: 25, divergedPayers: 1 });
    expect(isDivergenceFlagged(one.get(offer))).toBe(false);
    expect(one.exclusionsDue()).toEqual([]);
    // The gateway's own probe is asked to confirm instead.
    expect(one.confirmationsDue()).toEqual([offer]);
    // Its keys and permits are one payer: the address, in any case.
    one.claimed(offer, true, griefer.toUpperCase().replace("0X", "0x") as Hex);
    expect(one.get(offer)?.divergedPayers).toBe(1);
    // A diverged answer without a payer counts in the share and adds no payer.
    one.claimed(offer, true);
    expect(one.get(offer)).toMatchObject({ diverged: 27, divergedPayers: 1 });

    const two = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 25; i++) two.claimed(offer, true, payer(i % 2));
    expect(isDivergenceFlagged(two.get(offer))).toBe(true);
    expect(two.exclusionsDue()).toEqual([]);

    const three = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 25; i++) three.claimed(offer, true, payer(i));
    expect(isDivergenceFlagged(three.get(offer))).toBe(true);
    expect(three.exclusionsDue()).toEqual([
      { offerId: offer, claimed: 25, diverged: 25, payers: 3, since: 0 },
    ]);
    expect(three.confirmationsDue()).toEqual([]);
  });

  it("counts payers across processes as a union, bounded, and from the clearing it follows", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    for (let i = 0; i < 10; i++) m.claimed(offer, true, payer(0));
    expect(m.local().get(offer)?.divergedPayers).toEqual([payer(0)]);
    // The same payer seen by another process is still one payer.
    m.absorb([row("other", 10, 10, 0, [payer(0)])]);
    expect(m.get(offer)).toMatchObject({ claimed: 20, diverged: 20, divergedPayers: 1 });
    expect(m.exclusionsDue()).toEqual([]);
    m.absorb([row("other", 10, 10, 0, [payer(0), payer(1)]), row("third", 1, 1, 0, [payer(2)])]);
    expect(m.get(offer)?.divergedPayers).toBe(3);
    expect(m.exclusionsDue()).toHaveLength(1);
    // Many payers are kept up to the bound.
    const many = createOfferMeasurements();
    for (let i = 0; i < 100; i++) {
      many.claimed(offer, true, `0x${i.toString(16).padStart(40, "0")}` as Hex);
    }
    expect(many.local().get(offer)?.divergedPayers).toHaveLength(keptDivergedPayers);
    // A clearing drops them with the counts.
    m.setExclusions([{ offerId: offer, excludedAt: 100, clearedAt: 200 }]);
    expect(m.local().get(offer)?.divergedPayers).toEqual([]);
    m.absorb([row("other", 10, 10, 0, [payer(1)])]);
    expect(m.get(offer)?.divergedPayers).toBe(0);
  });

  it("hands the sharing round's confirmations to the probe", async () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    const confirmed: Hex[] = [];
    const excluded: Hex[] = [];
    const sync = createMeasurementSync({
      measurements: m,
      instanceId: "me",
      intervalMs: 60_000,
      clock: () => 5000,
      confirm: (offerId) => confirmed.push(offerId),
      store: {
        write: async () => {},
        read: async () => [],
        readCounts: async () => new Map(),
        readExclusions: async () => [],
        exclude: async (due) => {
          excluded.push(due.offerId);
          return true;
        },
      },
    });
    for (let i = 0; i < 21; i++) m.claimed(offer, true, payer(0));
    await sync.runOnce();
    expect(confirmed).toEqual([offer]);
    expect(excluded).toEqual([]);
  });
});
