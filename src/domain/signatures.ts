import type { Address, Hex } from "viem";

/** One field of an EIP-712 struct type. */
export interface TypedDataField {
  name: string;
  type: string;
}

/** A signature as `parseRegistrationSignature` (registration/signature.ts) reads it. */
export interface ParsedSignature {
  /** 65 bytes `r | s | v` with v in {27, 28}: what ECDSA recovery and most wallets take. */
  full: Hex;
  /** The 64-byte EIP-2098 form as submitted, when it was submitted that way. */
  compact?: Hex;
}

/**
 * EIP-712 typed data as viem and ethers sign it: the struct types without `EIP712Domain` (both
 * derive the domain type themselves). Registration challenges and permit authorizations share
 * this shape and one verifier.
 */
export interface SignableTypedData {
  readonly types: Record<string, readonly TypedDataField[]>;
  readonly primaryType: string;
  readonly domain: {
    readonly name: string;
    readonly version: string;
    readonly chainId: number;
    readonly verifyingContract: Address;
  };
  readonly message: Record<string, unknown>;
}

/**
 * Whether `address` signed typed data: ECDSA recovery for an account, ERC-1271
 * `isValidSignature` for a contract (implemented on viem in adapters/chain/signatures.ts).
 * A refusal is `false`; only a failure to ask the chain throws (`chain_unavailable`).
 */
export interface SignatureVerifier {
  verifyTypedData(args: {
    address: Address;
    typedData: SignableTypedData;
    signature: Hex;
  }): Promise<boolean>;
}

/**
 * Verifies a parsed signature (see `parseRegistrationSignature`). A compact signature is tried in
 * its 65-byte form first (EOAs are checked by ECDSA recovery, which takes 65 bytes, and most
 * contract wallets take it too), then as submitted, for a contract wallet that reads only
 * EIP-2098.
 */
export async function verifyParsedSignature(
  verifier: SignatureVerifier,
  address: Address,
  typedData: SignableTypedData,
  signature: ParsedSignature,
): Promise<boolean> {
  if (await verifier.verifyTypedData({ address, typedData, signature: signature.full })) {
    return true;
  }
  if (signature.compact === undefined) return false;
  return verifier.verifyTypedData({ address, typedData, signature: signature.compact });
}
