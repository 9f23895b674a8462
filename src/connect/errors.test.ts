import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { GatewayError, recognizeDatabaseUnavailable } from "../domain/errors.js";
import { errorCodeOf, toConnectError } from "./errors.js";

/**
 * A stand-in for the database adapter's check (src/app/storage.ts installs the real one, which
 * another test file of this process may have installed already: the outage here is one only
 * the stand-in recognises).
 */
const outage = new Error("the stand-in database outage");
const isOutage = (error: unknown) => error === outage;

describe("toConnectError", () => {
  // One file, in order: the check is process-wide once installed.
  it("answers an unknown failure with internal_error until a check recognises it", () => {
    const error = toConnectError(outage);
    expect(error.code).toBe(Code.Internal);
    expect(errorCodeOf(error)).toBe("internal_error");
    expect(error.rawMessage).toBe("internal error");
  });

  it("answers what the installed check recognises with 503 database_unavailable, cause kept", () => {
    recognizeDatabaseUnavailable(isOutage);
    recognizeDatabaseUnavailable(isOutage);
    const error = toConnectError(outage);
    expect(error.code).toBe(Code.Unavailable);
    expect(errorCodeOf(error)).toBe("database_unavailable");
    expect(error.rawMessage).toBe("the database is unavailable");
    expect((error.cause as GatewayError).cause).toBe(outage);

    const other = toConnectError(new Error("duplicate key"));
    expect(errorCodeOf(other)).toBe("internal_error");
  });

  it("keeps a gateway error's own code", () => {
    const error = toConnectError(new GatewayError("quote_expired", "the quote expired"));
    expect(errorCodeOf(error)).toBe("quote_expired");
    expect(error.code).toBe(Code.Aborted);
  });
});
