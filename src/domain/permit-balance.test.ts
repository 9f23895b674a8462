import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { GatewayError } from "./errors.js";
import {
  availableCredits,
  emptyPermitLedger,
  permitBalance,
  readPermitBalance,
  type PermitLedger,
} from "./permit-balance.js";
import type { Permit, PermitReader } from "./permits.js";

const hex32 = (byte: string): Hex => `0x${byte.repeat(32)}`;
const permitId = hex32("01");
const now = 1_700_000_000;

const open: Permit = {
  permitId,
  payer: `0x${"11".repeat(20)}`,
  modelId: hex32("0a"),
  offerId: undefined,
  deposit: 1_000n,
  settled: 0n,
  expiresAt: now + 60,
  state: "open",
  closableAt: undefined,
};

const ledger = (l: Partial<PermitLedger>): PermitLedger => ({ ...emptyPermitLedger, ...l });

describe("availableCredits", () => {
  it("is the deposit minus charges, unrecorded chain settlements and reservations", () => {
    expect(availableCredits(emptyPermitLedger, 1_000n, 0n)).toBe(1_000n);
    expect(availableCredits(ledger({ reserved: 100n, charged: 300n }), 1_000n, 0n)).toBe(600n);
    // What the gateway settled is already in `charged`: counted once.
    expect(availableCredits(ledger({ charged: 300n, settled: 200n }), 1_000n, 200n)).toBe(700n);
    // Settled on chain beyond the ledger's record (another gateway): counted too.
    expect(availableCredits(ledger({ charged: 300n, settled: 200n }), 1_000n, 450n)).toBe(450n);
    // Over-committed: negative.
    expect(availableCredits(ledger({ charged: 900n, reserved: 200n }), 1_000n, 0n)).toBe(-100n);
  });
});

describe("permitBalance", () => {
  it("combines the chain's permit with the ledger", () => {
    const balance = permitBalance(
      { ...open, settled: 200n },
      ledger({ reserved: 100n, charged: 350n, settled: 200n }),
      now,
    );
    expect(balance).toEqual({
      permitId,
      state: "open",
      modelId: open.modelId,
      offerId: undefined,
      payer: open.payer,
      expiresAt: now + 60,
      closableAt: undefined,
      deposit: 1_000n,
      settled: 200n,
      chargedUnsettled: 150n,
      reserved: 100n,
      available: 550n,
    });
    // Everything is accounted for: settled + unsettled + reserved + available = deposit.
    expect(balance.settled + balance.chargedUnsettled + balance.reserved + balance.available).toBe(
      balance.deposit,
    );
  });

  it("keeps unsettleable charges in charged_unsettled and out of available", () => {
    const balance = permitBalance(
      open,
      ledger({ charged: 400n, settled: 100n, unsettleable: 250n }),
      now,
    );
    expect(balance.chargedUnsettled).toBe(300n);
    expect(balance.available).toBe(600n);
  });

  it("clamps available at 0 when over-committed", () => {
    expect(permitBalance(open, ledger({ charged: 900n, reserved: 200n }), now).available).toBe(0n);
  });

  it("makes nothing available unless the permit is open and unexpired", () => {
    expect(permitBalance({ ...open, expiresAt: now + 1 }, emptyPermitLedger, now).available).toBe(
      1_000n,
    );
    expect(permitBalance({ ...open, expiresAt: now }, emptyPermitLedger, now).available).toBe(0n);
    const closing: Permit = { ...open, state: "closing", closableAt: now + 3600 };
    expect(permitBalance(closing, emptyPermitLedger, now)).toMatchObject({
      state: "closing",
      closableAt: now + 3600,
      available: 0n,
    });
    expect(
      permitBalance({ ...closing, state: "closed" }, ledger({ reserved: 5n }), now),
    ).toMatchObject({ state: "closed", closableAt: now + 3600, reserved: 5n, available: 0n });
  });

  it("gives closableAt only for closing and closed permits", () => {
    expect(permitBalance({ ...open, closableAt: now }, emptyPermitLedger, now).closableAt).toBe(
      undefined,
    );
  });

  it("passes an offer pin through", () => {
    const offerId = hex32("0b");
    expect(permitBalance({ ...open, offerId }, emptyPermitLedger, now).offerId).toBe(offerId);
  });
});

describe("readPermitBalance", () => {
  function reader(permit: Permit | undefined, fail?: unknown): PermitReader & { reads: Hex[] } {
    const reads: Hex[] = [];
    return {
      reads,
      get(id) {
        reads.push(id);
        return fail === undefined ? Promise.resolve(permit) : Promise.reject(fail);
      },
      invalidate() {},
    };
  }
  const ledgerOf = (l: PermitLedger) => () => Promise.resolve(l);
  const dbDown = () => Promise.reject(new Error("connection refused"));

  async function code(promise: Promise<unknown>): Promise<string> {
    const error = await promise.then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(GatewayError);
    return (error as GatewayError).code;
  }

  it("reads the permit by its lower-case id and combines it with its ledger", async () => {
    const permits = reader(open);
    const balance = await readPermitBalance(permitId.toUpperCase().replace("0X", "0x"), {
      permits,
      ledger: ledgerOf(ledger({ reserved: 10n })),
      now,
    });
    expect(permits.reads).toEqual([permitId]);
    expect(balance).toMatchObject({ permitId, reserved: 10n, available: 990n });
  });

  it("answers invalid_hex for an id that is not Hex32, without reading anything", async () => {
    for (const bad of ["", "0x1234", `${permitId}00`, `0x${"zz".repeat(32)}`, ` ${permitId}`]) {
      const permits = reader(open);
      expect(await code(readPermitBalance(bad, { permits, ledger: dbDown, now }))).toBe(
        "invalid_hex",
      );
      expect(permits.reads).toEqual([]);
    }
  });

  it("answers chain_unavailable, then permit_not_found, then database_unavailable", async () => {
    const deps = (permits: PermitReader, l: () => Promise<PermitLedger>) => ({
      permits,
      ledger: l,
      now,
    });
    expect(
      await code(readPermitBalance(permitId, deps(reader(open, new Error("x")), dbDown))),
    ).toBe("chain_unavailable");
    expect(await code(readPermitBalance(permitId, deps(reader(undefined), dbDown)))).toBe(
      "permit_not_found",
    );
    expect(await code(readPermitBalance(permitId, deps(reader(open), dbDown)))).toBe(
      "database_unavailable",
    );
  });

  it("maps the codes through the error table (an unknown permit is a payment error, 402)", async () => {
    const error = await readPermitBalance(permitId, {
      permits: reader(undefined),
      ledger: ledgerOf(emptyPermitLedger),
      now,
    }).catch((err: unknown) => err as GatewayError);
    expect(error).toMatchObject({ code: "permit_not_found", kind: "payment" });
  });
});
