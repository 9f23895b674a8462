import type { Hex } from "viem";

const hex32 = /^0x[0-9a-fA-F]{64}$/;
const address = /^0x[0-9a-fA-F]{40}$/;

/** Hex32 as the spec defines it (any case). */
export function isHex32(value: string): value is Hex {
  return hex32.test(value);
}

export function isAddressString(value: string): value is Hex {
  return address.test(value);
}

/** The canonical (lower-case) spelling used for storage and comparison. */
export function normalizeHex<T extends string>(value: T): Hex {
  return value.toLowerCase() as Hex;
}
