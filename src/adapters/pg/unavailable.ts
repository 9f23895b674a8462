/**
 * Whether an error from `pg` means the database could not be asked (down, unreachable, hung,
 * restarting, out of connections, the pool's wait or a timeout expired), as opposed to a query
 * it refused. The API answers those with 503 `database_unavailable` rather than 500, on every
 * route, also where no call site maps them itself (docs/operations.md, "Database").
 */
const networkCodes = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
]);

/** SQLSTATEs of an unavailable server: connection exceptions (class 08) and these. */
const unavailableStates = new Set([
  "57P01", // admin_shutdown (pg_terminate_backend)
  "57P02", // crash_shutdown
  "57P03", // cannot_connect_now (starting up, shutting down)
  "53300", // too_many_connections
  "57014", // query_canceled (statement_timeout)
]);

/** Messages `pg` (and its pool) gives without a code. */
const unavailableMessages = [
  /^timeout exceeded when trying to connect/i,
  /^connection terminated/i,
  /^query read timeout/i,
  /^client has encountered a connection error/i,
  /^connection is not open/i,
  /^client was closed and is not queryable/i,
];

export function isDatabaseUnavailable(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") {
      if (networkCodes.has(code) || unavailableStates.has(code) || code.startsWith("08"))
        return true;
    }
    if (unavailableMessages.some((m) => m.test(e instanceof Error ? e.message : ""))) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}
