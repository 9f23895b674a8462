import type { Address, Hex, LocalAccount } from "viem";
import {
  signable,
  type AuthorizeKeyTypedData,
  type RevokeKeyAuthorizationTypedData,
} from "../domain/permit-authorization.js";
import { call, type GatewayConnection } from "../provider/client.js";

/**
 * What a payer runs (with the key holder's API key) to let that key spend its permits: the key
 * asks the gateway for the typed data, the payer's key signs it locally (it never leaves the
 * process), and the key posts the signature. The `permit` CLI, the dev sandbox and the benchmark
 * use it.
 */

export interface AuthorizationJson {
  id: string;
  object: "permit_authorization";
  api_key_id: string;
  payer: string;
  permit_id: string;
  status: "active" | "expired" | "revoked";
  expires_at: number;
  issued_at: number;
  total_cap: string;
  per_request_cap: string;
  created_at: number;
  revoked_at: number | null;
  revoked_by: "key" | "payer" | null;
}

export interface AuthorizeOptions {
  /**
   * Signs for the payer: the payer's own key, or for a contract wallet a key its ERC-1271 check
   * accepts (then `payer` names the wallet).
   */
  readonly signer: LocalAccount;
  /** Default: the signer's address. */
  readonly payer?: Address;
  /** One permit; absent: every permit of the payer. */
  readonly permitId?: Hex;
  /** Unix seconds; absent: the gateway's default (30 days). */
  readonly expiresAt?: number;
}

/** Challenge (with the key being authorized) -> the payer's signature -> the authorization. */
export async function authorizeApiKey(
  gateway: GatewayConnection,
  options: AuthorizeOptions,
): Promise<AuthorizationJson> {
  const typedData = await call<AuthorizeKeyTypedData>(
    gateway,
    "POST",
    "/v1/permit-authorizations/challenge",
    {
      payer: options.payer ?? options.signer.address,
      ...(options.permitId === undefined ? {} : { permitId: options.permitId }),
      ...(options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt }),
    },
  );
  const signature = await options.signer.signTypedData(signable(typedData));
  const { message } = typedData;
  const { authorization } = await call<{ authorization: AuthorizationJson }>(
    gateway,
    "POST",
    "/v1/permit-authorizations",
    {
      payer: message.payer,
      permitId: message.permitId,
      expiresAt: message.expiresAt,
      issuedAt: message.issuedAt,
      deployment: message.deployment,
      totalCap: message.totalCap,
      perRequestCap: message.perRequestCap,
      nonce: message.nonce,
      signature,
    },
  );
  return authorization;
}

/**
 * The payer's revocation of one authorization, without the key that holds it: `gateway` may
 * carry any API key (the payer's own).
 */
export async function revokeAuthorizationAsPayer(
  gateway: GatewayConnection,
  options: { readonly id: string; readonly signer: LocalAccount },
): Promise<AuthorizationJson> {
  const path = `/v1/permit-authorizations/${encodeURIComponent(options.id)}`;
  const typedData = await call<RevokeKeyAuthorizationTypedData>(
    gateway,
    "POST",
    `${path}/revocation-challenge`,
  );
  const signature = await options.signer.signTypedData(signable(typedData));
  const { authorization } = await call<{ authorization: AuthorizationJson }>(
    gateway,
    "POST",
    `${path}/revoke`,
    { signature },
  );
  return authorization;
}
