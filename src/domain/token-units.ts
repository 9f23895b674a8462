/**
 * Amounts as a person reads them (issue 38, item 3; DESIGN.md section 13): a credit token's base
 * units written in whole tokens with the token's decimals and symbol, by exact decimal
 * arithmetic on bigint (never a float). The API keeps base units and gives the decimals and
 * symbol beside them; the console and the CLI write amounts with these functions.
 *
 * A token's decimals and symbol are what its contract answered (`decimals()`, `symbol()`), and a
 * contract can answer anything: {@link tokenDecimals} and {@link tokenSymbol} keep only values a
 * page or a terminal can show safely, and a token that answered nothing usable is "unknown",
 * shown in base units (never guessed as 18: a guess would show a wrong amount as if exact).
 */

/** A credit token's decimals and symbol, each undefined when unknown. */
export interface TokenUnits {
  readonly decimals?: number | undefined;
  readonly symbol?: string | undefined;
}

/** The most decimals shown in token units (10^36 already exceeds any real token's supply). */
export const maxTokenDecimals = 36;
/** The longest symbol shown (characters; ERC-20 symbols are short tickers). */
export const maxTokenSymbolLength = 16;

// ASCII letters and digits and a few ticker punctuation marks: no control character (a terminal
// escape), no markup, no space, and no look-alike letter from another script posing as a
// well-known ticker ("USDС" with a Cyrillic С).
const symbolPattern = /^[A-Za-z0-9$._+-]+$/;

/** A token's `decimals()` answer if it is one to write amounts with, else undefined. */
export function tokenDecimals(value: bigint | number | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = BigInt(value);
  return n >= 0n && n <= BigInt(maxTokenDecimals) ? Number(n) : undefined;
}

/** A token's `symbol()` answer if it is safe to show (see {@link symbolPattern}), else undefined. */
export function tokenSymbol(value: string | undefined): string | undefined {
  if (value === undefined || value.length === 0 || value.length > maxTokenSymbolLength)
    return undefined;
  return symbolPattern.test(value) ? value : undefined;
}

/**
 * `amount` base units in whole tokens, exactly: `1500000000000000000n`, 18 -> `"1.5"`; trailing
 * fractional zeros dropped; negative amounts keep their sign.
 */
export function unitsText(amount: bigint, decimals: number): string {
  const negative = amount < 0n;
  const digits = (negative ? -amount : amount).toString().padStart(decimals + 1, "0");
  const whole = digits.slice(0, digits.length - decimals);
  const fraction = digits.slice(digits.length - decimals).replace(/0+$/, "");
  return `${negative ? "-" : ""}${whole}${fraction === "" ? "" : `.${fraction}`}`;
}

/**
 * An amount for a person: `"1.5 DCHAT"`; `"1.5 units"` when the token has no symbol to show;
 * `"1500000 base units"` when its decimals are unknown.
 */
export function formatAmount(amount: bigint, units: TokenUnits): string {
  const decimals = tokenDecimals(units.decimals);
  if (decimals === undefined) return `${amount} base units`;
  return `${unitsText(amount, decimals)} ${tokenSymbol(units.symbol) ?? "units"}`;
}

/**
 * An amount for a person that may also be copied exactly: the token units first, the base units
 * in parentheses (`"1.5 DCHAT (1500000000000000000 base units)"`); base units alone when the
 * decimals are unknown.
 */
export function formatAmountExact(amount: bigint, units: TokenUnits): string {
  if (tokenDecimals(units.decimals) === undefined) return `${amount} base units`;
  return `${formatAmount(amount, units)} (${amount} base units)`;
}

/** A price per million tokens for a person: `"2 DCHAT per million tokens"`. */
export function formatPricePerMTok(amount: bigint, units: TokenUnits): string {
  return `${formatAmount(amount, units)} per million tokens`;
}
