import { ConnectError } from "@connectrpc/connect";
import {
  errorCodeOf,
  paymentRequiredHeader,
  retryAfterOf,
  toConnectError,
} from "../connect/errors.js";
import type { Static } from "@sinclair/typebox";
import { wireOf } from "../connect/error-codes.js";
import type { ErrorCode } from "../domain/errors.js";
import type { ErrorBody as ErrorBodySchema } from "./views/resources.js";

/** The spec's error body (its schema: src/rest/views/resources.ts), its code one of the gateway's. */
export type ErrorBody = Static<typeof ErrorBodySchema> & {
  error: { code: ErrorCode };
};

/**
 * The one place where a failure becomes the spec's error body and an HTTP
 * status: whatever was thrown goes through the same domain -> ConnectError
 * mapping the RPCs use, and the ErrorInfo code picks status and type. `headers`
 * are the ones the answer must carry: `WWW-Authenticate` on a 401, an integer
 * `Retry-After` (seconds) when the error says when to retry (429 `rate_limited`).
 */
export function toHttpError(error: unknown): {
  status: number;
  body: ErrorBody;
  headers: Record<string, string>;
} {
  const connectError = error instanceof ConnectError ? error : toConnectError(error);
  const code = errorCodeOf(connectError);
  const { status, type } = wireOf(code);
  const message = code === "internal_error" ? "internal error" : connectError.rawMessage;
  const headers: Record<string, string> = {};
  if (status === 401) headers["www-authenticate"] = "Bearer";
  const retryAfter = retryAfterOf(connectError);
  if (retryAfter !== undefined) headers["retry-after"] = String(retryAfter);
  const paymentRequired = connectError.metadata.get(paymentRequiredHeader);
  if (paymentRequired !== null) headers[paymentRequiredHeader] = paymentRequired;
  return { status, body: { error: { code, type, message } }, headers };
}
