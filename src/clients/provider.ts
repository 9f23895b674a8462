import { getAddress, type Address, type Hex, type LocalAccount } from "viem";
import { canonicalEndpointUrl } from "../adapters/upstream/endpoint-guard.js";
import { call, type GatewayConnection } from "./gateway-call.js";
import { gatewayDeployment, localKeyId } from "./permit.js";
import {
  checkFrame,
  checkTypedData,
  takeKeyId,
  takeNonce,
  when,
  type ConfirmSigning,
  type SigningChain,
} from "./signing-guard.js";
import { normalizeHex } from "../domain/hex.js";
import {
  buildBindOfferKeyTypedData,
  type BindOfferKeyTypedData,
} from "../domain/offer-key-binding.js";
import {
  defaultAuthorizationLifetimeSeconds,
  signable as signableTypedData,
} from "../domain/permit-authorization/index.js";
import {
  buildTypedData,
  defaultChallengeLifetimeSeconds,
  endpointTokenHash,
  endpointUrlHash,
  withoutDomainType,
} from "../domain/registration/index.js";

/**
 * What a provider runs on its own machine to onboard an offer: it asks the
 * gateway for a challenge over the public REST API, signs it locally with the
 * offer operator's key (the key never leaves the process), and submits it.
 * The `provider` CLI and the dev sandbox both use it. What it signs it builds itself and
 * compares with the gateway's challenge first (src/clients/signing-guard.ts).
 */
/** Unix seconds now, on this machine's clock. */
const unixNow = (): number => Math.floor(Date.now() / 1000);

export interface RegisterOptions {
  readonly offerId: Hex;
  readonly endpointUrl: string;
  readonly endpointToken?: string;
  /** The offer operator's key (for a contract operator: a key its ERC-1271 check accepts). */
  readonly signer: LocalAccount;
  /** The chain and market the signature is for: this machine's, never the gateway's. */
  readonly chain: SigningChain;
  /** The offer's operator; default the signer's address (a contract operator: its address). */
  readonly operator?: Address;
  /** Shown and asked before signing (src/clients/signing-guard.ts); absent: signs after the checks. */
  readonly confirm?: ConfirmSigning;
  /** Unix seconds; default this machine's clock. */
  readonly clock?: () => number;
}

export interface OfferJson {
  offer_id: string;
  status: string;
  verified_at: number | null;
  verification_expires_at: number | null;
  [key: string]: unknown;
}

export interface HealthJson {
  offer_id: string;
  status: string;
  running: boolean;
  verified_at: number | null;
  verification_expires_at: number | null;
}

/**
 * Challenge -> local signature -> registration. Returns the offer as the gateway lists it.
 *
 * The `RegisterEndpoint` typed data is built here: the offer, the operator, the hashes of the
 * endpoint URL (canonicalized as the gateway does) and of the token, and the expiry from this
 * call's arguments and clock, the domain from `chain`; the gateway's challenge supplies only
 * the nonce. A challenge that differs anywhere is refused ({@link ChallengeMismatchError}) and
 * nothing is signed.
 */
export async function registerEndpoint(
  gateway: GatewayConnection,
  options: RegisterOptions,
): Promise<OfferJson> {
  const now = Math.floor((options.clock ?? unixNow)());
  const offerId = normalizeHex(options.offerId);
  const operator = getAddress(options.operator ?? options.signer.address);
  // As the gateway canonicalizes it: the signature binds the hash of exactly this string.
  const canonical = canonicalEndpointUrl(options.endpointUrl);
  const expiresAt = now + defaultChallengeLifetimeSeconds;
  const expected = (nonce: string) =>
    buildTypedData({
      chainId: options.chain.chainId,
      market: options.chain.market,
      offerId,
      operator,
      endpointUrlHash: endpointUrlHash(canonical),
      endpointTokenHash: endpointTokenHash(options.endpointToken),
      nonce,
      expiresAt,
    });
  const challenge = await call<unknown>(gateway, "POST", "/v1/provider-offers/challenge", {
    offerId,
    endpointUrl: options.endpointUrl,
    expiresAt,
    // The challenge binds the token's hash, so the signature registers this token only.
    ...(options.endpointToken === undefined ? {} : { endpointToken: options.endpointToken }),
  });
  checkFrame(expected(""), challenge);
  const typedData = expected(takeNonce(challenge));
  checkTypedData(typedData, challenge);
  const { message } = typedData;
  await options.confirm?.({
    title: `about to sign RegisterEndpoint as the operator of offer ${offerId} (chain ${options.chain.chainId}, market ${options.chain.market})`,
    lines: [
      ["offer", offerId],
      ["operator", `${operator}${options.operator === undefined ? "" : " (--operator)"}`],
      ["endpoint", `the URL given, canonical form hashed: ${message.endpointUrlHash}`],
      [
        "token",
        options.endpointToken === undefined
          ? "none"
          : `the token given, hashed: ${message.endpointTokenHash}`,
      ],
      ["expires", when(expiresAt, now)],
    ],
  });
  const signature = await options.signer.signTypedData(withoutDomainType(typedData));
  const { offer } = await call<{ offer: OfferJson }>(
    gateway,
    "POST",
    "/v1/provider-offers/register",
    {
      offerId,
      endpointUrl: options.endpointUrl,
      nonce: message.nonce,
      expiresAt: message.expiresAt,
      signature,
      ...(options.endpointToken === undefined ? {} : { endpointToken: options.endpointToken }),
    },
  );
  return offer;
}

/** The verification run a verify answer rests on (Unix seconds). */
export interface VerificationRunJson {
  ran_at: number;
  /** True when no run was made for this call: the last run's outcome, inside the bound. */
  replayed: boolean;
  next_run_at: number;
}

/**
 * Asks the gateway to verify the offer's endpoint. Inside VERIFY_MIN_INTERVAL_SECONDS of the
 * last run the gateway answers that run's outcome (`verification.replayed`) instead of running
 * the checks again.
 */
export function verifyOffer(
  gateway: GatewayConnection,
  offerId: Hex,
): Promise<{ offer: OfferJson; verification: VerificationRunJson }> {
  return call<{ offer: OfferJson; verification: VerificationRunJson }>(
    gateway,
    "POST",
    `/v1/provider-offers/${offerId}/verify`,
  );
}

export function offerHealth(gateway: GatewayConnection, offerId: Hex): Promise<HealthJson> {
  return call<HealthJson>(gateway, "GET", `/v1/provider-offers/${offerId}/health`);
}

/** A key binding as the gateway answers it. */
export interface KeyBindingJson {
  id: string;
  object: "offer_key_binding";
  offer_id: string;
  api_key_id: string;
  operator: string;
  status: "active" | "expired" | "revoked";
  expires_at: number;
  created_at: number;
  revoked_at: number | null;
}

export interface BindKeyOptions {
  readonly offerId: Hex;
  /** The offer operator's key (for a contract operator: a key its ERC-1271 check accepts). */
  readonly signer: LocalAccount;
  /** The chain and market the signature is for: this machine's, never the gateway's. */
  readonly chain: SigningChain;
  /** The offer's operator; default the signer's address (a contract operator: its address). */
  readonly operator?: Address;
  /** Unix seconds; default 30 days from now. */
  readonly expiresAt?: number;
  /** The API key's public id as its holder knows it; absent: derived from the connection's key. */
  readonly keyId?: string;
  /** The gateway deployment the user pinned; absent: GET /v1/gateway's, shown before signing. */
  readonly deployment?: string;
  readonly confirm?: ConfirmSigning;
  /** Unix seconds; default this machine's clock. */
  readonly clock?: () => number;
}

/**
 * Binds the connection's API key to an offer so it may read the offer's earnings: the key asks
 * for the `BindOfferKey` typed data, the operator's key signs it here (it never leaves this
 * process), and the key submits the signature. The typed data is built here (offer, operator,
 * expiry from the arguments, domain from `chain`); the challenge supplies the nonce and the key
 * id (checked against `keyId` when given, else shown), and is compared field by field first.
 */
export async function bindKey(
  gateway: GatewayConnection,
  options: BindKeyOptions,
): Promise<KeyBindingJson> {
  const now = Math.floor((options.clock ?? unixNow)());
  const offerId = normalizeHex(options.offerId);
  const operator = getAddress(options.operator ?? options.signer.address);
  const expiresAt = options.expiresAt ?? now + defaultAuthorizationLifetimeSeconds;
  const keyId = localKeyId(gateway, options.keyId);
  const deployment = await gatewayDeployment(gateway, options.chain, options.deployment);
  const expected = (keyId: string, nonce: string) =>
    buildBindOfferKeyTypedData({
      chainId: options.chain.chainId,
      market: options.chain.market,
      message: { offerId, operator, keyId, expiresAt, nonce, deployment },
    });
  const challenge = await call<unknown>(
    gateway,
    "POST",
    `/v1/provider-offers/${offerId}/key-bindings/challenge`,
    { expiresAt },
  );
  checkFrame(expected("", ""), challenge);
  takeKeyId(challenge, keyId);
  const typedData: BindOfferKeyTypedData = expected(keyId, takeNonce(challenge));
  checkTypedData(typedData, challenge);
  await options.confirm?.({
    title: `about to sign BindOfferKey as the operator of offer ${offerId} (chain ${options.chain.chainId}, market ${options.chain.market})`,
    lines: [
      ["offer", offerId],
      ["operator", `${operator}${options.operator === undefined ? "" : " (--operator)"}`],
      [
        "API key",
        `${keyId} (${options.keyId === undefined ? "derived from the API key" : "--key-id"})`,
      ],
      ["expires", when(expiresAt, now)],
      [
        "deployment",
        `${deployment} (${options.deployment === undefined ? "GET /v1/gateway: not pinned" : "pinned"})`,
      ],
    ],
  });
  const signature = await options.signer.signTypedData(signableTypedData(typedData));
  const { binding } = await call<{ binding: KeyBindingJson }>(
    gateway,
    "POST",
    `/v1/provider-offers/${offerId}/key-bindings`,
    { expiresAt, nonce: typedData.message.nonce, deployment, signature },
  );
  return binding;
}

/** Totals of one settlement state, as the gateway answers them (amounts as decimal strings). */
export interface EarningsTotalsJson {
  requests: number;
  input_tokens: string;
  output_tokens: string;
  credits: string;
}

export interface EarningsJson {
  object: "offer_earnings";
  offer_id: string;
  model_id: string;
  payout: string;
  from: number;
  to: number;
  unsettled: EarningsTotalsJson;
  settling: EarningsTotalsJson;
  settled: EarningsTotalsJson;
  unsettleable: EarningsTotalsJson;
  unsettleable_reasons: { reason: string; requests: number; credits: string }[];
  batches: {
    batch_id: string;
    status: string;
    tx_hash: string | null;
    created_at: number;
    settled_at: number | null;
    requests: number;
    credits: string;
  }[];
  batches_truncated: boolean;
  /** By UTC day of completion, oldest first: earnings over time. */
  days: { starts_at: number; requests: number; credits: string; settled_credits: string }[];
}

/** An offer's earnings over [from, to) (Unix seconds; the gateway's defaults when absent). */
export function offerEarnings(
  gateway: GatewayConnection,
  offerId: Hex,
  window: { from?: number; to?: number } = {},
): Promise<EarningsJson> {
  const query = new URLSearchParams();
  if (window.from !== undefined) query.set("from", String(window.from));
  if (window.to !== undefined) query.set("to", String(window.to));
  const suffix = query.size === 0 ? "" : `?${query.toString()}`;
  return call<EarningsJson>(gateway, "GET", `/v1/provider-offers/${offerId}/earnings${suffix}`);
}
