import { pino, type DestinationStream, type Logger } from "pino";
import type { LogLevel } from "../config.js";

/**
 * The one list of field names that hold a secret: pino censors each of them wherever it appears
 * in a log record, at the top level or one or two objects down ({@link redactPaths}). Secrets
 * are also kept out of log calls in the first place; this is the net under that rule.
 *
 * Every setting of src/config.ts whose name says key, token, secret or password is here, by its
 * field name and by its environment variable's (src/runtime/logger.test.ts scans the configuration
 * against this list, so a new secret setting cannot be forgotten), with the URLs that may carry
 * credentials.
 */
export const secretFields: readonly string[] = [
  // What a request carries: `Authorization: Bearer <API key>`, Anthropic's `x-api-key`.
  "authorization",
  "x-api-key",
  "apiKey",
  "key",
  "token",
  "secret",
  "password",
  "privateKey",
  // Settings (src/config.ts) and the environment variables they are read from.
  "settlementOperatorToken",
  "SETTLEMENT_OPERATOR_TOKEN",
  "settlementPrivateKey",
  "SETTLEMENT_PRIVATE_KEY",
  "receiptPrivateKey",
  "RECEIPT_PRIVATE_KEY",
  "auditApiKey",
  "AUDIT_API_KEY",
  "endpointEncryptionKey",
  "ENDPOINT_ENCRYPTION_KEY",
  "GATEWAY_API_KEY",
  "databaseUrl",
  "DATABASE_URL",
  "databaseDirectUrl",
  "DATABASE_DIRECT_URL",
  "otlpTracesEndpoint",
  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
  "OTEL_EXPORTER_OTLP_ENDPOINT",
  // A provider's endpoint and its bearer token (sealed in the database).
  "endpointUrl",
  "endpointToken",
];

/** A field name as a redaction path segment (`a`, or `["x-api-key"]` for other characters). */
function segment(field: string): { head: string; nested: string } {
  if (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(field)) return { head: field, nested: `.${field}` };
  const quoted = `[${JSON.stringify(field)}]`;
  return { head: quoted, nested: quoted };
}

/** Paths pino censors: each of {@link secretFields} at the top level and two levels down. */
export const redactPaths: readonly string[] = secretFields.flatMap((field) => {
  const { head, nested } = segment(field);
  return [head, `*${nested}`, `*.*${nested}`];
});

export function createLogger(level: LogLevel, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: "gateway" },
      redact: { paths: [...redactPaths], censor: "[redacted]" },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}

export type { Logger };
