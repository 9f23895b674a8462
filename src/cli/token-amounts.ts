import { call, type GatewayConnection } from "../clients/gateway-call.js";
import {
  formatAmountExact,
  tokenDecimals,
  tokenSymbol,
  type TokenUnits,
} from "../domain/token-units.js";

/** A model as far as its amounts' units go (`GET /v1/models/{ref}`). */
interface ModelUnitsJson {
  credit_token_decimals?: number | null;
  credit_token_symbol?: string | null;
}

/**
 * A model's credit token units as the gateway states them, checked again before a terminal
 * prints them (the symbol is a token contract's answer; a gateway of another version, or another
 * gateway, may pass on anything).
 */
export async function gatewayModelUnits(
  gateway: GatewayConnection,
  model: string,
): Promise<TokenUnits> {
  const found = await call<ModelUnitsJson>(
    gateway,
    "GET",
    `/v1/models/${encodeURIComponent(model)}`,
  );
  return {
    decimals: tokenDecimals(found.credit_token_decimals ?? undefined),
    symbol: tokenSymbol(found.credit_token_symbol ?? undefined),
  };
}

/**
 * `view` with the amounts at `keys` (decimal strings of base units, as the API states them)
 * written for a person: token units with the symbol, the exact base units beside them.
 */
export function withTokenUnits<T extends object>(
  view: T,
  keys: readonly (keyof T & string)[],
  units: TokenUnits,
): T {
  const out = { ...view } as Record<string, unknown>;
  for (const key of keys) {
    const value = view[key];
    if (typeof value === "string" && /^[0-9]+$/.test(value))
      out[key] = formatAmountExact(BigInt(value), units);
  }
  return out as T;
}
