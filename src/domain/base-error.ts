/**
 * The base of every error this gateway throws (in viem's style): a `reason`, a stable
 * snake_case code a program can switch on (tests, logs, the CLI), the message a person reads,
 * and the cause, kept for the logs. Client-visible failures are {@link GatewayError}s
 * (src/domain/errors.ts), whose reason is the error code of the API; the others say what
 * failed inside the process (a configuration, a migration, the ledger, a lease...).
 */
export abstract class BaseError extends Error {
  abstract override readonly name: string;
  /** What went wrong, as a stable snake_case code. */
  abstract readonly reason: string;
}
