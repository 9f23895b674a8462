/** What `gateway permit` reads of its arguments, and its usage errors. */
import { parseArgs } from "node:util";
import { isAddress, type Address, type Hex } from "viem";
import type { GatewayClientConfig } from "../config.js";
import { BaseError } from "../domain/base-error.js";
import { isHex32 } from "../domain/hex.js";
import type { GatewayConnection } from "../clients/gateway-call.js";
import { signingFlags } from "./signing.js";

export class PermitUsageError extends BaseError {
  override readonly name = "PermitUsageError";
  readonly reason = "usage";
}

/** The chain answered, but not the chain the payer configured: nothing was signed. */
export class WrongChainError extends BaseError {
  override readonly name = "WrongChainError";
  readonly reason = "usage";
}

/** The arguments of `gateway permit`: its flags and positionals. */
export function parsePermitArgs(args: string[]) {
  return parseArgs({
    args,
    allowPositionals: true,
    options: {
      permit: { type: "string" },
      "key-id": { type: "string" },
      "total-cap": { type: "string" },
      "per-request-cap": { type: "string" },
      period: { type: "string" },
      "period-cap": { type: "string" },
      "warn-at": { type: "string" },
      yes: { type: "boolean" },
      "expires-at": { type: "string" },
      "expires-in": { type: "string" },
      payer: { type: "string" },
      ...signingFlags,
      offer: { type: "string" },
      deposit: { type: "string" },
      tokens: { type: "boolean" },
      id: { type: "string" },
      json: { type: "boolean" },
      key: { type: "string" },
      all: { type: "boolean" },
    },
  });
}

export type PermitFlags = ReturnType<typeof parsePermitArgs>["values"];

export function permitIdArg(raw: string | undefined): Hex {
  if (raw === undefined || !isHex32(raw))
    throw new PermitUsageError("a permit id (0x + 64 hex digits) is required");
  return raw.toLowerCase() as Hex;
}

export function gatewayOf(config: GatewayClientConfig | undefined): GatewayConnection {
  if (config === undefined)
    throw new PermitUsageError("set GATEWAY_URL and GATEWAY_API_KEY (or --gateway and --api-key)");
  return config;
}

export function payerArg(raw: string | undefined): Address | undefined {
  if (raw !== undefined && !isAddress(raw, { strict: false }))
    throw new PermitUsageError("--payer must be an address (0x + 40 hex digits)");
  return raw as Address | undefined;
}

/** `--expires-at UNIX_SECONDS` or `--expires-in DURATION` (not both), as given. */
export function expiryFlags(values: Readonly<Record<string, unknown>>): {
  expiresAtArg: string | undefined;
  expiresIn: string | undefined;
} {
  const expiresAtArg = values["expires-at"] as string | undefined;
  const expiresIn = values["expires-in"] as string | undefined;
  if (expiresAtArg !== undefined && expiresIn !== undefined)
    throw new PermitUsageError("give --expires-at or --expires-in, not both");
  if (expiresAtArg !== undefined && !/^[1-9]\d{0,15}$/.test(expiresAtArg))
    throw new PermitUsageError("--expires-at must be Unix seconds");
  return { expiresAtArg, expiresIn };
}
