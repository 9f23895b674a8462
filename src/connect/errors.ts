import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "../../gen/google/rpc/error_details_pb.js";
import { asGatewayError, isErrorCode, type ErrorCode } from "../domain/errors.js";
import { wireOf } from "./error-codes.js";
import { PaymentRequiredError } from "../domain/x402/index.js";
import { encodePaymentRequiredHeader } from "@x402/core/http";

/** The header of an x402 402 (lower case, as metadata keys are). */
export const paymentRequiredHeader = "payment-required";

/** ErrorInfo.domain of every gateway error. */
export const errorDomain = "gateway.v1";

/** ErrorInfo.metadata key of the whole seconds to wait before a retry (429 `rate_limited`). */
export const retryAfterKey = "retry_after_seconds";

/**
 * The one place where a domain failure becomes a ConnectError: the Connect
 * code follows the HTTP status of the error code, and an ErrorInfo detail
 * carries the code itself (reason) and its type. Unknown failures become
 * `internal_error` with a generic message, except those that the database adapter's check
 * (installed at composition, see `recognizeDatabaseUnavailable` in domain/errors.ts) says
 * mean the database could not be asked (down, hung, out of connections): 503
 * `database_unavailable`. Their cause stays for the logs.
 * A retry delay travels in the ErrorInfo metadata and as a `retry-after` header
 * (trailer on gRPC) of the error.
 */
export function toConnectError(error: unknown): ConnectError {
  if (error instanceof ConnectError) return error;
  const gatewayError = asGatewayError(error);
  const { connect, type } = wireOf(gatewayError.code);
  const retryAfter = gatewayError.retryAfterSeconds;
  const metadata: Record<string, string> = {};
  if (retryAfter !== undefined) metadata["retry-after"] = String(retryAfter);
  // x402 (issue 37): what to pay travels as the error's PAYMENT-REQUIRED header.
  if (gatewayError instanceof PaymentRequiredError)
    metadata[paymentRequiredHeader] = encodePaymentRequiredHeader(gatewayError.paymentRequired);
  return new ConnectError(
    gatewayError.message,
    connect,
    Object.keys(metadata).length === 0 ? undefined : metadata,
    [
      {
        desc: ErrorInfoSchema,
        value: {
          reason: gatewayError.code,
          domain: errorDomain,
          metadata:
            retryAfter === undefined ? { type } : { type, [retryAfterKey]: String(retryAfter) },
        },
      },
    ],
    gatewayError,
  );
}

/** The whole seconds a ConnectError asks the caller to wait before retrying, if it says. */
export function retryAfterOf(error: ConnectError): number | undefined {
  for (const info of error.findDetails(ErrorInfoSchema)) {
    const raw = info.domain === errorDomain ? info.metadata[retryAfterKey] : undefined;
    if (raw !== undefined && /^\d{1,9}$/.test(raw)) return Math.max(1, Number(raw));
  }
  return undefined;
}

/** Error codes for ConnectErrors that carry no ErrorInfo (raised by connect itself). */
const fallbackCodeForConnectCode: Partial<Record<Code, ErrorCode>> = {
  [Code.InvalidArgument]: "invalid_request",
  [Code.Unauthenticated]: "invalid_api_key",
  [Code.NotFound]: "route_not_found",
  [Code.Unimplemented]: "not_implemented",
  [Code.ResourceExhausted]: "request_too_large",
  [Code.Unavailable]: "upstream_unavailable",
  [Code.DeadlineExceeded]: "upstream_unavailable",
};

/** The gateway error code a ConnectError stands for. */
export function errorCodeOf(error: ConnectError): ErrorCode {
  for (const info of error.findDetails(ErrorInfoSchema)) {
    if (info.domain === errorDomain && isErrorCode(info.reason)) return info.reason;
  }
  return fallbackCodeForConnectCode[error.code] ?? "internal_error";
}
