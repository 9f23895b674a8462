import { describe, expect, it } from "vitest";
import { getAddress, type Address } from "viem";
import {
  anyPermit,
  buildAuthorizeKeyTypedData,
  type AuthorizeKeyMessage,
} from "../domain/permit-authorization/index.js";
import {
  ChallengeMismatchError,
  checkTypedData,
  shown,
  takeIssuedAt,
  takeKeyId,
  takeNonce,
} from "./signing-guard.js";

const market = "0x5fbdb2315678afecb367f032d93f642f64180aa3" as Address;
const message: AuthorizeKeyMessage = {
  payer: getAddress("0x9965507d1a55bcc2695c58ba16fb37d819b0a4dc"),
  keyId: "key_0123456789abcdef01234567",
  permitId: `0x${"ab".repeat(32)}`,
  expiresAt: 1_767_225_600,
  issuedAt: 1_766_620_800,
  deployment: "dep_5b2e9c0d4a7f41e6b3c8d2a9f0e1b7c4",
  totalCap: "5000",
  perRequestCap: "0",
  period: "",
  periodCap: "0",
  warnAt: "0",
  nonce: `0x${"cd".repeat(32)}`,
};
const built = () => buildAuthorizeKeyTypedData({ chainId: 31337, market, message });
/** The built typed data as JSON carries it (what a gateway answers). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const asJson = (): any => JSON.parse(JSON.stringify(built()));

function mismatch(run: () => unknown): { field: string; message: string } | undefined {
  try {
    run();
  } catch (error) {
    if (error instanceof ChallengeMismatchError)
      return { field: error.field, message: error.message };
    throw error;
  }
  return undefined;
}

describe("the signing guard's comparison (issue 28, item 1)", () => {
  it("accepts the same typed data however JSON spells its values: hex case, integers as decimal strings", () => {
    const same = asJson();
    same.domain.verifyingContract = getAddress(market);
    same.domain.chainId = "31337";
    same.message.payer = message.payer.toLowerCase();
    same.message.permitId = message.permitId.toUpperCase().replace("0X", "0x");
    same.message.expiresAt = String(message.expiresAt);
    same.message.totalCap = 5000;
    expect(mismatch(() => checkTypedData(built(), same))).toBeUndefined();
  });

  it("names the first field that differs, in the order primary type, types, domain, message", () => {
    const cases: [string, (c: ReturnType<typeof asJson>) => void][] = [
      ["primaryType", (c) => (c.primaryType = "Permit")],
      ["types.AuthorizeKey[0]", (c) => (c.types.AuthorizeKey[0].type = "bytes32")],
      ["types.AuthorizeKey[0]", (c) => (c.types.AuthorizeKey[0].extra = true)],
      ["types.AuthorizeKey[12]", (c) => c.types.AuthorizeKey.push({ name: "x", type: "string" })],
      // A gateway that asks for the AuthorizeKey of before issue 38 (no periodic cap fields).
      ["types.AuthorizeKey[8]", (c) => c.types.AuthorizeKey.splice(8, 2)],
      ["types.EIP712Domain", (c) => delete c.types.EIP712Domain],
      ["domain.name", (c) => (c.domain.name = "Model Market Gateway ")],
      ["domain.salt", (c) => (c.domain.salt = `0x${"00".repeat(32)}`)],
      ["message.permitId", (c) => (c.message.permitId = anyPermit)],
      ["message.expiresAt", (c) => (c.message.expiresAt = 1_767_225_600.5)],
      ["message.expiresAt", (c) => (c.message.expiresAt = "0x695b5a00")],
      ["message.keyId", (c) => (c.message.keyId = "KEY_0123456789abcdef01234567")],
      ["message.nonce", (c) => delete c.message.nonce],
      ["message.period", (c) => (c.message.period = "month")],
      ["message.periodCap", (c) => (c.message.periodCap = "1")],
      ["message.warnAt", (c) => (c.message.warnAt = "1")],
      ["message", (c) => (c.message = [])],
      ["description", (c) => (c.description = "harmless")],
    ];
    for (const [field, change] of cases) {
      const changed = asJson();
      change(changed);
      const got = mismatch(() => checkTypedData(built(), changed));
      expect(got?.field, field).toBe(field);
      expect(got?.message).toMatch(/^the gateway's challenge differs at .*; nothing was signed$/);
    }
    expect(mismatch(() => checkTypedData(built(), null))?.field).toBe("(the whole challenge)");
  });

  it("shows what a gateway sent printable and short: no control characters reach the terminal", () => {
    expect(shown("\u001b[2Jcleared")).toBe('"\\u001b[2Jcleared"');
    expect(shown("é")).toBe('"?"');
    expect(shown("x".repeat(500))).toHaveLength(120);
    expect(shown(undefined)).toBe("nothing");
    expect(shown(2 ** 40)).toBe("1099511627776");
    const c = asJson();
    c.message.deployment = "dep_\nsign here";
    expect(mismatch(() => checkTypedData(built(), c))?.message).toBe(
      `the gateway's challenge differs at message.deployment: expected ${message.deployment}, got "dep_\\nsign here"; nothing was signed`,
    );
  });

  it("takes the nonce, issuedAt (within 300 s of this clock) and the key id (as pinned) by their shape", () => {
    const c = asJson();
    expect(takeNonce(c)).toBe(message.nonce);
    expect(takeIssuedAt(c, message.issuedAt + 300)).toBe(message.issuedAt);
    expect(takeIssuedAt(c, message.issuedAt - 300)).toBe(message.issuedAt);
    expect(mismatch(() => takeIssuedAt(c, message.issuedAt + 301))?.field).toBe("message.issuedAt");
    expect(takeKeyId(c, undefined)).toBe(message.keyId);
    expect(takeKeyId(c, message.keyId)).toBe(message.keyId);
    expect(mismatch(() => takeKeyId(c, "key_other"))?.message).toBe(
      `the gateway's challenge differs at message.keyId: expected key_other, got ${message.keyId}; nothing was signed`,
    );
    c.message.keyId = "key_\u202eevil";
    expect(mismatch(() => takeKeyId(c, undefined))?.field).toBe("message.keyId");
    c.message.nonce = "";
    expect(mismatch(() => takeNonce(c))?.field).toBe("message.nonce");
  });
});
