/**
 * What every operation of the authorization service shares: its dependencies, its clock, the
 * verification of a payer's signature, the store's failures as `database_unavailable`.
 */
import { recoverTypedDataAddress, type Address, type Hex } from "viem";
import { GatewayError } from "../errors.js";
import { parseRegistrationSignature } from "../registration/signature.js";
import { verifyParsedSignature, type SignatureVerifier } from "../signatures.js";
import type { PermitAuthorization } from "./authorizations.js";
import { authorizationIdShape } from "./checks.js";
import type { KeyAuthorities } from "./key-authorities.js";
import type { PermitAuthorizationStore } from "./store.js";
import {
  signable,
  type AuthorizeKeyTypedData,
  type ListAuthorizationsTypedData,
  type ReadPayerRequestsTypedData,
  type RevokeAuthorizationsTypedData,
  type RevokeKeyAuthorizationTypedData,
} from "./typed-data.js";

export interface PermitAuthorizationServiceDeps {
  chainId: number;
  market: Address;
  /** This gateway deployment's id (GET /v1/gateway), named in every AuthorizeKey. */
  deployment: string;
  /** The longest an authorization may last, in seconds (AUTHORIZATION_MAX_EXPIRY_SECONDS). */
  maxLifetimeSeconds: number;
  store: PermitAuthorizationStore;
  verifier: SignatureVerifier;
  authorities: KeyAuthorities;
  /** Unix seconds. */
  clock: () => number;
  /** Where a warning goes (the gateway's log); absent: nowhere. Never given a secret. */
  warn?: (fields: Record<string, unknown>, message: string) => void;
}

/** The service's clock, in whole Unix seconds. */
export function nowOf(deps: PermitAuthorizationServiceDeps): number {
  return Math.floor(deps.clock());
}

/** Verifies that `payer` signed `typedData`; answers the signature as stored (compact if given). */
export async function verifyPayerSignature(
  deps: PermitAuthorizationServiceDeps,
  payer: Address,
  typedData:
    | AuthorizeKeyTypedData
    | RevokeKeyAuthorizationTypedData
    | ListAuthorizationsTypedData
    | ReadPayerRequestsTypedData
    | RevokeAuthorizationsTypedData,
  signatureText: string,
): Promise<Hex> {
  const signature = parseRegistrationSignature(signatureText);
  const data = signable(typedData);
  // The payer's own key (an account) is answered here, without asking the chain; anything
  // else may be a contract wallet's (ERC-1271), which only the chain can answer.
  const valid =
    (await signedByAccount(payer, data, signature.full)) ||
    (await verifyParsedSignature(deps.verifier, payer, data, signature));
  if (!valid) {
    // Altered fields and a wrong signer look the same to recovery; either way the payer did
    // not sign this.
    throw new GatewayError("invalid_signature", `the signature is not the payer's (${payer})`);
  }
  return signature.compact ?? signature.full;
}

/** Runs a store call; a failure that is not a GatewayError is `database_unavailable`. */
export async function stored<T>(what: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw new GatewayError("database_unavailable", `${what} could not be reached`, {
      cause: err,
    });
  }
}

/** The authorization `id`, else 404 `authorization_not_found`. */
export async function findAuthorization(
  deps: PermitAuthorizationServiceDeps,
  id: string,
): Promise<PermitAuthorization> {
  const a = authorizationIdShape.test(id)
    ? await stored("the authorization store", () => deps.store.get(id))
    : undefined;
  if (a === undefined) {
    throw new GatewayError(
      "authorization_not_found",
      `authorization ${id.slice(0, 64)} does not exist`,
    );
  }
  return a;
}

/** Whether `address`'s own key (an account's, ECDSA) made `signature` over `typedData`. */
async function signedByAccount(
  address: Address,
  typedData: ReturnType<typeof signable>,
  signature: Hex,
): Promise<boolean> {
  try {
    const signer = await recoverTypedDataAddress({
      ...(typedData as unknown as Parameters<typeof recoverTypedDataAddress>[0]),
      signature,
    });
    return signer.toLowerCase() === address.toLowerCase();
  } catch {
    return false;
  }
}
