import { BaseError } from "./base-error.js";

/**
 * What kind of failure a code is, in the domain's words. How a kind is shown on the wire (its
 * HTTP and Connect codes) is the transports' business: src/connect/error-codes.ts.
 */
export type ErrorKind =
  | "invalid"
  | "unauthenticated"
  | "payment"
  | "forbidden"
  | "not_found"
  | "method"
  | "timeout"
  | "conflict"
  | "too_large"
  | "media_type"
  | "unprocessable"
  | "rate_limited"
  | "internal"
  | "not_implemented"
  | "bad_gateway"
  | "unavailable";

/** The error `type` clients read beside the code (OpenAI's vocabulary, DESIGN.md section 5). */
export const errorTypes: Readonly<Record<ErrorKind, string>> = {
  invalid: "invalid_request_error",
  unauthenticated: "authentication_error",
  payment: "payment_required",
  forbidden: "permission_error",
  not_found: "not_found_error",
  method: "invalid_request_error",
  timeout: "invalid_request_error",
  conflict: "conflict_error",
  too_large: "invalid_request_error",
  media_type: "invalid_request_error",
  unprocessable: "invalid_request_error",
  rate_limited: "rate_limit_error",
  internal: "api_error",
  not_implemented: "api_error",
  bad_gateway: "api_error",
  unavailable: "service_unavailable",
};

/**
 * The gateway's error vocabulary (DESIGN.md section 5): every failure a client can see is a
 * {@link GatewayError} with one of these codes, each of one kind. The Connect layer turns it
 * into a ConnectError with an ErrorInfo detail, and the REST facade turns that into the
 * `{error: {code, type, message}}` body.
 */
export const errorCodes = {
  invalid_request: "invalid",
  invalid_json: "invalid",
  invalid_hex: "invalid",
  challenge_expiry_invalid: "invalid",
  // An authorization's expiresAt beyond AUTHORIZATION_MAX_EXPIRY_SECONDS after its challenge.
  authorization_expiry_too_far: "invalid",
  // A credit cap on an authorization of every permit, or a per-request cap above the total.
  authorization_cap_invalid: "invalid",
  endpoint_not_allowed: "invalid",
  missing_api_key: "unauthenticated",
  invalid_api_key: "unauthenticated",
  invalid_operator_token: "unauthenticated",
  invalid_signature: "unauthenticated",
  // A payer's read token (ListAuthorizations) past its expiresAt: sign a new one.
  signature_expired: "unauthenticated",
  permit_missing: "payment",
  permit_not_found: "payment",
  permit_expired: "payment",
  permit_closing: "payment",
  permit_closed: "payment",
  permit_model_mismatch: "payment",
  permit_offer_mismatch: "payment",
  insufficient_credits: "payment",
  // The request's maximum does not fit what remains of the total credit cap of the payer's
  // authorization of this key (issue 28, item 7).
  authorization_cap_exhausted: "payment",
  // The request's maximum does not fit what remains, in the current UTC day, week or month, of
  // the periodic cap of the payer's authorization of this key (issue 38); the message names the
  // period and when it renews.
  authorization_period_cap_exhausted: "payment",
  // x402 (issue 37, DESIGN.md section 11): a chat request with no credentials and no payment
  // (its PAYMENT-REQUIRED header says what to pay), a payment that is malformed, signed for
  // another request, network, token or payee, or whose signature does not recover its payer, one
  // below the request's maximum, one expired or not yet valid, one whose nonce already paid a
  // request, one the chain would refuse (balance, Permit2 allowance: the simulation of its
  // settlement), and a payer beyond its in-flight exposure cap or refused until an operator
  // clears it (one of its settlements failed). A gasless first payment's EIP-2612 approval of
  // Permit2 (x402's eip2612GasSponsoring) that is malformed, not the payer's, for another token
  // or spender, below the payment, badly signed or not taken by the token, or whose deadline
  // leaves no time to serve and settle.
  payment_required: "payment",
  payment_invalid: "payment",
  payment_insufficient: "payment",
  payment_expired: "payment",
  payment_used: "payment",
  payment_refused: "payment",
  permit2_allowance_required: "payment",
  payment_exposure_exceeded: "payment",
  payer_blocked: "payment",
  eip2612_permit_invalid: "payment",
  eip2612_permit_expired: "payment",
  not_offer_operator: "forbidden",
  // A payer's usage (GET /v1/usage?payer=) asked by anyone but that payer on its own signature.
  not_payer: "forbidden",
  // The permit's payer has not authorized the calling API key (DESIGN.md section 8), or the
  // authorization expired or was revoked.
  permit_not_authorized: "forbidden",
  // A payer's signature made for another gateway deployment (GET /v1/gateway `deployment`).
  wrong_deployment: "forbidden",
  // An AuthorizeKey issued at or before the time up to which its payer revoked everything it
  // signed (revoke all: the payer's epoch).
  authorization_revoked: "forbidden",
  // The request's maximum is above the per-request credit cap of every authorization of the
  // key that covers the permit (issue 28, item 7).
  authorization_per_request_cap_exceeded: "forbidden",
  model_not_found: "not_found",
  offer_not_found: "not_found",
  request_not_found: "not_found",
  quote_not_found: "not_found",
  // No permit authorization with this id (held by the calling key, for a revocation by the key).
  authorization_not_found: "not_found",
  // No key binding with this id held by the calling key on the offer (a revocation).
  binding_not_found: "not_found",
  route_not_found: "not_found",
  // The request closed without a charge (void): it has no usage receipt, and never will.
  receipt_not_found: "not_found",
  method_not_allowed: "method",
  quote_expired: "conflict",
  quote_mismatch: "conflict",
  quote_used: "conflict",
  tariff_changed: "conflict",
  nonce_used: "conflict",
  // An authorization challenge older than a day: ask for a new one.
  challenge_expired: "conflict",
  // The request is still open: its usage receipt exists once it closes with a charge.
  request_not_closed: "conflict",
  idempotency_in_progress: "conflict",
  // The answer to this Idempotency-Key was larger than IDEMPOTENCY_MAX_RESULT_BYTES: not kept.
  idempotency_result_too_large: "conflict",
  // The request body did not arrive within BODY_TIMEOUT_MS.
  request_timeout: "timeout",
  request_too_large: "too_large",
  unsupported_media_type: "media_type",
  idempotency_key_reused: "unprocessable",
  // A provider endpoint failed verification; the code names the check.
  model_not_listed: "unprocessable",
  completion_failed: "unprocessable",
  stream_failed: "unprocessable",
  usage_missing: "unprocessable",
  // The provider's usage claim for a verification prompt ran above the gateway's own count.
  usage_diverged: "unprocessable",
  // Over the API key's request rate or its concurrent streams (per replica); carries Retry-After.
  rate_limited: "rate_limited",
  // Too many failed authentications from the caller's address (per process), checked before its
  // credentials; a key the gateway issued passes. Carries Retry-After.
  address_rate_limited: "rate_limited",
  offer_at_capacity: "rate_limited",
  internal_error: "internal",
  not_implemented: "not_implemented",
  upstream_error: "bad_gateway",
  endpoint_unreachable: "bad_gateway",
  no_eligible_offer: "unavailable",
  // Every offer the request may use is cooling down: its provider answered "too many requests"
  // (or "unavailable" with Retry-After) and routing leaves it alone for the time it asked.
  // Carries Retry-After.
  offer_cooling_down: "unavailable",
  // The offer the request is pinned to (or every offer it may use) is out of routing: its audits
  // found it serving another model than the one it sells (docs/decisions/audits.md); it returns
  // once its operator verifies it again.
  offer_model_mismatch: "unavailable",
  upstream_unavailable: "unavailable",
  chain_unavailable: "unavailable",
  database_unavailable: "unavailable",
  // This gateway has no settlement account configured (SETTLEMENT_PRIVATE_KEY).
  settlement_unavailable: "unavailable",
  // This gateway has no receipt key configured (RECEIPT_PRIVATE_KEY): it signs no receipts.
  receipts_unavailable: "unavailable",
  // The model's tokenizer is still loading (start-up, or a model the indexer just added): the
  // gateway meters every answer, and never loads a tokenizer on a request's path. Retry-After.
  model_loading: "unavailable",
  // The process is stopping (SIGTERM): a request arriving now, or one cut at the end of the grace.
  shutting_down: "unavailable",
} as const satisfies Record<string, ErrorKind>;

export type ErrorCode = keyof typeof errorCodes;

export function isErrorCode(value: string): value is ErrorCode {
  return Object.hasOwn(errorCodes, value);
}

/**
 * A failure with a stable, client-visible code. `message` is shown to the
 * client, so it must never contain a secret; `cause` is for logs only.
 */
export class GatewayError extends BaseError {
  override readonly name = "GatewayError";
  readonly code: ErrorCode;
  /** Whole seconds the client should wait before retrying (`Retry-After`), when it says so. */
  readonly retryAfterSeconds: number | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options?: { cause?: unknown; retryAfterSeconds?: number },
  ) {
    super(message, options);
    this.code = code;
    this.retryAfterSeconds = options?.retryAfterSeconds;
  }

  /** The error code (BaseError's reason). */
  get reason(): ErrorCode {
    return this.code;
  }

  get kind(): ErrorKind {
    return errorCodes[this.code];
  }

  /** The error `type` clients read beside the code. */
  get type(): string {
    return errorTypes[errorCodes[this.code]];
  }
}

/**
 * Port: whether a failure that nothing mapped means the database could not be asked (down,
 * unreachable, hung, out of connections), as opposed to a query it refused. Only the database
 * adapter knows its driver's errors (adapters/pg/unavailable.ts); the composition root
 * (src/app/storage.ts) installs its check here, so that the transports answer such a failure
 * with `database_unavailable` through {@link asGatewayError} without knowing the adapter.
 */
export type UnavailabilityCheck = (error: unknown) => boolean;

const databaseUnavailableChecks = new Set<UnavailabilityCheck>();

/** Installs a database adapter's check; installing the same check again changes nothing. */
export function recognizeDatabaseUnavailable(check: UnavailabilityCheck): void {
  databaseUnavailableChecks.add(check);
}

/**
 * The gateway error a failure stands for: itself when it is one; `database_unavailable`
 * when an installed check says the database could not be asked; else `internal_error` with a
 * generic message. The cause stays for the logs.
 */
export function asGatewayError(error: unknown): GatewayError {
  if (error instanceof GatewayError) return error;
  for (const check of databaseUnavailableChecks) {
    if (check(error)) {
      return new GatewayError("database_unavailable", "the database is unavailable", {
        cause: error,
      });
    }
  }
  return new GatewayError("internal_error", "internal error", { cause: error });
}
