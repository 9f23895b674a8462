import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import {
  createMeasurementSync,
  createOfferMeasurements,
  type SharedMeasurement,
} from "./measurements.js";

const offer = `0x${"01".repeat(32)}` as Hex;

describe("offer measurements", () => {
  it("keeps moving averages of latency and throughput per offer", () => {
    const m = createOfferMeasurements({ alpha: 0.5 });
    expect(m.get(offer)).toBeUndefined();
    m.record(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    m.record(offer, { latencyMs: 300, outputTokens: 30n, generationMs: 1000 });
    expect(m.get(offer)).toEqual({ latencyMs: 200, throughput: 20, samples: 2 });
    // An answer with no measurable generation time leaves throughput as it was.
    m.record(offer, { latencyMs: 200, outputTokens: 1n, generationMs: 0 });
    expect(m.get(offer)).toEqual({ latencyMs: 200, throughput: 20, samples: 3 });
  });

  it("blends the other processes' averages by sample count, ignoring its own rows", () => {
    const m = createOfferMeasurements({ instanceId: "me" });
    m.record(offer, { latencyMs: 100, outputTokens: 10n, generationMs: 1000 });
    const rows: SharedMeasurement[] = [
      { offerId: offer, instanceId: "me", latencyMs: 9999, throughput: 9999, samples: 50 },
      { offerId: offer, instanceId: "other", latencyMs: 400, throughput: undefined, samples: 3 },
    ];
    m.absorb(rows);
    expect(m.get(offer)).toEqual({ latencyMs: 325, throughput: 10, samples: 4 });
  });

  it("shares by writing its own averages and reading the others' each round", async () => {
    const written: [string, number][] = [];
    const m = createOfferMeasurements({ instanceId: "me" });
    const sync = createMeasurementSync({
      measurements: m,
      instanceId: "me",
      intervalMs: 1000,
      store: {
        write: async (instanceId, rows) => {
          written.push([instanceId, rows.size]);
        },
        read: async () => [
          { offerId: offer, instanceId: "other", latencyMs: 50, throughput: 5, samples: 1 },
        ],
      },
    });
    await sync.runOnce();
    // Nothing measured here yet: nothing written, the others' averages read.
    expect(written).toEqual([]);
    expect(m.get(offer)).toEqual({ latencyMs: 50, throughput: 5, samples: 1 });
    m.record(offer, { latencyMs: 150, outputTokens: 15n, generationMs: 1000 });
    await sync.runOnce();
    expect(written).toEqual([["me", 1]]);
  });
});
