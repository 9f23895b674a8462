import { zeroAddress, type Address, type Hex, type PublicClient } from "viem";
import { offerStatuses } from "../../domain/catalog.js";
import { GatewayError } from "../../domain/errors.js";
import {
  withoutDomainType,
  type ChainOffer,
  type OfferReader,
  type RegistrationTypedData,
} from "../../domain/registration/index.js";
import { marketAbi } from "../../../gen/contracts/artifacts.js";
import { createChainSignatureVerifier } from "./signatures.js";

/**
 * Live offer reads and signature checks on the market, for provider registration. Nothing is
 * cached: who may register an endpoint is whoever the chain names as operator right now, so a
 * revoked operator loses that power with the next block.
 */
export function createChainOfferReader(deps: {
  client: PublicClient;
  market: Address;
}): OfferReader {
  const { client, market } = deps;
  const signatures = createChainSignatureVerifier(client);
  return {
    async getOffer(offerId: Hex): Promise<ChainOffer | undefined> {
      let offer;
      try {
        offer = await client.readContract({
          address: market,
          abi: marketAbi,
          functionName: "getOffer",
          args: [offerId],
        });
      } catch (err) {
        throw new GatewayError("chain_unavailable", "the market could not be read", {
          cause: err,
        });
      }
      // The market returns a zeroed struct for an unknown id; every real offer has an owner.
      if (offer.owner === zeroAddress) return undefined;
      return {
        operator: offer.operator,
        modelId: offer.modelId,
        status: offerStatuses[offer.status] ?? "retired",
      };
    },

    /** The shared verifier (adapters/chain/signatures.ts): ERC-1271 for a contract, else ECDSA. */
    verifySignature(args: {
      address: Address;
      typedData: RegistrationTypedData;
      signature: Hex;
    }): Promise<boolean> {
      return signatures.verifyTypedData({
        address: args.address,
        typedData: withoutDomainType(args.typedData),
        signature: args.signature,
      });
    },
  };
}
