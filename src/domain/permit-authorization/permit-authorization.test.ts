import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import {
  anyPermit,
  authorizationStatus,
  covers,
  createKeyAuthorities,
  type PermitAuthorization,
} from "./index.js";

const now = 1_800_000_000;
const payer = `0x${"aa".repeat(20)}` as Hex;
const permit = { permitId: `0x${"01".repeat(32)}` as Hex, payer };
const authorization = (overrides: Partial<PermitAuthorization> = {}): PermitAuthorization => ({
  id: "pauth_000000000000000000000001",
  apiKeyId: "key_1",
  payer,
  permitId: permit.permitId,
  expiresAt: now + 60,
  issuedAt: now - 60,
  totalCap: 0n,
  perRequestCap: 0n,
  period: "",
  periodCap: 0n,
  warnAt: 0n,
  createdAt: now - 60,
  revokedAt: null,
  revokedBy: null,
  ...overrides,
});

describe("covers: whether an authorization lets its key spend a permit", () => {
  it.each([
    ["the permit it names", {}, true],
    ["every permit of the payer (zero permit id)", { permitId: anyPermit }, true],
    ["another permit of the payer", { permitId: `0x${"02".repeat(32)}` as Hex }, false],
    ["another payer's permit", { payer: `0x${"bb".repeat(20)}` as Hex }, false],
    [
      "another payer, every permit",
      { payer: `0x${"bb".repeat(20)}` as Hex, permitId: anyPermit },
      false,
    ],
    ["at its expiry", { expiresAt: now }, false],
    ["revoked", { revokedAt: now - 1, revokedBy: "payer" as const }, false],
  ])("%s: %s", (_name, overrides, expected) => {
    expect(covers(authorization(overrides), permit, now)).toBe(expected);
  });

  it("compares the payer and permit id whatever their case", () => {
    const upper = {
      permitId: permit.permitId.toUpperCase().replace("0X", "0x") as Hex,
      payer: `0x${"AA".repeat(20)}` as Hex,
    };
    expect(covers(authorization(), upper, now)).toBe(true);
  });

  it("names the status", () => {
    expect(authorizationStatus(authorization(), now)).toBe("active");
    expect(authorizationStatus(authorization({ expiresAt: now }), now)).toBe("expired");
    expect(
      authorizationStatus(authorization({ expiresAt: now, revokedAt: now, revokedBy: "key" }), now),
    ).toBe("revoked");
  });
});

describe("key authorities: held in memory for the API key cache's time", () => {
  it("applies this process's authorizations and revocations at once, and forgets after ttlMs", () => {
    let ms = 0;
    const held = createKeyAuthorities({ ttlMs: 1000, now: () => ms });
    expect(held.get("key_1")).toBeUndefined();
    const authority = held.load("key_1", [], held.mark());
    expect(authority.allows(permit, now)).toBe(false);
    held.added(authorization());
    expect(held.get("key_1")!.allows(permit, now)).toBe(true);
    // Another key's authorization changes nothing here.
    held.added(
      authorization({
        id: "pauth_000000000000000000000002",
        apiKeyId: "key_2",
        permitId: anyPermit,
      }),
    );
    expect(held.get("key_2")).toBeUndefined();
    held.revoked("key_1", "pauth_000000000000000000000001");
    expect(held.get("key_1")!.allows(permit, now)).toBe(false);
    held.load("key_1", [authorization()], held.mark());
    ms = 999;
    expect(held.get("key_1")!.allows(permit, now)).toBe(true);
    ms = 1000;
    expect(held.get("key_1")).toBeUndefined();
  });
});

describe("key authorities: a load that read the database before a change of this process", () => {
  it("keeps the change: a revoked authorization stays refused, a new one stays usable", () => {
    let ms = 0;
    const held = createKeyAuthorities({ ttlMs: 5000, now: () => ms });
    const revokedHere = authorization();
    const madeHere = authorization({
      id: "pauth_000000000000000000000003",
      permitId: `0x${"02".repeat(32)}`,
    });
    const other = { permitId: madeHere.permitId, payer };
    held.load("key_1", [revokedHere], held.mark());

    // A lookup marks, then reads the database (which still holds the old state) ...
    const since = held.mark();
    // ... while this process revokes one authorization and makes another ...
    held.revoked("key_1", revokedHere.id);
    held.added(madeHere);
    // ... and then holds what it read.
    const loaded = held.load("key_1", [revokedHere], since);
    expect(loaded.allows(permit, now)).toBe(false);
    expect(loaded.allows(other, now)).toBe(true);
    // A load that started after the changes holds the database's answer as it is.
    const after = held.load("key_1", [madeHere], held.mark());
    expect(after.allows(permit, now)).toBe(false);
    expect(after.allows(other, now)).toBe(true);
    // Changes are forgotten once no load can have started before them.
    ms = 60_000;
    expect(held.load("key_1", [revokedHere], since).allows(permit, now)).toBe(true);
  });
});

describe("key authorities: a change signalled by the database (another process, any writer)", () => {
  it("drops what is held of the key, and does not hold a load that read before the signal", () => {
    const held = createKeyAuthorities({ ttlMs: 60_000, now: () => 0 });
    held.load("key_1", [authorization()], held.mark());
    held.load("key_2", [authorization({ apiKeyId: "key_2" })], held.mark());
    // A lookup of key_1 marks and reads the database, which still holds the authorization ...
    const since = held.mark();
    // ... while another process revokes it: its signal arrives before the read's answer.
    held.invalidate("key_1");
    expect(held.get("key_1")).toBeUndefined();
    expect(held.get("key_2")!.allows(permit, now)).toBe(true);
    // The read's answer serves the request that made it, and is not held.
    expect(held.load("key_1", [authorization()], since).allows(permit, now)).toBe(true);
    expect(held.get("key_1")).toBeUndefined();
    // A read that started after the signal is held.
    held.load("key_1", [], held.mark());
    expect(held.get("key_1")!.allows(permit, now)).toBe(false);
  });

  it("all: drops every key, and holds no load from before", () => {
    const held = createKeyAuthorities({ ttlMs: 60_000, now: () => 0 });
    held.load("key_1", [authorization()], held.mark());
    const since = held.mark();
    held.invalidateAll();
    expect(held.get("key_1")).toBeUndefined();
    held.load("key_2", [], since);
    expect(held.get("key_2")).toBeUndefined();
    held.load("key_2", [], held.mark());
    expect(held.get("key_2")).toBeDefined();
  });
});
