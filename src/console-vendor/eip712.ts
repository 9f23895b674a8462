import { getAddress, recoverTypedDataAddress, type Hex, type TypedDataDomain } from "viem";

/**
 * The market console's EIP-712 verifier: viem's recovery, bundled by scripts/bundle.mjs into one
 * same-origin browser module (`/console/vendor/eip712.js`), so the page checks a receipt's
 * signature itself instead of trusting the gateway that signed it. Generic over typed data in
 * its wallet-ready JSON form (integers as decimal strings or numbers, `EIP712Domain` listed or
 * not): what a receipt must say is the console's business (src/console/panels/receipt.js).
 */

interface TypedDataField {
  readonly name: string;
  readonly type: string;
}

/** Typed data as `eth_signTypedData_v4` takes it, as JSON carries it. */
export interface TypedDataJson {
  readonly types: Record<string, readonly TypedDataField[]>;
  readonly primaryType: string;
  readonly domain: Record<string, unknown>;
  readonly message: Record<string, unknown>;
}

/** A JSON integer (decimal string or safe number) of an int/uint field as a bigint. */
function integer(value: unknown, field: string): bigint {
  if (typeof value === "number" && Number.isSafeInteger(value)) return BigInt(value);
  if (typeof value === "string" && /^-?\d{1,78}$/.test(value)) return BigInt(value);
  throw new RangeError(`${field} is not an integer`);
}

/** A struct's members, integers as bigints, nested structs and arrays converted too. */
function convert(
  types: Record<string, readonly TypedDataField[]>,
  type: string,
  value: unknown,
  path: string,
): unknown {
  const array = /^(.*)\[(\d*)\]$/.exec(type);
  if (array !== null) {
    if (!Array.isArray(value)) throw new RangeError(`${path} is not an array`);
    return value.map((item, i) => convert(types, array[1]!, item, `${path}[${i}]`));
  }
  const fields = types[type];
  if (fields !== undefined) {
    if (typeof value !== "object" || value === null) throw new RangeError(`${path} is missing`);
    const struct = value as Record<string, unknown>;
    return Object.fromEntries(
      fields.map((f) => [f.name, convert(types, f.type, struct[f.name], `${path}.${f.name}`)]),
    );
  }
  if (/^u?int\d*$/.test(type)) return integer(value, path);
  return value;
}

/**
 * The address whose key signed `typed` (checksummed). Throws on a malformed message or
 * signature; a well-formed signature by another key recovers another address.
 */
export async function recoverTypedDataSigner(
  typed: TypedDataJson,
  signature: string,
): Promise<string> {
  // viem derives EIP712Domain from the domain itself; listed, it would be checked twice.
  const types = Object.fromEntries(
    Object.entries(typed.types).filter(([name]) => name !== "EIP712Domain"),
  );
  const message = convert(types, typed.primaryType, typed.message, "message") as Record<
    string,
    unknown
  >;
  const domain = { ...typed.domain } as Record<string, unknown>;
  if (domain.chainId !== undefined) domain.chainId = integer(domain.chainId, "domain.chainId");
  return recoverTypedDataAddress({
    domain: domain as TypedDataDomain,
    types,
    primaryType: typed.primaryType,
    message,
    signature: signature as Hex,
  });
}

/** Whether two strings are the same address (any case); false when either is not one. */
export function sameAddress(a: unknown, b: unknown): boolean {
  try {
    return getAddress(String(a)) === getAddress(String(b));
  } catch {
    return false;
  }
}
