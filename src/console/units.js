/**
 * Amounts as a person reads them (issue 38, item 3): the API's base units written in the credit
 * token's units with its symbol, by exact decimal arithmetic on BigInt (never a float). The same
 * rules as src/domain/token-units.ts (the CLI's), which test/console-units.test.ts checks this
 * module against: a token's decimals above 36, or a symbol that is not 1-16 ASCII letters, digits
 * or `$._+-`, are not used, and an amount of a token whose decimals are unknown stays in base
 * units (never guessed as 18).
 */

export const maxTokenDecimals = 36;
const symbolPattern = /^[A-Za-z0-9$._+-]{1,16}$/;

/**
 * A model's token units as the API gives them (`credit_token_decimals`, `credit_token_symbol`),
 * checked again before a page shows them.
 * @param {{ credit_token_decimals?: number | null, credit_token_symbol?: string | null }} model
 * @returns {{ decimals?: number, symbol?: string }}
 */
export function tokenUnits(model) {
  const d = model.credit_token_decimals;
  const s = model.credit_token_symbol;
  return {
    ...(Number.isInteger(d) && d >= 0 && d <= maxTokenDecimals ? { decimals: d } : {}),
    ...(typeof s === "string" && symbolPattern.test(s) ? { symbol: s } : {}),
  };
}

/**
 * `amount` base units (a decimal string) in whole tokens: ("1500000000000000000", 18) -> "1.5".
 * @param {string} amount
 * @param {number} decimals
 */
export function unitsText(amount, decimals) {
  const negative = amount.startsWith("-");
  const digits = BigInt(negative ? amount.slice(1) : amount)
    .toString()
    .padStart(decimals + 1, "0");
  const whole = digits.slice(0, digits.length - decimals);
  const fraction = digits.slice(digits.length - decimals).replace(/0+$/, "");
  return `${negative ? "-" : ""}${whole}${fraction === "" ? "" : `.${fraction}`}`;
}

/**
 * An amount for a person: "1.5 DCHAT"; "1.5 units" without a symbol to show; base units, digits
 * grouped, when the decimals are unknown ("1 500 000 base units").
 * @param {string} amount base units, a decimal string
 * @param {{ decimals?: number, symbol?: string }} units
 */
export function amountText(amount, units) {
  if (!/^-?\d+$/.test(amount)) return amount;
  if (units.decimals === undefined)
    return `${amount.replace(/\B(?=(\d{3})+(?!\d))/g, "\u202f")} base units`;
  return `${unitsText(amount, units.decimals)} ${units.symbol ?? "units"}`;
}

/** @type {Map<string, Promise<Record<string, any> | undefined>>} */
const known = new Map();

/**
 * A model by its id or public id (`GET /v1/models/{ref}`), asked once per page; undefined when
 * it cannot be read (asked again next time).
 * @param {import("./api.js").Api} api
 * @param {string} ref
 */
export function modelOf(api, ref) {
  let model = known.get(ref);
  if (model === undefined) {
    model = api.get(`/v1/models/${encodeURIComponent(ref)}`).then(
      (m) => m,
      () => {
        known.delete(ref);
        return undefined;
      },
    );
    known.set(ref, model);
  }
  return model;
}

/**
 * A model's token units by its id or public id; unknown when the model cannot be read (its
 * amounts then stay in base units).
 * @param {import("./api.js").Api} api
 * @param {string} ref
 */
export async function modelUnits(api, ref) {
  const model = await modelOf(api, ref);
  return model === undefined ? {} : tokenUnits(model);
}

/**
 * An amount rounded to `significant` digits for a derived figure (a rate, an axis label), where
 * every digit of an exact value is noise: ("12571428571", 18 decimals) -> "≈0.00000001257 DCHAT".
 * Exact on BigInt; "≈" says when rounding changed the value.
 * @param {bigint} amount base units
 * @param {{ decimals?: number, symbol?: string }} units
 * @param {number} [significant]
 */
export function roughAmountText(amount, units, significant = 4) {
  const negative = amount < 0n;
  const abs = negative ? -amount : amount;
  const digits = abs.toString().length;
  if (digits <= significant) return amountText(amount.toString(), units);
  const scale = 10n ** BigInt(digits - significant);
  const rounded = ((abs + scale / 2n) / scale) * scale;
  const text = amountText((negative ? -rounded : rounded).toString(), units);
  return rounded === abs ? text : `≈${text}`;
}
