import type { PublicClient, TypedDataDefinition } from "viem";
import { GatewayError } from "../../domain/errors.js";
import type { SignatureVerifier } from "../../domain/signatures.js";

/**
 * viem's verification: ERC-1271 `isValidSignature` (through the ERC-6492 validator) for an
 * address with code, ECDSA recovery for an account. A contract's refusal is `false`; only a
 * failure to reach the chain throws. Nothing is cached: a contract wallet's answer may change
 * with its state (a rotated owner), so each signature is asked of the chain as it is now.
 */
export function createChainSignatureVerifier(client: PublicClient): SignatureVerifier {
  return {
    async verifyTypedData({ address, typedData, signature }) {
      try {
        return await client.verifyTypedData({
          address,
          ...(typedData as unknown as TypedDataDefinition),
          signature,
        });
      } catch (err) {
        throw new GatewayError("chain_unavailable", "the signature could not be checked on chain", {
          cause: err,
        });
      }
    },
  };
}
