import type { Hex, LocalAccount } from "viem";
import { BaseError } from "../errors.js";
import type { BindOfferKeyTypedData } from "../domain/offer-key-binding.js";
import { signable as signableTypedData } from "../domain/permit-authorization.js";
import { withoutDomainType, type RegistrationTypedData } from "../domain/registration.js";

/**
 * What a provider runs on its own machine to onboard an offer: it asks the
 * gateway for a challenge over the public REST API, signs it locally with the
 * offer operator's key (the key never leaves the process), and submits it.
 * The `provider` CLI and the dev sandbox both use it.
 */
export interface GatewayConnection {
  readonly baseUrl: string;
  readonly apiKey: string;
}

/** An error answer of the gateway, with the spec's code. */
export class GatewayRequestError extends BaseError {
  readonly reason = "gateway_refused";
  override readonly name = "GatewayRequestError";
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** One JSON request to the gateway's REST API; an error answer throws {@link GatewayRequestError}. */
export async function call<T>(
  gateway: GatewayConnection,
  method: string,
  path: string,
  body?: unknown,
): Promise<T> {
  const res = await fetch(new URL(path, gateway.baseUrl), {
    method,
    headers: {
      authorization: `Bearer ${gateway.apiKey}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text === "" ? undefined : JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (!res.ok) {
    const error = (parsed as { error?: { code?: string; message?: string } } | undefined)?.error;
    throw new GatewayRequestError(
      res.status,
      error?.code ?? "http_error",
      error?.message ?? `HTTP ${res.status}`,
    );
  }
  return parsed as T;
}

export interface RegisterOptions {
  readonly offerId: Hex;
  readonly endpointUrl: string;
  readonly endpointToken?: string;
  /** The offer operator's key (for a contract operator: a key its ERC-1271 check accepts). */
  readonly signer: LocalAccount;
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

/** Challenge -> local signature -> registration. Returns the offer as the gateway lists it. */
export async function registerEndpoint(
  gateway: GatewayConnection,
  options: RegisterOptions,
): Promise<OfferJson> {
  const typedData = await call<RegistrationTypedData>(
    gateway,
    "POST",
    "/v1/provider-offers/challenge",
    {
      offerId: options.offerId,
      endpointUrl: options.endpointUrl,
      // The challenge binds the token's hash, so the signature registers this token only.
      ...(options.endpointToken === undefined ? {} : { endpointToken: options.endpointToken }),
    },
  );
  const signable = withoutDomainType(typedData);
  const signature = await options.signer.signTypedData({
    domain: signable.domain,
    types: signable.types,
    primaryType: signable.primaryType,
    message: signable.message,
  });
  const { offer } = await call<{ offer: OfferJson }>(
    gateway,
    "POST",
    "/v1/provider-offers/register",
    {
      offerId: options.offerId,
      endpointUrl: options.endpointUrl,
      nonce: typedData.message.nonce,
      expiresAt: typedData.message.expiresAt,
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

/**
 * Binds the connection's API key to an offer so it may read the offer's earnings: the key asks
 * for the `BindOfferKey` typed data, the operator's key signs it here (it never leaves this
 * process), and the key submits the signature.
 */
export async function bindKey(
  gateway: GatewayConnection,
  options: { readonly offerId: Hex; readonly signer: LocalAccount; readonly expiresAt?: number },
): Promise<KeyBindingJson> {
  const typedData = await call<BindOfferKeyTypedData>(
    gateway,
    "POST",
    `/v1/provider-offers/${options.offerId}/key-bindings/challenge`,
    options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt },
  );
  const signable = signableTypedData(typedData);
  const signature = await options.signer.signTypedData({
    domain: signable.domain,
    types: signable.types,
    primaryType: signable.primaryType,
    message: signable.message,
  });
  const { binding } = await call<{ binding: KeyBindingJson }>(
    gateway,
    "POST",
    `/v1/provider-offers/${options.offerId}/key-bindings`,
    { expiresAt: typedData.message.expiresAt, nonce: typedData.message.nonce, signature },
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
