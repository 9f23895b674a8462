import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import {
  hashTypedData,
  keccak256,
  zeroHash,
  recoverTypedDataAddress,
  stringToBytes,
  type Address,
  type Hex,
} from "viem";
import type { OfferStatus } from "./catalog.js";
import { GatewayError, type ErrorCode } from "./errors.js";
import type { EndpointSecret } from "./health.js";
import { isHex32, normalizeHex } from "./hex.js";
import {
  verifyParsedSignature,
  type ParsedSignature,
  type SignatureVerifier,
  type TypedDataField,
} from "./signatures.js";
import { endpointTokenPattern, noncePattern } from "../schema/signing.js";

export type { ParsedSignature, TypedDataField } from "./signatures.js";

// ------------------------------------------------------------------------------ typed data

/** EIP-712 domain name and version of registration challenges (DESIGN.md section 4). */
export const registrationDomainName = "Model Market Gateway";
/**
 * "3" since the typed data binds the endpoint token's hash (DESIGN.md section 8, "The signature
 * covers what it enables"); a version-"2" signature, which did not, is worthless here.
 */
export const registrationDomainVersion = "3";

/** A challenge may expire at most this far ahead (spec: 15 minutes). */
export const maxChallengeLifetimeSeconds = 900;
/** Lifetime of a challenge whose request names no `expiresAt`. */
export const defaultChallengeLifetimeSeconds = 600;

/** The `EIP712Domain` type list, which `eth_signTypedData_v4` expects in `types`. */
export const eip712DomainFields: TypedDataField[] = [
  { name: "name", type: "string" },
  { name: "version", type: "string" },
  { name: "chainId", type: "uint256" },
  { name: "verifyingContract", type: "address" },
];

export const registerEndpointFields: TypedDataField[] = [
  { name: "offerId", type: "bytes32" },
  { name: "operator", type: "address" },
  { name: "endpointUrlHash", type: "bytes32" },
  { name: "endpointTokenHash", type: "bytes32" },
  { name: "nonce", type: "string" },
  { name: "expiresAt", type: "uint64" },
];

export interface RegistrationDomain {
  name: string;
  version: string;
  chainId: number;
  verifyingContract: Address;
}

export type RegisterEndpointMessage = {
  offerId: Hex;
  operator: Address;
  endpointUrlHash: Hex;
  /** {@link endpointTokenHash} of the bearer the registration will present. */
  endpointTokenHash: Hex;
  nonce: string;
  /** Unix seconds. A JSON number: wallets read uint64 from numbers, and it is far below 2^53. */
  expiresAt: number;
};

/**
 * A registration challenge as JSON a wallet signs unchanged (`eth_signTypedData_v4` wants the
 * `EIP712Domain` type listed). For viem's and ethers' `signTypedData`, which derive the domain
 * type themselves (ethers refuses an extra `EIP712Domain`), use {@link withoutDomainType}.
 */
export interface RegistrationTypedData {
  types: { EIP712Domain: TypedDataField[]; RegisterEndpoint: TypedDataField[] };
  primaryType: "RegisterEndpoint";
  domain: RegistrationDomain;
  message: RegisterEndpointMessage;
}

/** {@link RegistrationTypedData} without `EIP712Domain`: what viem and ethers sign. */
export interface SignableRegistrationTypedData {
  types: { RegisterEndpoint: TypedDataField[] };
  primaryType: "RegisterEndpoint";
  domain: RegistrationDomain;
  message: RegisterEndpointMessage;
}

/** `keccak256(utf8(canonicalUrl))`: the challenge binds the URL without showing it. */
export function endpointUrlHash(canonicalUrl: string): Hex {
  return keccak256(stringToBytes(canonicalUrl));
}

/**
 * What the typed data binds of the endpoint token: `keccak256(utf8(token))`, or the zero
 * bytes32 when the registration presents no token. Zero cannot be a token's hash (that would be
 * a keccak256 preimage of zero), so "no token" and every token are told apart. Only the hash is
 * in the challenge: the token itself is never returned, stored with a challenge or logged. A
 * signature therefore enables exactly one token: a copied signed payload presented with another
 * token (or none) is a signature over other fields, refused `invalid_signature`.
 */
export function endpointTokenHash(token: string | undefined): Hex {
  return token === undefined ? zeroHash : keccak256(stringToBytes(token));
}

/**
 * The challenge for one registration. The domain is always the gateway's own (chain id and
 * market), never taken from a request, so a signature made for another chain or market is
 * worthless here.
 */
export function buildTypedData(args: {
  chainId: number;
  market: Address;
  offerId: Hex;
  operator: Address;
  endpointUrlHash: Hex;
  endpointTokenHash: Hex;
  nonce: string;
  expiresAt: number;
}): RegistrationTypedData {
  return {
    types: {
      EIP712Domain: eip712DomainFields.map((f) => ({ ...f })),
      RegisterEndpoint: registerEndpointFields.map((f) => ({ ...f })),
    },
    primaryType: "RegisterEndpoint",
    domain: {
      name: registrationDomainName,
      version: registrationDomainVersion,
      chainId: args.chainId,
      verifyingContract: args.market,
    },
    message: {
      offerId: args.offerId,
      operator: args.operator,
      endpointUrlHash: args.endpointUrlHash,
      endpointTokenHash: args.endpointTokenHash,
      nonce: args.nonce,
      expiresAt: args.expiresAt,
    },
  };
}

/** The same challenge without the `EIP712Domain` type, for viem's and ethers' `signTypedData`. */
export function withoutDomainType(
  typedData: RegistrationTypedData | SignableRegistrationTypedData,
): SignableRegistrationTypedData {
  return {
    types: { RegisterEndpoint: typedData.types.RegisterEndpoint.map((f) => ({ ...f })) },
    primaryType: typedData.primaryType,
    domain: { ...typedData.domain },
    message: { ...typedData.message },
  };
}

/** The EIP-712 digest a signature over the challenge signs. */
export function registrationDigest(
  typedData: RegistrationTypedData | SignableRegistrationTypedData,
): Hex {
  return hashTypedData(withoutDomainType(typedData));
}

// ------------------------------------------------------------------------------ signatures

/** secp256k1's group order n, and n / 2: a canonical ECDSA signature has s <= n / 2. */
const secp256k1N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const secp256k1HalfN = secp256k1N / 2n;

/**
 * Reads a registration signature: 0x-hex of 65 bytes (`r | s | v`, v in {0, 1, 27, 28}) or
 * 64 bytes (EIP-2098 `r | yParityAndS`). Refuses a non-canonical (high-s) signature: its
 * twin `(r, n - s)` is equally valid, so accepting both would let anyone mint a second
 * signature for the same challenge. Throws `invalid_signature`.
 */
export function parseRegistrationSignature(signature: string): ParsedSignature {
  if (!/^0x(?:[0-9a-fA-F]{128}|[0-9a-fA-F]{130})$/.test(signature)) {
    throw new GatewayError(
      "invalid_signature",
      "signature must be 0x-hex of 65 bytes, or 64 bytes (EIP-2098 compact)",
    );
  }
  const r = BigInt(`0x${signature.slice(2, 66)}`);
  const word = BigInt(`0x${signature.slice(66, 130)}`);
  let s: bigint;
  let yParity: number;
  let compact: Hex | undefined;
  if (signature.length === 132) {
    s = word;
    const v = Number.parseInt(signature.slice(130, 132), 16);
    if (v === 0 || v === 1) yParity = v;
    else if (v === 27 || v === 28) yParity = v - 27;
    else throw new GatewayError("invalid_signature", "signature has an invalid recovery byte v");
  } else {
    yParity = Number(word >> 255n);
    s = word & ((1n << 255n) - 1n);
    compact = normalizeHex(signature);
  }
  if (r === 0n || r >= secp256k1N || s === 0n || s >= secp256k1N) {
    throw new GatewayError("invalid_signature", "signature is not a valid ECDSA signature");
  }
  if (s > secp256k1HalfN) {
    throw new GatewayError(
      "invalid_signature",
      "signature is not canonical (high s); sign again with a library that produces low-s signatures",
    );
  }
  const full = `0x${hex32(r)}${hex32(s)}${(27 + yParity).toString(16)}` as Hex;
  return compact === undefined ? { full } : { full, compact };
}

function hex32(value: bigint): string {
  return value.toString(16).padStart(64, "0");
}

// ------------------------------------------------------------------------------ challenge nonces

// v2: the MAC also covers the endpoint token's hash (typed data version "3").
const nonceMacLabel = Buffer.from("model-market-gateway/register-endpoint-nonce/v2", "utf8");
const gatewayNonceShape = /^0x[0-9a-fA-F]{64}$/;

/**
 * The MAC half of a gateway nonce: HMAC-SHA256 over the chain, the market and the challenge
 * fields (the endpoint token's hash among them, so a token swapped after the challenge reads as
 * altered fields, 401, not as a wrong signer), truncated to 16 bytes. The operator is left out on purpose: when the chain's
 * operator changes between challenge and registration, a signature by the former operator
 * is a wrong signer (403), not tampering.
 */
function nonceMac(
  secret: Buffer,
  f: {
    chainId: number;
    market: Address;
    offerId: Hex;
    urlHash: Hex;
    tokenHash: Hex;
    expiresAt: number;
  },
  random: Buffer,
): Buffer {
  const expires = Buffer.alloc(8);
  expires.writeBigUInt64BE(BigInt(f.expiresAt));
  const chainId = Buffer.alloc(8);
  chainId.writeBigUInt64BE(BigInt(f.chainId));
  return createHmac("sha256", secret)
    .update(nonceMacLabel)
    .update(chainId)
    .update(Buffer.from(f.market.slice(2), "hex"))
    .update(Buffer.from(f.offerId.slice(2), "hex"))
    .update(Buffer.from(f.urlHash.slice(2), "hex"))
    .update(Buffer.from(f.tokenHash.slice(2), "hex"))
    .update(expires)
    .update(random)
    .digest()
    .subarray(0, 16);
}

// ------------------------------------------------------------------------------ ports

/** An offer as the chain states it now. */
export interface ChainOffer {
  operator: Address;
  modelId: Hex;
  status: OfferStatus;
}

/**
 * Live reads of the market (implemented on a viem PublicClient in adapters/chain/offers.ts).
 * Both methods throw when the chain cannot be asked; the service reports that as
 * `chain_unavailable`.
 */
export interface OfferReader {
  /** The offer, or undefined when the market has no such offer. */
  getOffer(offerId: Hex): Promise<ChainOffer | undefined>;
  /** Whether `address` signed `typedData`: ECDSA for an account, ERC-1271 for a contract. */
  verifySignature(args: {
    address: Address;
    typedData: RegistrationTypedData;
    signature: Hex;
  }): Promise<boolean>;
}

// ------------------------------------------------------------------------------ sealed endpoint

/**
 * Seals `{url, token}` for `provider_endpoints.endpoint_sealed`. The offer id is bound as
 * additional authenticated data, so a sealed value copied to another offer's row does not open.
 */
export function sealEndpoint(sealer: Sealer, offerId: Hex, endpoint: EndpointSecret): Buffer {
  const plain = JSON.stringify(
    endpoint.token === undefined
      ? { url: endpoint.url }
      : { url: endpoint.url, token: endpoint.token },
  );
  return sealer.seal(plain, normalizeHex(offerId));
}

/** Opens what {@link sealEndpoint} sealed for `offerId`; throws when the key or row is wrong. */
export function openEndpoint(sealer: Sealer, offerId: Hex, sealed: Buffer): EndpointSecret {
  const value = JSON.parse(sealer.open(sealed, normalizeHex(offerId)).toString("utf8")) as {
    url?: unknown;
    token?: unknown;
  };
  if (typeof value.url !== "string") throw new Error("sealed endpoint has no url");
  return typeof value.token === "string"
    ? { url: value.url, token: value.token }
    : { url: value.url };
}

// ------------------------------------------------------------------------------ storage ports

/** Authenticated encryption (AES-256-GCM in adapters/crypto/sealer.ts). */
export interface Sealer {
  seal(plain: Buffer | string, aad?: Buffer | string): Buffer;
  open(sealed: Buffer, aad?: Buffer | string): Buffer;
}

export interface NonceUse {
  readonly nonce: string;
  /** Lower-case Hex32. */
  readonly offerId: Hex;
  /** Lower-case address of the operator whose signature the nonce carried. */
  readonly operator: Hex;
  /** Unix seconds: when the challenge that carried the nonce expired. */
  readonly expiresAt: number;
}

export interface EndpointRegistration {
  readonly offerId: Hex;
  readonly operator: Hex;
  /** The sealed `{url, token}` (see `sealEndpoint` in domain/registration.ts). */
  readonly endpointSealed: Buffer;
  /** Unix seconds. */
  readonly registeredAt: number;
}

export type RegistrationOutcome = "registered" | "nonce_used" | "offer_not_indexed";

/**
 * Consumes the nonce and stores the endpoint in one transaction (adapters/pg/registrations.ts):
 * of two registrations racing on one nonce exactly one ends `registered`.
 */
export type RecordRegistration = (
  nonce: NonceUse,
  registration: EndpointRegistration,
) => Promise<RegistrationOutcome>;

// ------------------------------------------------------------------------------ service

export interface RegistrationServiceDeps {
  chainId: number;
  /** The market contract: the typed data's `verifyingContract`. */
  market: Address;
  offers: OfferReader;
  recordRegistration: RecordRegistration;
  sealer: Sealer;
  /** Returns the canonical form of an endpoint URL; throws GatewayError `invalid_request`. */
  canonicalizeUrl: (url: string) => string;
  /** Refuses endpoints the gateway must not call; throws GatewayError `endpoint_not_allowed`. */
  checkEndpoint: (canonicalUrl: string) => Promise<void>;
  /** Unix seconds. */
  clock: () => number;
  /** Key of the challenge nonces' MAC (see {@link createRegistrationService}); 32 random bytes fit. */
  challengeSecret: Buffer;
}

export interface ChallengeRequest {
  offerId: string;
  endpointUrl: string;
  /** Absent (or empty): the gateway makes one. Else 1 to 128 printable ASCII characters. */
  nonce?: string;
  /** Unix seconds; absent: now + 10 minutes. */
  expiresAt?: number | bigint | string;
  /**
   * The bearer the registration will present (absent or empty: none). Only its hash enters the
   * typed data; the token is neither kept nor returned.
   */
  endpointToken?: string;
}

export interface RegisterRequest {
  offerId: string;
  endpointUrl: string;
  nonce: string;
  expiresAt: number | bigint | string;
  /** 0x-hex, 65 bytes or 64 bytes (EIP-2098). */
  signature: string;
  /** The bearer the gateway presents to the endpoint. Absent or empty: none. */
  endpointToken?: string;
}

export interface RegistrationService {
  /** The typed data the offer's operator signs to register `endpointUrl`. */
  createChallenge(req: ChallengeRequest): Promise<RegistrationTypedData>;
  /** Verifies a signed challenge and stores the endpoint; returns the (lower-case) offer id. */
  register(req: RegisterRequest): Promise<Hex>;
}

/**
 * Provider registration: issues EIP-712 challenges and completes them.
 *
 * How a failed signature is classified. A signature over altered fields recovers to some
 * random address, which looks exactly like a signature by the wrong key over the right fields;
 * recovery alone cannot tell "tampered" (401 `invalid_signature`) from "wrong signer" (403
 * `not_offer_operator`). The gateway therefore makes its default nonces self-authenticating,
 * without storing anything: `nonce = 0x || random(16) || HMAC(challengeSecret, chainId, market,
 * offerId, endpointUrlHash, endpointTokenHash, expiresAt, random)[0..16]` (lower-case hex, 64 digits, so still a
 * Hex32). At registration the signature is verified first (a valid one always registers,
 * whatever its nonce); when verification against the chain's operator fails:
 *
 * 1. the signature is malformed, high-s or unrecoverable: `invalid_signature`;
 * 2. the nonce is Hex32-shaped but is not exactly a gateway nonce whose MAC matches the
 *    submitted offerId, endpoint URL hash, endpoint token hash and expiresAt:
 *    `invalid_signature` (the fields, the token or the nonce differ from what the gateway
 *    issued: a signed payload replayed with another endpoint token ends here);
 * 3. otherwise, `not_offer_operator`: either the MAC proves the fields are the ones issued, so
 *    the signer is wrong; or the nonce was chosen by the caller (not Hex32-shaped) and the
 *    signature, which is well formed, is not the operator's. For caller-chosen nonces the two
 *    causes cannot be told apart, and the signer is what the gateway can speak about.
 *
 * Contract operators follow the same rule: their ERC-1271 refusal is a wrong signer unless
 * step 2 says the fields were altered. A caller-chosen Hex32 nonce falls under step 2.
 */
export function createRegistrationService(deps: RegistrationServiceDeps): RegistrationService {
  if (deps.challengeSecret.length < 16) {
    throw new Error("challengeSecret must be at least 16 bytes");
  }
  const now = (): number => Math.floor(deps.clock());
  const macFields = (offerId: Hex, urlHash: Hex, tokenHash: Hex, expiresAt: number) => ({
    chainId: deps.chainId,
    market: deps.market,
    offerId,
    urlHash,
    tokenHash,
    expiresAt,
  });

  const readOffer = async (offerId: Hex): Promise<ChainOffer> => {
    let offer: ChainOffer | undefined;
    try {
      offer = await deps.offers.getOffer(offerId);
    } catch (err) {
      throw chainError(err);
    }
    if (!offer) {
      throw new GatewayError("offer_not_found", `offer ${offerId} does not exist on chain`);
    }
    return offer;
  };

  const canonicalEndpoint = (url: string, secrets: string[]): string => {
    try {
      return deps.canonicalizeUrl(url);
    } catch (err) {
      throw scrubbed(err, "invalid_request", "endpointUrl is not a valid endpoint URL", secrets);
    }
  };

  return {
    async createChallenge(req) {
      const offerId = readOfferId(req.offerId);
      const rawUrl = readEndpointUrl(req.endpointUrl);
      const givenNonce =
        req.nonce === undefined || req.nonce === "" ? undefined : readNonce(req.nonce);
      const t = now();
      const expiresAt =
        req.expiresAt === undefined || req.expiresAt === null
          ? t + defaultChallengeLifetimeSeconds
          : readExpiresAt(req.expiresAt);
      checkExpiry(expiresAt, t);
      // Read (and validated as registration will) only to hash; it goes nowhere else.
      const token = readEndpointToken(req.endpointToken);
      const canonical = canonicalEndpoint(rawUrl, token === undefined ? [rawUrl] : [rawUrl, token]);
      const urlHash = endpointUrlHash(canonical);
      const tokenHash = endpointTokenHash(token);
      const offer = await readOffer(offerId);
      let nonce = givenNonce;
      if (nonce === undefined) {
        const random = randomBytes(16);
        const mac = nonceMac(
          deps.challengeSecret,
          macFields(offerId, urlHash, tokenHash, expiresAt),
          random,
        );
        nonce = `0x${random.toString("hex")}${mac.toString("hex")}`;
      }
      return buildTypedData({
        chainId: deps.chainId,
        market: deps.market,
        offerId,
        operator: offer.operator,
        endpointUrlHash: urlHash,
        endpointTokenHash: tokenHash,
        nonce,
        expiresAt,
      });
    },

    async register(req) {
      const offerId = readOfferId(req.offerId);
      const rawUrl = readEndpointUrl(req.endpointUrl);
      if (req.nonce === undefined || req.nonce === null) {
        throw new GatewayError("invalid_request", "nonce is required");
      }
      const nonce = readNonce(req.nonce);
      if (req.expiresAt === undefined || req.expiresAt === null) {
        throw new GatewayError("invalid_request", "expiresAt is required");
      }
      const expiresAt = readExpiresAt(req.expiresAt);
      if (typeof req.signature !== "string" || req.signature === "") {
        throw new GatewayError("invalid_request", "signature is required");
      }
      const token = readEndpointToken(req.endpointToken);
      const secrets = token === undefined ? [rawUrl] : [rawUrl, token];
      const canonical = canonicalEndpoint(rawUrl, secrets);
      secrets.push(canonical);
      try {
        await deps.checkEndpoint(canonical);
      } catch (err) {
        throw scrubbed(err, "endpoint_not_allowed", "endpoint is not allowed", secrets);
      }
      const t = now();
      checkExpiry(expiresAt, t);
      const signature = parseRegistrationSignature(req.signature);

      const offer = await readOffer(offerId);
      const urlHash = endpointUrlHash(canonical);
      const tokenHash = endpointTokenHash(token);
      const typedData = buildTypedData({
        chainId: deps.chainId,
        market: deps.market,
        offerId,
        operator: offer.operator,
        endpointUrlHash: urlHash,
        endpointTokenHash: tokenHash,
        nonce,
        expiresAt,
      });

      let recovered: Address;
      try {
        recovered = await recoverTypedDataAddress({
          ...withoutDomainType(typedData),
          signature: signature.full,
        });
      } catch {
        throw new GatewayError("invalid_signature", "signature does not recover to any address");
      }
      if (!(await verify(deps.offers, offer.operator, typedData, signature))) {
        throw classifyFailure({
          nonce,
          authentic: () =>
            isAuthenticNonce(nonce, macFields(offerId, urlHash, tokenHash, expiresAt)),
          operator: offer.operator,
          recovered,
        });
      }

      const operator = normalizeHex(offer.operator);
      const endpointSealed = sealEndpoint(deps.sealer, offerId, { url: canonical, token });
      let outcome: RegistrationOutcome;
      try {
        outcome = await deps.recordRegistration(
          { nonce, offerId, operator, expiresAt },
          { offerId, operator, endpointSealed, registeredAt: t },
        );
      } catch (err) {
        throw new GatewayError("database_unavailable", "the registration could not be stored", {
          cause: err,
        });
      }
      if (outcome === "nonce_used") {
        throw new GatewayError("nonce_used", "this challenge nonce has already been used");
      }
      if (outcome === "offer_not_indexed") {
        throw new GatewayError(
          "offer_not_found",
          `offer ${offerId} is on chain but not indexed by the gateway yet; retry shortly`,
        );
      }
      return offerId;
    },
  };

  function isAuthenticNonce(nonce: string, fields: ReturnType<typeof macFields>): boolean {
    if (!/^0x[0-9a-f]{64}$/.test(nonce)) return false;
    const random = Buffer.from(nonce.slice(2, 34), "hex");
    const mac = Buffer.from(nonce.slice(34), "hex");
    return timingSafeEqual(mac, nonceMac(deps.challengeSecret, fields, random));
  }
}

/** Verifies against the operator, with the shared rule for compact signatures (signatures.ts). */
async function verify(
  offers: OfferReader,
  operator: Address,
  typedData: RegistrationTypedData,
  signature: ParsedSignature,
): Promise<boolean> {
  const verifier: SignatureVerifier = {
    verifyTypedData: (args) =>
      offers.verifySignature({ address: args.address, typedData, signature: args.signature }),
  };
  try {
    return await verifyParsedSignature(verifier, operator, withoutDomainType(typedData), signature);
  } catch (err) {
    throw chainError(err);
  }
}

function classifyFailure(f: {
  nonce: string;
  authentic: () => boolean;
  operator: Address;
  recovered: Address;
}): GatewayError {
  if (gatewayNonceShape.test(f.nonce)) {
    if (!f.authentic()) {
      return new GatewayError(
        "invalid_signature",
        "signature does not match the challenge fields (offerId, endpointUrl, endpointToken, nonce, expiresAt)",
      );
    }
    return new GatewayError(
      "not_offer_operator",
      `challenge was signed by ${f.recovered}, not by the offer's operator ${f.operator}`,
    );
  }
  return new GatewayError(
    "not_offer_operator",
    `signature is not from the offer's operator ${f.operator}`,
  );
}

function chainError(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  return new GatewayError("chain_unavailable", "the chain could not be read", { cause: err });
}

/**
 * Re-raises a failure of the lead-supplied URL checks with a message that cannot carry the
 * endpoint URL or token, and without its cause (which may name the host): both reach clients
 * or logs.
 */
function scrubbed(
  err: unknown,
  code: ErrorCode,
  fallback: string,
  secrets: string[],
): GatewayError {
  const hosts = secrets.flatMap((s) => {
    try {
      const host = new URL(s).hostname;
      return host === "" ? [] : [host];
    } catch {
      return [];
    }
  });
  const leaks = [...secrets, ...hosts].filter((s) => s.length > 0);
  if (err instanceof GatewayError) {
    const message = leaks.some((s) => err.message.includes(s)) ? fallback : err.message;
    return new GatewayError(err.code, message);
  }
  return new GatewayError(code, fallback);
}

function readOfferId(value: unknown): Hex {
  if (typeof value !== "string" || value === "") {
    throw new GatewayError("invalid_request", "offerId is required");
  }
  if (!isHex32(value)) {
    throw new GatewayError("invalid_hex", "offerId must be a Hex32 (0x + 64 hex digits)");
  }
  return normalizeHex(value);
}

function readEndpointUrl(value: unknown): string {
  if (typeof value !== "string" || value.trim() === "") {
    throw new GatewayError("invalid_request", "endpointUrl is required");
  }
  if (value.length > 2048) throw new GatewayError("invalid_request", "endpointUrl is too long");
  return value;
}

function readNonce(value: unknown): string {
  if (typeof value !== "string" || !noncePattern.test(value)) {
    throw new GatewayError("invalid_request", "nonce must be 1 to 128 printable ASCII characters");
  }
  return value;
}

function readEndpointToken(value: unknown): string | undefined {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string" || !endpointTokenPattern.test(value)) {
    throw new GatewayError(
      "invalid_request",
      "endpointToken must be 1 to 4096 visible ASCII characters (no spaces or control characters)",
    );
  }
  return value;
}

/** Unix seconds as a number, a bigint (protobuf int64) or a decimal string. */
function readExpiresAt(value: unknown): number {
  let n = Number.NaN;
  if (typeof value === "number") n = value;
  else if (typeof value === "bigint") n = Number(value);
  else if (typeof value === "string" && /^-?\d{1,16}$/.test(value)) n = Number(value);
  if (!Number.isSafeInteger(n)) {
    throw new GatewayError("invalid_request", "expiresAt must be an integer (Unix seconds)");
  }
  return n;
}

function checkExpiry(expiresAt: number, now: number): void {
  if (expiresAt <= now) {
    throw new GatewayError("challenge_expiry_invalid", "expiresAt is in the past");
  }
  if (expiresAt > now + maxChallengeLifetimeSeconds) {
    throw new GatewayError(
      "challenge_expiry_invalid",
      `expiresAt must be at most ${maxChallengeLifetimeSeconds} seconds ahead`,
    );
  }
}
