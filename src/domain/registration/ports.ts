/** The ports registration reads the chain and stores through, and the sealed endpoint. */
import type { Address, Hex } from "viem";
import type { OfferStatus } from "../catalog.js";
import type { EndpointSecret } from "../health-types.js";
import { normalizeHex } from "../hex.js";
import type { RegistrationTypedData } from "./typed-data.js";

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
