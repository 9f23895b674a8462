import { Code } from "@connectrpc/connect";
import { errorCodes, errorTypes, type ErrorCode, type ErrorKind } from "../domain/errors.js";

/**
 * How each kind of gateway error is shown on the wire: its HTTP status (REST, and the status
 * the OpenAPI document lists) and its Connect code (gRPC, Connect). The domain names kinds
 * (src/domain/errors.ts); statuses live here.
 */
export const wireOfKind: Readonly<Record<ErrorKind, { status: number; connect: Code }>> = {
  invalid: { status: 400, connect: Code.InvalidArgument },
  unauthenticated: { status: 401, connect: Code.Unauthenticated },
  payment: { status: 402, connect: Code.FailedPrecondition },
  forbidden: { status: 403, connect: Code.PermissionDenied },
  not_found: { status: 404, connect: Code.NotFound },
  method: { status: 405, connect: Code.Unimplemented },
  timeout: { status: 408, connect: Code.DeadlineExceeded },
  conflict: { status: 409, connect: Code.Aborted },
  too_large: { status: 413, connect: Code.ResourceExhausted },
  media_type: { status: 415, connect: Code.InvalidArgument },
  unprocessable: { status: 422, connect: Code.FailedPrecondition },
  rate_limited: { status: 429, connect: Code.ResourceExhausted },
  internal: { status: 500, connect: Code.Internal },
  not_implemented: { status: 501, connect: Code.Unimplemented },
  bad_gateway: { status: 502, connect: Code.Unavailable },
  unavailable: { status: 503, connect: Code.Unavailable },
};

/** A code's HTTP status, error type and Connect code. */
export function wireOf(code: ErrorCode): { status: number; type: string; connect: Code } {
  const kind = errorCodes[code];
  return { ...wireOfKind[kind], type: errorTypes[kind] };
}

/** The HTTP status of a code (REST answers, the OpenAPI document). */
export function httpStatusOf(code: ErrorCode): number {
  return wireOfKind[errorCodes[code]].status;
}
