import { ConnectError } from "@connectrpc/connect";
import { errorCodeOf, toConnectError } from "../connect/errors.js";
import { errorCodes, type ErrorCode } from "../domain/errors.js";

export interface ErrorBody {
  error: { code: ErrorCode; type: string; message: string };
}

/**
 * The one place where a failure becomes the spec's error body and an HTTP
 * status: whatever was thrown goes through the same domain -> ConnectError
 * mapping the RPCs use, and the ErrorInfo code picks status and type.
 */
export function toHttpError(error: unknown): { status: number; body: ErrorBody } {
  const connectError = error instanceof ConnectError ? error : toConnectError(error);
  const code = errorCodeOf(connectError);
  const { status, type } = errorCodes[code];
  const message = code === "internal_error" ? "internal error" : connectError.rawMessage;
  return { status, body: { error: { code, type, message } } };
}
