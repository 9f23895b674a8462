import { BaseError } from "../domain/base-error.js";

/** An amount or a duration a person typed that does not say one exact thing (a usage error). */
export class AmountError extends BaseError {
  override readonly name = "AmountError";
  readonly reason = "usage";
}

/**
 * An amount as typed for `flag`, either base units (`1000000`, whole numbers only: what the API
 * states) or token units (`12.5tokens`, or `12.5` with `tokens` true), converted with the token's
 * `decimals` by exact decimal arithmetic: a fraction finer than the token's smallest unit is
 * refused, never rounded. A token whose decimals are unknown takes base units only.
 */
export function parseTokenAmount(
  text: string,
  flag: string,
  decimals: number | undefined,
  tokens = false,
): bigint {
  const match = /^(\d+)(?:\.(\d+))?\s*(tokens?)?$/.exec(text.trim());
  if (match === null)
    throw new AmountError(
      `${flag} must be base units (1000000) or tokens (12.5tokens), got "${text}"`,
    );
  const [, whole, fraction, suffix] = match as unknown as [string, string, string?, string?];
  const inTokens = tokens || suffix !== undefined;
  if (!inTokens) {
    if (fraction !== undefined)
      throw new AmountError(
        `${flag} in base units is a whole number; for tokens write "${text}tokens" or add --tokens`,
      );
    return BigInt(whole);
  }
  if (decimals === undefined)
    throw new AmountError(
      `${flag} ${text}: the token's decimals are unknown (it does not answer decimals(), or they were not read), so give base units`,
    );
  const digits = fraction ?? "";
  if (digits.length > decimals)
    throw new AmountError(
      `${flag} ${text}: the token has ${decimals} decimals, so at most ${decimals} fractional digits`,
    );
  return BigInt(whole) * 10n ** BigInt(decimals) + BigInt(digits.padEnd(decimals, "0") || "0");
}

/**
 * A deposit as typed ({@link parseTokenAmount}). Zero is refused (the market refuses an empty
 * permit).
 */
export function parseDeposit(text: string, decimals: number | undefined, tokens = false): bigint {
  const amount = parseTokenAmount(text, "--deposit", decimals, tokens);
  if (amount === 0n) throw new AmountError("--deposit must be more than 0");
  return amount;
}

/**
 * A credit cap or threshold as typed (`--total-cap`, `--per-request-cap`, `--period-cap`,
 * `--warn-at`; {@link parseTokenAmount}), as the decimal string of base units the typed data
 * signs; "0" is none. At most 2^256 - 1 (uint256).
 */
export function parseCredits(
  text: string,
  flag: string,
  decimals: number | undefined,
  tokens = false,
): string {
  const amount = parseTokenAmount(text, flag, decimals, tokens);
  if (amount >= 1n << 256n) throw new AmountError(`${flag} is above 2^256 - 1 base units`);
  return amount.toString();
}

const unitSeconds: Record<string, bigint> = { s: 1n, m: 60n, h: 3600n, d: 86_400n, w: 604_800n };

/** A duration as typed: seconds (`3600`), or a number with a unit, `s|m|h|d|w` (`30d`). */
export function parseDuration(text: string): bigint {
  const match = /^(\d{1,12})\s*([smhdw])?$/.exec(text.trim());
  if (match === null)
    throw new AmountError(`--expires-in must be seconds or e.g. 30d, 12h, 90m, got "${text}"`);
  const seconds = BigInt(match[1]!) * unitSeconds[match[2] ?? "s"]!;
  if (seconds === 0n) throw new AmountError("--expires-in must be more than 0");
  return seconds;
}
