import { randomBytes } from "node:crypto";
import { TypedDataEncoder } from "ethers";
import {
  compactSignatureToSignature,
  hashTypedData,
  isAddressEqual,
  keccak256,
  parseCompactSignature,
  parseSignature,
  recoverTypedDataAddress,
  serializeCompactSignature,
  serializeSignature,
  signatureToCompactSignature,
  stringToHex,
  type Address,
  type Hex,
  zeroHash,
} from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { createSealer, generateEncryptionKey } from "../../adapters/crypto/sealer.js";
import { GatewayError, type ErrorCode } from "../errors.js";
import {
  buildTypedData,
  createRegistrationService,
  endpointTokenHash,
  endpointUrlHash,
  openEndpoint,
  parseRegistrationSignature,
  registrationDigest,
  registrationDomainVersion,
  sealEndpoint,
  withoutDomainType,
  type ChainOffer,
  type OfferReader,
  type RegisterRequest,
  type RegistrationServiceDeps,
  type RegistrationTypedData,
} from "./index.js";

const n = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const market: Address = "0x5FbDB2315678afecb367f032d93F642f64180aa3";
const offerId = keccak256(stringToHex("offer:unit"));
const operator = privateKeyToAccount(generatePrivateKey());
const stranger = privateKeyToAccount(generatePrivateKey());

async function expectCode(promise: Promise<unknown>, code: ErrorCode): Promise<GatewayError> {
  const error = await promise.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(error, `expected ${code}`).toBeInstanceOf(GatewayError);
  expect((error as GatewayError).code, (error as GatewayError).message).toBe(code);
  return error as GatewayError;
}

function expectThrowCode(fn: () => unknown, code: ErrorCode): void {
  let error: unknown;
  try {
    fn();
  } catch (err) {
    error = err;
  }
  expect(error).toBeInstanceOf(GatewayError);
  expect((error as GatewayError).code).toBe(code);
}

describe("typed data", () => {
  const td = buildTypedData({
    chainId: 31337,
    market,
    offerId,
    operator: operator.address,
    endpointUrlHash: endpointUrlHash("https://p.example/v1"),
    endpointTokenHash: endpointTokenHash("tok_1"),
    nonce: "n-1",
    expiresAt: 1_800_000_000,
  });

  it("hashes the canonical URL as keccak256 of its UTF-8 bytes", () => {
    expect(endpointUrlHash("https://p.example/ü")).toBe(
      keccak256(stringToHex("https://p.example/ü")),
    );
  });

  it("is version 3 and binds the endpoint token's hash (the zero bytes32 for no token)", () => {
    expect(registrationDomainVersion).toBe("3");
    expect(td.domain.version).toBe("3");
    expect(td.types.RegisterEndpoint).toEqual([
      { name: "offerId", type: "bytes32" },
      { name: "operator", type: "address" },
      { name: "endpointUrlHash", type: "bytes32" },
      { name: "endpointTokenHash", type: "bytes32" },
      { name: "nonce", type: "string" },
      { name: "expiresAt", type: "uint64" },
    ]);
    expect(td.message.endpointTokenHash).toBe(keccak256(stringToHex("tok_1")));
    expect(endpointTokenHash(undefined)).toBe(zeroHash);
    expect(zeroHash).toBe(`0x${"00".repeat(32)}`);
    // The token is in the challenge only as its hash.
    expect(JSON.stringify(td)).not.toContain("tok_1");
  });

  it("is JSON with the EIP712Domain type; the stripped form leaves the original alone", () => {
    expect(JSON.parse(JSON.stringify(td))).toEqual(td);
    expect(Object.keys(td.types)).toEqual(["EIP712Domain", "RegisterEndpoint"]);
    const signable = withoutDomainType(td);
    expect(Object.keys(signable.types)).toEqual(["RegisterEndpoint"]);
    expect(td.types.EIP712Domain).toHaveLength(4);
    expect(signable.message).toEqual(td.message);
  });

  it("has the same digest in viem (with and without EIP712Domain) and ethers", () => {
    const signable = withoutDomainType(td);
    const ethersDigest = TypedDataEncoder.hash(signable.domain, signable.types, signable.message);
    expect(registrationDigest(td)).toBe(ethersDigest);
    // viem accepts the wallet form (with EIP712Domain) too.
    expect(hashTypedData(td as unknown as Parameters<typeof hashTypedData>[0])).toBe(ethersDigest);
  });
});

describe("parseRegistrationSignature", () => {
  const digestTd = buildTypedData({
    chainId: 1,
    market,
    offerId,
    operator: operator.address,
    endpointUrlHash: endpointUrlHash("https://p.example/"),
    endpointTokenHash: endpointTokenHash(undefined),
    nonce: "x",
    expiresAt: 1,
  });

  it("reads 65-byte signatures with v in 27/28 or 0/1 and compact ones", async () => {
    const sig = await operator.signTypedData(withoutDomainType(digestTd));
    expect(parseRegistrationSignature(sig)).toEqual({ full: sig.toLowerCase() });
    const parsed = parseSignature(sig);
    const v01 = `${sig.slice(0, 130)}0${parsed.yParity}`;
    expect(parseRegistrationSignature(v01).full).toBe(sig.toLowerCase());

    const compact = serializeCompactSignature(signatureToCompactSignature(parsed));
    const fromCompact = parseRegistrationSignature(compact);
    expect(fromCompact.compact).toBe(compact.toLowerCase());
    expect(fromCompact.full).toBe(
      serializeSignature(compactSignatureToSignature(parseCompactSignature(compact))).toLowerCase(),
    );
    expect(
      await recoverTypedDataAddress({
        ...withoutDomainType(digestTd),
        signature: fromCompact.full,
      }),
    ).toBe(operator.address);
  });

  it("refuses high-s in both encodings", async () => {
    const sig = parseSignature(await operator.signTypedData(withoutDomainType(digestTd)));
    const highS = (n - BigInt(sig.s)).toString(16).padStart(64, "0");
    expectThrowCode(
      () => parseRegistrationSignature(`${sig.r}${highS}${sig.yParity === 0 ? "1c" : "1b"}`),
      "invalid_signature",
    );
    // Compact form: only s in (n/2, 2^255) fits beside the parity bit; such an s is high too.
    const justHigh = (n / 2n + 1n).toString(16).padStart(64, "0");
    expectThrowCode(() => parseRegistrationSignature(`${sig.r}${justHigh}`), "invalid_signature");
  });

  it("refuses other lengths, bad v, zero or out-of-range r and s", () => {
    const r = "11".repeat(32);
    const s = "22".repeat(32);
    for (const bad of [
      "",
      "0x",
      `0x${r}${s}1b00`,
      `${r}${s}1b`,
      `0x${r}${s}02`,
      `0x${r}${s}1d`,
      `0x${"00".repeat(32)}${s}1b`,
      `0x${r}${"00".repeat(32)}1b`,
      `0x${n.toString(16)}${s}1b`,
      `0x${r}${s}zz`,
    ]) {
      expectThrowCode(() => parseRegistrationSignature(bad), "invalid_signature");
    }
  });
});

describe("sealed endpoints", () => {
  it("round-trip and are bound to their offer", () => {
    const sealer = createSealer(generateEncryptionKey());
    const sealed = sealEndpoint(sealer, offerId, { url: "https://p.example/", token: "t" });
    expect(openEndpoint(sealer, offerId.toUpperCase().replace("0X", "0x") as Hex, sealed)).toEqual({
      url: "https://p.example/",
      token: "t",
    });
    expect(() => openEndpoint(sealer, keccak256(stringToHex("other")), sealed)).toThrow();
    const noToken = sealEndpoint(sealer, offerId, { url: "https://p.example/" });
    expect(openEndpoint(sealer, offerId, noToken)).toEqual({ url: "https://p.example/" });
  });
});

/**
 * The service up to (not including) the database: every refusal happens before the nonce is
 * spent, so a pool that fails the test when used is enough. A stand-in for the chain checks
 * signatures by ECDSA recovery, as viem does for an account.
 */
describe("registration service refusals", () => {
  const clock = { now: 1_800_000_000 };
  const offer: ChainOffer = {
    operator: operator.address,
    modelId: keccak256(stringToHex("m")),
    status: "active",
  };
  const chain = { down: false };
  const offers: OfferReader = {
    async getOffer(id) {
      if (chain.down) throw new Error("connect ECONNREFUSED");
      return id === offerId ? offer : undefined;
    },
    async verifySignature({ address, typedData, signature }) {
      if (chain.down) throw new Error("connect ECONNREFUSED");
      const signer = await recoverTypedDataAddress({
        ...withoutDomainType(typedData),
        signature,
      }).catch(() => undefined);
      return signer !== undefined && isAddressEqual(signer, address);
    },
  };
  const deps: RegistrationServiceDeps = {
    chainId: 31337,
    market,
    offers,
    recordRegistration: () => {
      throw new Error("the database must not be reached");
    },
    sealer: createSealer(generateEncryptionKey()),
    canonicalizeUrl: (s) => {
      try {
        return new URL(s).href;
      } catch {
        throw new GatewayError("invalid_request", `cannot parse ${s}`);
      }
    },
    checkEndpoint: async (url) => {
      if (new URL(url).hostname.startsWith("10.")) throw new Error(`refusing ${url}`);
    },
    clock: () => clock.now,
    challengeSecret: randomBytes(32),
  };
  const service = createRegistrationService(deps);

  const request = async (
    signer: typeof operator,
    extra: { nonce?: string; endpointToken?: string } = {},
    on: typeof service = service,
  ): Promise<{ req: RegisterRequest; td: RegistrationTypedData }> => {
    const endpointUrl = "https://provider.example/v1";
    const td = await on.createChallenge({ offerId, endpointUrl, ...extra });
    const signature = await signer.signTypedData(withoutDomainType(td));
    return {
      td,
      req: {
        offerId,
        endpointUrl,
        nonce: td.message.nonce,
        expiresAt: td.message.expiresAt,
        signature,
        ...(extra.endpointToken === undefined ? {} : { endpointToken: extra.endpointToken }),
      },
    };
  };

  describe("the endpoint token", () => {
    // A service whose store records what it was asked to store (and consumes nonces once).
    const stored: { nonce: string; sealed: Buffer }[] = [];
    const recording = createRegistrationService({
      ...deps,
      recordRegistration: async (nonce, registration) => {
        if (stored.some((s) => s.nonce === nonce.nonce)) return "nonce_used";
        stored.push({ nonce: nonce.nonce, sealed: registration.endpointSealed });
        return "registered";
      },
    });

    it("enters the challenge as its hash only", async () => {
      const { td } = await request(operator, { endpointToken: "tok_right" }, recording);
      expect(td.message.endpointTokenHash).toBe(keccak256(stringToHex("tok_right")));
      expect(JSON.stringify(td)).not.toContain("tok_right");
      const none = await request(operator, {}, recording);
      expect(none.td.message.endpointTokenHash).toBe(zeroHash);
      // An empty token is no token, as at registration.
      const empty = await request(operator, { endpointToken: "" }, recording);
      expect(empty.td.message.endpointTokenHash).toBe(zeroHash);
      await expectCode(
        recording.createChallenge({
          offerId,
          endpointUrl: "https://provider.example/v1",
          endpointToken: "has space",
        }),
        "invalid_request",
      );
    });

    it("refuses a signed payload replayed with another token, or with none, as invalid_signature", async () => {
      const { req } = await request(operator, { endpointToken: "tok_right" }, recording);
      const before = stored.length;
      await expectCode(
        recording.register({ ...req, endpointToken: "tok_attacker" }),
        "invalid_signature",
      );
      const { endpointToken: _, ...withoutToken } = req;
      await expectCode(recording.register(withoutToken), "invalid_signature");
      // A challenge made without a token does not register one either.
      const bare = await request(operator, {}, recording);
      await expectCode(
        recording.register({ ...bare.req, endpointToken: "tok_attacker" }),
        "invalid_signature",
      );
      expect(stored).toHaveLength(before);

      // The refusals spent nothing: the legitimate registration still succeeds, with its token.
      await expect(recording.register(req)).resolves.toBe(offerId);
      expect(stored).toHaveLength(before + 1);
      expect(openEndpoint(deps.sealer, offerId, stored.at(-1)!.sealed)).toEqual({
        url: "https://provider.example/v1",
        token: "tok_right",
      });
      await expect(recording.register(bare.req)).resolves.toBe(offerId);
      expect(openEndpoint(deps.sealer, offerId, stored.at(-1)!.sealed)).toEqual({
        url: "https://provider.example/v1",
      });
    });

    it("refuses a token swap under a caller-chosen nonce too (reported as the wrong signer)", async () => {
      const { req } = await request(
        operator,
        { nonce: "provider-chosen-token", endpointToken: "tok_right" },
        recording,
      );
      // Without a gateway nonce the altered field cannot be told from a wrong signer.
      await expectCode(
        recording.register({ ...req, endpointToken: "tok_attacker" }),
        "not_offer_operator",
      );
      await expect(recording.register(req)).resolves.toBe(offerId);
    });
  });

  it("issues self-authenticating Hex32 nonces that differ each time", async () => {
    const a = await request(operator);
    const b = await request(operator);
    expect(a.td.message.nonce).toMatch(/^0x[0-9a-f]{64}$/);
    expect(a.td.message.nonce).not.toBe(b.td.message.nonce);
  });

  it("classifies a wrong signer over the issued fields as not_offer_operator", async () => {
    const { req } = await request(stranger);
    const err = await expectCode(service.register(req), "not_offer_operator");
    expect(err.message).toContain(stranger.address);
  });

  it("classifies altered fields as invalid_signature", async () => {
    const { req } = await request(operator);
    await expectCode(
      service.register({ ...req, endpointUrl: "https://other.example/v1" }),
      "invalid_signature",
    );
    await expectCode(service.register({ ...req, expiresAt: clock.now + 100 }), "invalid_signature");
    const otherNonce = `0x${"ab".repeat(32)}`;
    await expectCode(service.register({ ...req, nonce: otherNonce }), "invalid_signature");
    // Even a wrong signer is reported as tampering when the fields are not the issued ones.
    const wrong = await request(stranger);
    await expectCode(
      service.register({ ...wrong.req, endpointUrl: "https://other.example/v1" }),
      "invalid_signature",
    );
  });

  it("does not trust nonces issued under another challenge secret", async () => {
    const { req } = await request(stranger);
    const other = createRegistrationService({ ...deps, challengeSecret: randomBytes(32) });
    await expectCode(other.register(req), "invalid_signature");
  });

  it("treats caller-chosen nonces by their shape", async () => {
    // Not Hex32: the fields cannot be authenticated, so the wrong signer is what is reported.
    const own = await request(stranger, { nonce: "provider-chosen-1" });
    await expectCode(service.register(own.req), "not_offer_operator");
    // Hex32-shaped but not the gateway's: indistinguishable from a tampered gateway nonce.
    const hexOwn = await request(stranger, { nonce: `0x${"cd".repeat(32)}` });
    await expectCode(service.register(hexOwn.req), "invalid_signature");
  });

  it("maps chain failures to chain_unavailable and unknown offers to offer_not_found", async () => {
    const { req } = await request(operator);
    await expectCode(
      service.register({ ...req, offerId: keccak256(stringToHex("nope")) }),
      "offer_not_found",
    );
    chain.down = true;
    try {
      const err = await expectCode(service.register(req), "chain_unavailable");
      expect(err.cause).toBeInstanceOf(Error);
      await expectCode(
        service.createChallenge({ offerId, endpointUrl: "https://p.example/" }),
        "chain_unavailable",
      );
    } finally {
      chain.down = false;
    }
  });

  it("keeps the URL and token out of errors raised by the URL checks", async () => {
    const { req } = await request(operator);
    const secretUrl = "http://10.1.2.3:9000/secret-path";
    const err = await expectCode(
      service.register({ ...req, endpointUrl: secretUrl, endpointToken: "tok_secret" }),
      "endpoint_not_allowed",
    );
    expect(err.message).not.toContain("10.1.2.3");
    expect(err.cause).toBeUndefined();
    const bad = await expectCode(
      service.register({ ...req, endpointUrl: "nota url tok_secret" }),
      "invalid_request",
    );
    expect(bad.message).not.toContain("tok_secret");
    expect(bad.message).not.toContain("nota url");
  });

  it("checks expiry against the clock at registration", async () => {
    const { req } = await request(operator);
    clock.now += 601;
    try {
      await expectCode(service.register(req), "challenge_expiry_invalid");
    } finally {
      clock.now -= 601;
    }
    await expectCode(
      service.register({ ...req, expiresAt: clock.now + 901 }),
      "challenge_expiry_invalid",
    );
  });

  it("accepts expiresAt as a number, a bigint or a decimal string", async () => {
    const { req } = await request(stranger);
    for (const expiresAt of [req.expiresAt, BigInt(req.expiresAt), String(req.expiresAt)]) {
      // Same fields each time: the refusal is about the signer, so the value was understood.
      await expectCode(service.register({ ...req, expiresAt }), "not_offer_operator");
    }
    for (const expiresAt of ["1e9", "0x10", "", "12.5", Number.NaN]) {
      await expectCode(service.register({ ...req, expiresAt }), "invalid_request");
    }
  });

  it("refuses a malformed signature before asking the chain", async () => {
    const { req } = await request(operator);
    chain.down = true;
    try {
      await expectCode(service.register({ ...req, signature: "0xdead" }), "invalid_signature");
    } finally {
      chain.down = false;
    }
  });
});
