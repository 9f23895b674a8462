import { BaseError } from "../domain/base-error.js";

/**
 * What every configuration of src/config.ts is read with: the environment, the log levels, the
 * error that lists every problem found, and the readers of the gateway's settings, which note a
 * problem and go on with the default so that an operator sees them all at once.
 */

export const logLevels = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
export type LogLevel = (typeof logLevels)[number];

export class ConfigError extends BaseError {
  readonly reason = "config_invalid";
  override readonly name = "ConfigError";
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n  - ${problems.join("\n  - ")}`);
  }
}

export type Env = Readonly<Record<string, string | undefined>>;

/** Reads settings from `env`, noting each problem in `problems` (never a secret's value). */
export interface EnvReader {
  readonly problems: string[];
  /** The trimmed value; undefined when unset or empty. */
  readonly str: (key: string) => string | undefined;
  /** The value, or "" with a problem naming `what` the variable is. */
  readonly required: (key: string, what: string) => string;
  /** A whole number from `min` to `max`; `fallback` when unset. */
  readonly int: (key: string, fallback: number, min: number, max: number) => number;
  /** true/false (1/0, yes/no, on/off); `fallback` when unset. */
  readonly bool: (key: string, fallback: boolean) => boolean;
  /** A positive amount of wei as a decimal string; `fallback` when unset. */
  readonly wei: (key: string, fallback: bigint) => bigint;
}

export function envReader(env: Env): EnvReader {
  const problems: string[] = [];
  const str = (key: string): string | undefined => {
    const value = env[key]?.trim();
    return value === undefined || value === "" ? undefined : value;
  };
  return {
    problems,
    str,
    required(key, what) {
      const value = str(key);
      if (value === undefined) problems.push(`${key} is required (${what})`);
      return value ?? "";
    },
    int(key, fallback, min, max) {
      const raw = str(key);
      if (raw === undefined) return fallback;
      if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
        problems.push(`${key} must be an integer from ${min} to ${max}, got "${raw}"`);
        return fallback;
      }
      return Number(raw);
    },
    bool(key, fallback) {
      const raw = str(key)?.toLowerCase();
      if (raw === undefined) return fallback;
      if (["1", "true", "yes", "on"].includes(raw)) return true;
      if (["0", "false", "no", "off"].includes(raw)) return false;
      problems.push(`${key} must be true or false, got "${raw}"`);
      return fallback;
    },
    // Fee caps in wei, as decimal strings (amounts of money are never JS numbers).
    wei(key, fallback) {
      const raw = str(key);
      if (raw === undefined) return fallback;
      if (!/^\d{1,30}$/.test(raw) || BigInt(raw) === 0n) {
        problems.push(`${key} must be a positive integer amount of wei, got "${raw}"`);
        return fallback;
      }
      return BigInt(raw);
    },
  };
}
