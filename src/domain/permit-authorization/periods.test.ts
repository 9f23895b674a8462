import { verifyTypedData, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import type { TypedDataField } from "../signatures.js";
import { errorCodes, GatewayError } from "../errors.js";
import { periodCapRefusal, periodUse, type PermitAuthorization } from "./authorizations.js";
import { readCaps } from "./checks.js";
import { periodEnd, periodStart } from "./periods.js";
import {
  anyPermit,
  authorizeKeyFields,
  authorizeKeyFieldsBeforePeriods,
  buildAuthorizeKeyTypedData,
  gatewaySigningDomain,
  signable,
} from "./typed-data.js";

const at = (iso: string) => Date.parse(iso) / 1000;
const permit = `0x${"ab".repeat(32)}` as const;

describe("the periods of a periodic cap: UTC calendar days, weeks from Monday, months", () => {
  it.each([
    ["day", "2026-11-29T23:59:59Z", "2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z"],
    ["day", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-01T00:00:00Z"],
    // 2026-11-29 is a Sunday: its week began on Monday the 23rd.
    ["week", "2026-11-29T12:00:00Z", "2026-11-23T00:00:00Z", "2026-11-30T00:00:00Z"],
    ["week", "2026-11-30T00:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"],
    ["week", "1970-01-01T00:00:00Z", "1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z"],
    ["month", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"],
    ["month", "2028-02-29T10:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"],
  ] as const)("%s holding %s: from %s to %s", (period, t, start, end) => {
    expect(periodStart(period, at(t))).toBe(at(start));
    expect(periodEnd(period, at(t))).toBe(at(end));
  });
});

describe("a signed periodic cap (readCaps)", () => {
  it("takes a period with its credits, or neither", () => {
    expect(readCaps("0", "0", permit, "day", "2000")).toEqual({
      totalCap: 0n,
      perRequestCap: 0n,
      period: "day",
      periodCap: 2000n,
      warnAt: 0n,
    });
    expect(readCaps(undefined, undefined, anyPermit)).toMatchObject({
      period: "",
      periodCap: 0n,
      warnAt: 0n,
    });
  });

  it.each([
    ["an unknown period", "year", "10", permit, "0", /period must be one of day, week, month/],
    ["a period without credits", "day", "0", permit, "0", /both its period and its credits/],
    ["credits without a period", "", "10", permit, "0", /both its period and its credits/],
    ["every permit", "week", "10", anyPermit, "0", /needs one permit/],
    ["a per-request cap above it", "month", "10", permit, "11", /perRequestCap is above periodCap/],
  ])("refuses %s (authorization_cap_invalid)", (_, period, periodCap, permitId, perRequest, m) => {
    let error: unknown;
    try {
      readCaps("0", perRequest, permitId, period, periodCap);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(GatewayError);
    expect((error as GatewayError).code).toBe("authorization_cap_invalid");
    expect((error as GatewayError).message).toMatch(m);
  });
});

describe("a periodic cap's use and refusal", () => {
  const a: PermitAuthorization = {
    id: "pauth_000000000000000000000001",
    apiKeyId: "key_000000000000000000000001",
    payer: `0x${"aa".repeat(20)}`,
    permitId: permit,
    expiresAt: at("2027-01-01T00:00:00Z"),
    issuedAt: at("2026-11-01T00:00:00Z"),
    totalCap: 0n,
    perRequestCap: 0n,
    period: "day",
    periodCap: 2000n,
    warnAt: 0n,
    createdAt: at("2026-11-01T00:00:00Z"),
    revokedAt: null,
    revokedBy: null,
  };

  it("counts the ledger's period only while it is the current one", () => {
    const used = {
      ...a,
      use: {
        creditsUsed: 0n,
        creditsReserved: 0n,
        lastUsedAt: null,
        period: { start: at("2026-11-29T00:00:00Z"), held: 1500n },
      },
    };
    expect(periodUse(used, at("2026-11-29T20:00:00Z"))).toEqual({
      used: 1500n,
      renewsAt: at("2026-11-30T00:00:00Z"),
    });
    expect(periodUse(used, at("2026-11-30T00:00:01Z"))).toEqual({
      used: 0n,
      renewsAt: at("2026-12-01T00:00:00Z"),
    });
    expect(periodUse({ ...a, period: "", periodCap: 0n }, 0)).toBeUndefined();
  });

  it("names the period and when it renews, in ISO and Unix seconds (402 authorization_period_cap_exhausted)", () => {
    const error = periodCapRefusal(a, 800n, at("2026-11-29T20:00:00Z"));
    expect(error.code).toBe("authorization_period_cap_exhausted");
    expect(errorCodes[error.code]).toBe("payment");
    expect(error.retryAfterSeconds).toBe(4 * 3600);
    expect(error.message).toContain("this day's cap of 2000 credits");
    expect(error.message).toContain(
      `renews at 2026-11-30T00:00:00.000Z (${at("2026-11-30T00:00:00Z")}, Unix seconds`,
    );
  });
});

describe("the AuthorizeKey with a periodic cap (issue 38)", () => {
  const account = privateKeyToAccount(`0x${"11".repeat(32)}`);
  const message = {
    payer: account.address,
    keyId: "key_000000000000000000000001",
    permitId: permit,
    expiresAt: 1_800_000_000,
    issuedAt: 1_790_000_000,
    deployment: "dep_00000000000000000000000000000001",
    totalCap: "0",
    perRequestCap: "0",
    period: "day",
    periodCap: "2000",
    warnAt: "0",
    nonce: "n",
  };
  const domain = gatewaySigningDomain(31337, `0x${"22".repeat(20)}`);
  const verify = (fields: readonly TypedDataField[], m: object, signature: Hex) =>
    verifyTypedData({
      address: account.address,
      domain,
      types: { AuthorizeKey: [...fields] },
      primaryType: "AuthorizeKey",
      message: m as Record<string, unknown>,
      signature,
    });

  it("is over the period and its cap: another period, cap or none does not verify", async () => {
    const typed = buildAuthorizeKeyTypedData({
      chainId: 31337,
      market: domain.verifyingContract,
      message,
    });
    const signature = await account.signTypedData(signable(typed));
    expect(await verify(authorizeKeyFields, message, signature)).toBe(true);
    for (const altered of [
      { period: "week" },
      { periodCap: "2001" },
      { period: "", periodCap: "0" },
    ])
      expect(await verify(authorizeKeyFields, { ...message, ...altered }, signature)).toBe(false);
  });

  it("leaves the proof of an authorization stored before it verifiable under the older field list", async () => {
    const { period: _p, periodCap: _c, warnAt: _w, ...before } = message;
    const signature = await account.signTypedData({
      domain,
      types: { AuthorizeKey: [...authorizeKeyFieldsBeforePeriods] },
      primaryType: "AuthorizeKey",
      message: before,
    });
    expect(await verify(authorizeKeyFieldsBeforePeriods, before, signature)).toBe(true);
    // Not as the newer type, whatever period it is read with.
    expect(
      await verify(
        authorizeKeyFields,
        { ...before, period: "", periodCap: "0", warnAt: "0" },
        signature,
      ),
    ).toBe(false);
  });
});
