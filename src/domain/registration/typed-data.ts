/** The typed data an offer's operator signs to register an endpoint (DESIGN.md section 4). */
import { hashTypedData, keccak256, zeroHash, stringToBytes, type Address, type Hex } from "viem";
import type { TypedDataField } from "../signatures.js";

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
export function buildTypedData(
  args: { chainId: number; market: Address } & RegisterEndpointMessage,
): RegistrationTypedData {
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
