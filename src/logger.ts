import { pino, type DestinationStream, type Logger } from "pino";
import type { LogLevel } from "./config.js";

/**
 * Paths pino censors wherever they appear. Secrets are also kept out of log
 * calls in the first place; this is the net under that rule.
 */
export const redactPaths = [
  "authorization",
  "*.authorization",
  "headers.authorization",
  "*.headers.authorization",
  "apiKey",
  "*.apiKey",
  "key",
  "*.key",
  "privateKey",
  "*.privateKey",
  "*.*.privateKey",
  "endpointUrl",
  "*.endpointUrl",
  "endpointToken",
  "*.endpointToken",
  "settlementOperatorToken",
  "*.settlementOperatorToken",
  "password",
  "*.password",
  "databaseUrl",
  "*.databaseUrl",
  "databaseDirectUrl",
  "*.databaseDirectUrl",
];

export function createLogger(level: LogLevel, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: "gateway" },
      redact: { paths: redactPaths, censor: "[redacted]" },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    destination,
  );
}

export type { Logger };
