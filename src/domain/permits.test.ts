import type { Hex } from "viem";
import { httpStatusOf } from "../connect/error-codes.js";
import { describe, expect, it } from "vitest";
import { GatewayError, type ErrorCode } from "./errors.js";
import {
  checkPermit,
  createPermitClock,
  permitOfferPin,
  type Permit,
  type PermitReader,
} from "./permits.js";

const hex32 = (byte: string): Hex => `0x${byte.repeat(32)}`;
const permitId = hex32("01");
const modelId = hex32("0a");
const offerId = hex32("0b");
const now = 1_700_000_000;

const openPermit: Permit = {
  permitId,
  payer: `0x${"11".repeat(20)}`,
  modelId,
  offerId: undefined,
  deposit: 100n,
  settled: 0n,
  expiresAt: now + 60,
  state: "open",
  closableAt: undefined,
};

/** A reader over a fixed set of permits; `fail` makes every read throw. */
function readerOf(permits: Permit[], fail?: unknown): PermitReader & { reads: Hex[] } {
  const reads: Hex[] = [];
  return {
    reads,
    get(id) {
      reads.push(id);
      if (fail !== undefined) return Promise.reject(fail);
      return Promise.resolve(permits.find((p) => p.permitId === id));
    },
    invalidate() {},
  };
}

async function rejection(promise: Promise<unknown>): Promise<GatewayError> {
  const error = await promise.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(error).toBeInstanceOf(GatewayError);
  return error as GatewayError;
}

async function expectCode(
  header: string | undefined,
  permits: Permit[],
  code: ErrorCode,
  ctx: { pinnedOfferId?: Hex } = {},
): Promise<GatewayError> {
  const error = await rejection(checkPermit(header, readerOf(permits), { modelId, now, ...ctx }));
  expect(error.code).toBe(code);
  expect(httpStatusOf(error.code)).toBe(code === "invalid_hex" ? 400 : 402);
  return error;
}

describe("checkPermit", () => {
  it("returns an open, unexpired permit of the model", async () => {
    await expect(checkPermit(permitId, readerOf([openPermit]), { modelId, now })).resolves.toBe(
      openPermit,
    );
  });

  it("accepts the header in any hex case and reads the lower-case id", async () => {
    const reader = readerOf([openPermit]);
    await checkPermit(permitId.toUpperCase().replace("0X", "0x"), reader, {
      modelId: modelId.toUpperCase().replace("0X", "0x") as Hex,
      now,
    });
    expect(reader.reads).toEqual([permitId]);
  });

  it("answers permit_missing without a header", async () => {
    await expectCode(undefined, [openPermit], "permit_missing");
    await expectCode("", [openPermit], "permit_missing");
  });

  it("answers invalid_hex for a header that is not Hex32, without reading the chain", async () => {
    const reader = readerOf([openPermit]);
    for (const header of ["0x1234", "permit", `${permitId}00`, permitId.slice(2)]) {
      const error = await rejection(checkPermit(header, reader, { modelId, now }));
      expect(error.code).toBe("invalid_hex");
    }
    expect(reader.reads).toEqual([]);
  });

  it("answers chain_unavailable (503) when the chain cannot be read, keeping the cause", async () => {
    const cause = new Error("connection refused");
    const error = await rejection(checkPermit(permitId, readerOf([], cause), { modelId, now }));
    expect(error.code).toBe("chain_unavailable");
    expect(httpStatusOf(error.code)).toBe(503);
    expect(error.cause).toBe(cause);
    const passed = new GatewayError("chain_unavailable", "down");
    await expect(checkPermit(permitId, readerOf([], passed), { modelId, now })).rejects.toBe(
      passed,
    );
  });

  it("answers permit_not_found for an unknown permit", async () => {
    await expectCode(permitId, [], "permit_not_found");
  });

  it("answers permit_closed and permit_closing", async () => {
    await expectCode(permitId, [{ ...openPermit, state: "closed" }], "permit_closed");
    await expectCode(permitId, [{ ...openPermit, state: "closing" }], "permit_closing");
  });

  it("answers permit_expired from expiresAt <= now", async () => {
    await expectCode(permitId, [{ ...openPermit, expiresAt: now }], "permit_expired");
    await expectCode(permitId, [{ ...openPermit, expiresAt: now - 1 }], "permit_expired");
    await expect(
      checkPermit(permitId, readerOf([{ ...openPermit, expiresAt: now + 1 }]), { modelId, now }),
    ).resolves.toBeDefined();
  });

  it("answers permit_model_mismatch for a permit of another model", async () => {
    await expectCode(permitId, [{ ...openPermit, modelId: hex32("0c") }], "permit_model_mismatch");
  });

  it("answers permit_offer_mismatch only when both sides pin different offers", async () => {
    const pinned = { ...openPermit, offerId };
    await expectCode(permitId, [pinned], "permit_offer_mismatch", { pinnedOfferId: hex32("0d") });
    const ok = async (permit: Permit, pinnedOfferId?: Hex) =>
      expect(
        checkPermit(permitId, readerOf([permit]), { modelId, now, pinnedOfferId }),
      ).resolves.toBe(permit);
    await ok(pinned, offerId);
    await ok(pinned, offerId.toUpperCase().replace("0X", "0x") as Hex);
    await ok(pinned);
    await ok(openPermit, hex32("0d"));
  });

  it("checks in the documented order", async () => {
    // Closed and expired and for another model and pinned elsewhere: closed comes first.
    const worst: Permit = {
      ...openPermit,
      state: "closed",
      expiresAt: 0,
      modelId: hex32("0c"),
      offerId,
    };
    const pinnedOfferId = hex32("0d");
    await expectCode(permitId, [worst], "permit_closed", { pinnedOfferId });
    await expectCode(permitId, [{ ...worst, state: "closing" }], "permit_closing", {
      pinnedOfferId,
    });
    await expectCode(permitId, [{ ...worst, state: "open" }], "permit_expired", { pinnedOfferId });
    await expectCode(
      permitId,
      [{ ...worst, state: "open", expiresAt: now + 1 }],
      "permit_model_mismatch",
      {
        pinnedOfferId,
      },
    );
  });
});

describe("permitOfferPin", () => {
  it("is the permit's offer, or undefined for any offer", () => {
    expect(permitOfferPin(openPermit)).toBeUndefined();
    expect(permitOfferPin({ ...openPermit, offerId })).toBe(offerId);
  });
});

describe("createPermitClock", () => {
  it("is the later of the gateway's clock and the latest block time seen, which never goes back", () => {
    let own = now;
    const clock = createPermitClock(() => own);
    // No block seen yet: the gateway's clock alone.
    expect(clock.latestBlockTime).toBeUndefined();
    expect(clock.now()).toBe(now);
    // The chain ahead of the gateway: the chain's time.
    clock.observeBlock(now + 7200);
    expect(clock.now()).toBe(now + 7200);
    // An older head (a lagging node) changes nothing.
    clock.observeBlock(now + 10);
    expect(clock.latestBlockTime).toBe(now + 7200);
    expect(clock.now()).toBe(now + 7200);
    // The gateway's clock past the chain's (a stalled chain): the gateway's.
    own = now + 9000;
    expect(clock.now()).toBe(now + 9000);
  });

  it("refuses a permit the chain's time has passed while the gateway's clock has not", async () => {
    const clock = createPermitClock(() => now);
    const permit = { ...openPermit, expiresAt: now + 60 };
    const reader = readerOf([permit]);
    await expect(checkPermit(permitId, reader, { modelId, now: clock.now() })).resolves.toBe(
      permit,
    );
    clock.observeBlock(now + 60);
    const error = await rejection(checkPermit(permitId, reader, { modelId, now: clock.now() }));
    expect(error.code).toBe("permit_expired");
  });
});
