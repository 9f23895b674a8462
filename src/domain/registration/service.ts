/** Provider registration: the service that issues registration challenges and completes them. */
import { recoverTypedDataAddress, type Address, type Hex } from "viem";
import {
  challengeExpiry,
  readChallengeNonce,
  readChallengeSignature,
} from "../challenge-window.js";
import { GatewayError } from "../errors.js";
import { normalizeHex } from "../hex.js";
import {
  verifyParsedSignature,
  type ParsedSignature,
  type SignatureVerifier,
} from "../signatures.js";
import {
  chainError,
  checkExpiry,
  readEndpointToken,
  readEndpointUrl,
  readExpiresAt,
  readOfferId,
  scrubbed,
} from "./checks.js";
import {
  classifyFailure,
  isAuthenticNonce,
  newGatewayNonce,
  type NonceMacFields,
} from "./nonce.js";
import {
  sealEndpoint,
  type ChainOffer,
  type OfferReader,
  type RecordRegistration,
  type RegistrationOutcome,
  type Sealer,
} from "./ports.js";
import { parseRegistrationSignature } from "./signature.js";
import {
  buildTypedData,
  defaultChallengeLifetimeSeconds,
  endpointTokenHash,
  endpointUrlHash,
  withoutDomainType,
  type RegisterEndpointMessage,
  type RegistrationTypedData,
} from "./typed-data.js";

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
  return {
    createChallenge: (req) => createChallenge(deps, req),
    register: (req) => register(deps, req),
  };
}

/** Unix seconds, whole. */
function nowOf(deps: RegistrationServiceDeps): number {
  return Math.floor(deps.clock());
}

function macFields(
  deps: RegistrationServiceDeps,
  offerId: Hex,
  urlHash: Hex,
  tokenHash: Hex,
  expiresAt: number,
): NonceMacFields {
  return { chainId: deps.chainId, market: deps.market, offerId, urlHash, tokenHash, expiresAt };
}

/** The offer as the chain states it now; 404 `offer_not_found` when there is none. */
async function readOffer(deps: RegistrationServiceDeps, offerId: Hex): Promise<ChainOffer> {
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
}

/** The canonical endpoint URL; a refusal never names the URL or the token (`secrets`). */
function canonicalEndpoint(deps: RegistrationServiceDeps, url: string, secrets: string[]): string {
  try {
    return deps.canonicalizeUrl(url);
  } catch (err) {
    throw scrubbed(err, "invalid_request", "endpointUrl is not a valid endpoint URL", secrets);
  }
}

async function createChallenge(
  deps: RegistrationServiceDeps,
  req: ChallengeRequest,
): Promise<RegistrationTypedData> {
  const offerId = readOfferId(req.offerId);
  const rawUrl = readEndpointUrl(req.endpointUrl);
  const givenNonce =
    req.nonce === undefined || req.nonce === "" ? undefined : readChallengeNonce(req.nonce);
  const t = nowOf(deps);
  const expiresAt = challengeExpiry(
    req.expiresAt ?? undefined,
    t,
    defaultChallengeLifetimeSeconds,
    readExpiresAt,
  );
  checkExpiry(expiresAt, t);
  // Read (and validated as registration will) only to hash; it goes nowhere else.
  const token = readEndpointToken(req.endpointToken);
  const canonical = canonicalEndpoint(
    deps,
    rawUrl,
    token === undefined ? [rawUrl] : [rawUrl, token],
  );
  const urlHash = endpointUrlHash(canonical);
  const tokenHash = endpointTokenHash(token);
  const offer = await readOffer(deps, offerId);
  const nonce =
    givenNonce ??
    newGatewayNonce(deps.challengeSecret, macFields(deps, offerId, urlHash, tokenHash, expiresAt));
  return registrationTypedData(deps, {
    offerId,
    operator: offer.operator,
    endpointUrlHash: urlHash,
    endpointTokenHash: tokenHash,
    nonce,
    expiresAt,
  });
}

/** The typed data an operator signs to register an endpoint on an offer, on this market. */
function registrationTypedData(
  deps: RegistrationServiceDeps,
  message: RegisterEndpointMessage,
): RegistrationTypedData {
  return buildTypedData({ chainId: deps.chainId, market: deps.market, ...message });
}

async function register(deps: RegistrationServiceDeps, req: RegisterRequest): Promise<Hex> {
  const offerId = readOfferId(req.offerId);
  const rawUrl = readEndpointUrl(req.endpointUrl);
  if (req.nonce === undefined || req.nonce === null) {
    throw new GatewayError("invalid_request", "nonce is required");
  }
  const nonce = readChallengeNonce(req.nonce);
  if (req.expiresAt === undefined || req.expiresAt === null) {
    throw new GatewayError("invalid_request", "expiresAt is required");
  }
  const expiresAt = readExpiresAt(req.expiresAt);
  readChallengeSignature(req.signature);
  const token = readEndpointToken(req.endpointToken);
  const secrets = token === undefined ? [rawUrl] : [rawUrl, token];
  const canonical = canonicalEndpoint(deps, rawUrl, secrets);
  secrets.push(canonical);
  try {
    await deps.checkEndpoint(canonical);
  } catch (err) {
    throw scrubbed(err, "endpoint_not_allowed", "endpoint is not allowed", secrets);
  }
  const t = nowOf(deps);
  checkExpiry(expiresAt, t);
  const signature = parseRegistrationSignature(req.signature);

  const offer = await readOffer(deps, offerId);
  const urlHash = endpointUrlHash(canonical);
  const tokenHash = endpointTokenHash(token);
  const typedData = registrationTypedData(deps, {
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
        isAuthenticNonce(
          deps.challengeSecret,
          nonce,
          macFields(deps, offerId, urlHash, tokenHash, expiresAt),
        ),
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
