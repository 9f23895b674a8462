/**
 * The gateway's error vocabulary (DESIGN.md section 5). Every failure a client
 * can see is a {@link GatewayError} with one of these codes; the Connect layer
 * turns it into a ConnectError with an ErrorInfo detail, and the REST facade
 * turns that into the `{error: {code, type, message}}` body. This table is the
 * single source of each code's HTTP status and error type.
 */
export const errorCodes = {
  invalid_request: { status: 400, type: "invalid_request_error" },
  invalid_json: { status: 400, type: "invalid_request_error" },
  invalid_hex: { status: 400, type: "invalid_request_error" },
  challenge_expiry_invalid: { status: 400, type: "invalid_request_error" },
  endpoint_not_allowed: { status: 400, type: "invalid_request_error" },
  missing_api_key: { status: 401, type: "authentication_error" },
  invalid_api_key: { status: 401, type: "authentication_error" },
  invalid_operator_token: { status: 401, type: "authentication_error" },
  invalid_signature: { status: 401, type: "authentication_error" },
  permit_missing: { status: 402, type: "payment_required" },
  permit_not_found: { status: 402, type: "payment_required" },
  permit_expired: { status: 402, type: "payment_required" },
  permit_closing: { status: 402, type: "payment_required" },
  permit_closed: { status: 402, type: "payment_required" },
  permit_model_mismatch: { status: 402, type: "payment_required" },
  permit_offer_mismatch: { status: 402, type: "payment_required" },
  insufficient_credits: { status: 402, type: "payment_required" },
  not_offer_operator: { status: 403, type: "permission_error" },
  // The permit's payer has not authorized the calling API key (DESIGN.md section 8), or the
  // authorization expired or was revoked.
  permit_not_authorized: { status: 403, type: "permission_error" },
  model_not_found: { status: 404, type: "not_found_error" },
  offer_not_found: { status: 404, type: "not_found_error" },
  request_not_found: { status: 404, type: "not_found_error" },
  quote_not_found: { status: 404, type: "not_found_error" },
  // No permit authorization with this id (held by the calling key, for a revocation by the key).
  authorization_not_found: { status: 404, type: "not_found_error" },
  route_not_found: { status: 404, type: "not_found_error" },
  method_not_allowed: { status: 405, type: "invalid_request_error" },
  quote_expired: { status: 409, type: "conflict_error" },
  quote_mismatch: { status: 409, type: "conflict_error" },
  quote_used: { status: 409, type: "conflict_error" },
  tariff_changed: { status: 409, type: "conflict_error" },
  nonce_used: { status: 409, type: "conflict_error" },
  idempotency_in_progress: { status: 409, type: "conflict_error" },
  // The answer to this Idempotency-Key was larger than IDEMPOTENCY_MAX_RESULT_BYTES: not kept.
  idempotency_result_too_large: { status: 409, type: "conflict_error" },
  // The request body did not arrive within BODY_TIMEOUT_MS.
  request_timeout: { status: 408, type: "invalid_request_error" },
  request_too_large: { status: 413, type: "invalid_request_error" },
  unsupported_media_type: { status: 415, type: "invalid_request_error" },
  idempotency_key_reused: { status: 422, type: "invalid_request_error" },
  // A provider endpoint failed verification; the code names the check.
  model_not_listed: { status: 422, type: "invalid_request_error" },
  completion_failed: { status: 422, type: "invalid_request_error" },
  stream_failed: { status: 422, type: "invalid_request_error" },
  usage_missing: { status: 422, type: "invalid_request_error" },
  // Over the API key's request rate or its concurrent streams (per replica); carries Retry-After.
  rate_limited: { status: 429, type: "rate_limit_error" },
  offer_at_capacity: { status: 429, type: "rate_limit_error" },
  internal_error: { status: 500, type: "api_error" },
  not_implemented: { status: 501, type: "api_error" },
  upstream_error: { status: 502, type: "api_error" },
  endpoint_unreachable: { status: 502, type: "api_error" },
  no_eligible_offer: { status: 503, type: "service_unavailable" },
  upstream_unavailable: { status: 503, type: "service_unavailable" },
  chain_unavailable: { status: 503, type: "service_unavailable" },
  database_unavailable: { status: 503, type: "service_unavailable" },
  // This gateway has no settlement account configured (SETTLEMENT_PRIVATE_KEY).
  settlement_unavailable: { status: 503, type: "service_unavailable" },
  // The process is stopping (SIGTERM): a request arriving now, or one cut at the end of the grace.
  shutting_down: { status: 503, type: "service_unavailable" },
} as const satisfies Record<string, { status: number; type: string }>;

export type ErrorCode = keyof typeof errorCodes;

export function isErrorCode(value: string): value is ErrorCode {
  return Object.hasOwn(errorCodes, value);
}

/**
 * A failure with a stable, client-visible code. `message` is shown to the
 * client, so it must never contain a secret; `cause` is for logs only.
 */
export class GatewayError extends Error {
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

  get status(): number {
    return errorCodes[this.code].status;
  }

  get type(): string {
    return errorCodes[this.code].type;
  }
}
