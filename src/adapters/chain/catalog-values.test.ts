import fc from "fast-check";
import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { rawModelArb, rawOfferArb } from "../../../test/helpers/chain-values.js";
import { modelStatuses, offerStatuses } from "../../domain/catalog.js";
import {
  maxCapabilitiesDepth,
  maxTextBytes,
  modelFromChain,
  offerFromChain,
  type RawOffer,
} from "./catalog-values.js";

const offerId = `0x${"11".repeat(32)}` as Hex;
const modelId = `0x${"22".repeat(32)}` as Hex;
const utf8 = (s: string) => new TextEncoder().encode(s);

const valid: RawOffer = {
  modelId,
  owner: `0x${"aa".repeat(20)}`,
  operator: `0x${"bb".repeat(20)}`,
  payout: `0x${"cc".repeat(20)}`,
  status: 0,
  tariff: { version: 1n, inputPricePerMTok: 10n, outputPricePerMTok: 20n, wakeFee: 0n },
  metadata: {
    region: utf8("eu-west"),
    hardware: utf8("gpu-a100"),
    maxConcurrency: 8,
    capabilities: utf8('{"max_output_tokens":4096}'),
  },
};
const withMetadata = (metadata: Partial<RawOffer["metadata"]>): RawOffer => ({
  ...valid,
  metadata: { ...valid.metadata, ...metadata },
});

/** Whether a JS string survives as PostgreSQL text / jsonb: no NUL, no unpaired surrogate. */
function storable(s: string): boolean {
  return !s.includes("\u0000") && !/\p{Cs}/u.test(s);
}

function jsonStorable(value: unknown, depth = 1): boolean {
  if (typeof value === "string") return storable(value);
  if (typeof value !== "object" || value === null) return true;
  if (depth > maxCapabilitiesDepth) return false;
  return Object.entries(value).every(([k, v]) => storable(k) && jsonStorable(v, depth + 1));
}

describe("offerFromChain", () => {
  it("maps a valid offer as it is", () => {
    expect(offerFromChain(offerId, valid)).toEqual({
      offerId,
      modelId,
      owner: valid.owner,
      operator: valid.operator,
      payout: valid.payout,
      status: "active",
      tariff: valid.tariff,
      region: "eu-west",
      hardware: "gpu-a100",
      maxConcurrency: 8,
      capabilities: { max_output_tokens: 4096 },
    });
  });

  it.each([
    [
      "max_concurrency 2^31 (int4 overflow)",
      { maxConcurrency: 2 ** 31 },
      "max_concurrency_out_of_range",
    ],
    ["max_concurrency 2^32-1", { maxConcurrency: 2 ** 32 - 1 }, "max_concurrency_out_of_range"],
    ["a NUL in region", { region: utf8("eu\u0000west") }, "region_has_nul"],
    [
      "invalid UTF-8 in hardware",
      { hardware: Uint8Array.of(0x67, 0xff, 0xfe) },
      "hardware_invalid_utf8",
    ],
    ["an overlong hardware", { hardware: utf8("x".repeat(maxTextBytes + 1)) }, "hardware_too_long"],
    [
      "huge capabilities",
      { capabilities: utf8(`{"a":"${"x".repeat(64 * 1024)}"}`) },
      "capabilities_too_long",
    ],
    [
      "capabilities that grow past 64 KiB when stored",
      { capabilities: utf8(`{"a":[${Array(12_000).fill("1e20").join(",")}]}`) },
      "capabilities_too_long",
    ],
    ["a raw NUL in capabilities", { capabilities: utf8('{"a":"\u0000"}') }, "capabilities_has_nul"],
    [
      "a \\u0000 escape in capabilities",
      { capabilities: utf8('{"a":"\\u0000"}') },
      "capabilities_has_nul",
    ],
    [
      "a \\u0000 escape in a capabilities key",
      { capabilities: utf8('{"\\u0000":1}') },
      "capabilities_has_nul",
    ],
    [
      "an unpaired surrogate in capabilities",
      { capabilities: utf8('{"a":["\\ud800"]}') },
      "capabilities_invalid_unicode",
    ],
    [
      "capabilities nested too deep",
      { capabilities: utf8(`{"a":${"[".repeat(40)}${"]".repeat(40)}}`) },
      "capabilities_too_deep",
    ],
  ])("quarantines %s", (_name, metadata, reason) => {
    const row = offerFromChain(offerId, withMetadata(metadata));
    expect(row).toMatchObject({
      offerId,
      modelId,
      status: "active",
      tariff: valid.tariff,
      region: "",
      hardware: "",
      maxConcurrency: 0,
      capabilities: {},
      quarantineReason: reason,
    });
  });

  it("quarantines an unknown status", () => {
    expect(offerFromChain(offerId, { ...valid, status: 7 })).toMatchObject({
      status: "retired",
      quarantineReason: "status_unknown",
    });
  });

  it("keeps the limits themselves", () => {
    const row = offerFromChain(
      offerId,
      withMetadata({ maxConcurrency: 2 ** 31 - 1, region: utf8("é".repeat(maxTextBytes / 2)) }),
    );
    expect(row.quarantineReason).toBeUndefined();
    expect(row.maxConcurrency).toBe(2 ** 31 - 1);
  });

  it("reads capabilities that are not a JSON object as none, as before", () => {
    for (const text of ["", "[]", "null", "not json", '"s"']) {
      const row = offerFromChain(offerId, withMetadata({ capabilities: utf8(text) }));
      expect(row.quarantineReason).toBeUndefined();
      expect(row.capabilities).toEqual({});
    }
  });

  it("maps any chain value to a storable row or to a quarantine", () => {
    fc.assert(
      fc.property(rawOfferArb(), (raw) => {
        const row = offerFromChain(offerId, raw);
        expect(offerStatuses).toContain(row.status);
        expect(Number.isInteger(row.maxConcurrency)).toBe(true);
        expect(row.maxConcurrency).toBeGreaterThanOrEqual(0);
        expect(row.maxConcurrency).toBeLessThanOrEqual(2 ** 31 - 1);
        if (row.quarantineReason !== undefined) {
          expect(row).toMatchObject({ region: "", hardware: "", maxConcurrency: 0 });
          expect(row.capabilities).toEqual({});
          return;
        }
        for (const s of [row.region, row.hardware]) {
          expect(storable(s)).toBe(true);
          expect(Buffer.byteLength(s)).toBeLessThanOrEqual(maxTextBytes);
        }
        expect(jsonStorable(row.capabilities)).toBe(true);
        expect(Buffer.byteLength(JSON.stringify(row.capabilities))).toBeLessThanOrEqual(64 * 1024);
      }),
      { numRuns: 2000 },
    );
  });

  it("accepts every valid offer (no quarantine without a reason)", () => {
    const printable = fc.string({ maxLength: 30 }).filter((s) => !s.includes("\u0000"));
    fc.assert(
      fc.property(
        printable,
        printable,
        fc.integer({ min: 0, max: 2 ** 31 - 1 }),
        fc.dictionary(printable, fc.oneof(printable, fc.integer(), fc.boolean())),
        (region, hardware, maxConcurrency, caps) => {
          const row = offerFromChain(
            offerId,
            withMetadata({
              region: utf8(region),
              hardware: utf8(hardware),
              maxConcurrency,
              capabilities: utf8(JSON.stringify(caps)),
            }),
          );
          expect(row.quarantineReason).toBeUndefined();
          expect(row).toMatchObject({ region, hardware, maxConcurrency });
        },
      ),
    );
  });
});

describe("modelFromChain", () => {
  it("maps any chain value to a storable row or to a quarantine", () => {
    fc.assert(
      fc.property(rawModelArb, (raw) => {
        const row = modelFromChain(modelId, raw);
        expect(modelStatuses).toContain(row.status);
        if (row.quarantineReason !== undefined) {
          expect(row).toMatchObject({ repository: "", revision: "", task: "" });
          return;
        }
        for (const s of [row.repository, row.revision, row.task]) {
          expect(storable(s)).toBe(true);
          expect(Buffer.byteLength(s)).toBeLessThanOrEqual(maxTextBytes);
        }
      }),
      { numRuns: 2000 },
    );
  });

  it("quarantines a NUL in the repository, naming the field only", () => {
    const row = modelFromChain(modelId, {
      creator: `0x${"aa".repeat(20)}`,
      creditToken: `0x${"bb".repeat(20)}`,
      repository: utf8("org/\u0000secret"),
      revision: utf8("main"),
      task: utf8("chat"),
      poolId: `0x${"33".repeat(32)}`,
      positionTokenId: 2n ** 256n - 1n,
      status: 1,
    });
    expect(row).toMatchObject({
      status: "active",
      repository: "",
      positionTokenId: 2n ** 256n - 1n,
      quarantineReason: "repository_has_nul",
    });
  });
});
