/**
 * A gasless first payment (issue 37 item 6; docs/decisions/agent-payments.md): x402's
 * `eip2612GasSponsoring` extension. A 402 whose credit token takes EIP-2612 declares it; a payer
 * without a Permit2 allowance then signs, beside its Permit2 transfer, the token's
 * `permit(owner, Permit2, value, deadline)`, which the settlement submits (the operator pays the
 * gas) in the batch that carries the payment. Here: the declaration, and the checks of a signed
 * approval that need no chain (its nonce against the token's is the simulation's).
 */
import {
  getAddress,
  isAddress,
  isHex,
  recoverTypedDataAddress,
  type Address,
  type Hex,
} from "viem";
import { GatewayError } from "../errors.js";

/** The extension's key in `PAYMENT-REQUIRED` and in the payment's `extensions`. */
export const eip2612Extension = "eip2612GasSponsoring";

/** A credit token's EIP-712 domain (name, version), known when the token takes EIP-2612. */
export interface AssetDomain {
  readonly name: string;
  readonly version: string;
}

/** A payer's signed EIP-2612 approval of Permit2 on the payment's token, checked. */
export interface Permit2Approval {
  /** The allowance it sets (at least the payment's signed amount). */
  readonly value: bigint;
  /** The token's EIP-2612 nonce it was signed for (the token checks it when submitted). */
  readonly nonce: bigint;
  /** Unix seconds. */
  readonly deadline: bigint;
  readonly signature: Hex;
}

const addressPattern = "^0x[a-fA-F0-9]{40}$";
const uintPattern = "^[0-9]+$";
const field = (pattern: string, description: string) => ({
  type: "string",
  pattern,
  description,
});

/**
 * The extension as x402 v2 declares it in `PAYMENT-REQUIRED.extensions` (the spec's
 * `eip2612GasSponsoring`: a description and version the server gives, the schema of what the
 * client fills in).
 */
export function eip2612Declaration(): Record<string, unknown> {
  return {
    [eip2612Extension]: {
      info: {
        description:
          "The facilitator accepts EIP-2612 gasless Permit to `Permit2` canonical contract.",
        version: "1",
      },
      schema: {
        $schema: "https://json-schema.org/draft/2020-12/schema",
        type: "object",
        properties: {
          from: field(addressPattern, "The address of the sender."),
          asset: field(addressPattern, "The address of the ERC-20 token contract."),
          spender: field(addressPattern, "The address of the spender (Canonical Permit2)."),
          amount: field(uintPattern, "The amount to approve (uint256). Typically MaxUint."),
          nonce: field(uintPattern, "The current nonce of the sender."),
          deadline: field(uintPattern, "The timestamp at which the signature expires."),
          signature: field(
            "^0x[a-fA-F0-9]+$",
            "The 65-byte concatenated signature (r, s, v) as a hex string.",
          ),
          version: field("^[0-9]+(\\.[0-9]+)*$", "Schema version identifier."),
        },
        required: [
          "from",
          "asset",
          "spender",
          "amount",
          "nonce",
          "deadline",
          "signature",
          "version",
        ],
      },
    },
  };
}

const eip2612Types = {
  Permit: [
    { name: "owner", type: "address" },
    { name: "spender", type: "address" },
    { name: "value", type: "uint256" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
} as const;

const invalid = (message: string) => new GatewayError("eip2612_permit_invalid", message);

function text(info: Record<string, unknown>, key: string): string {
  const value = info[key];
  if (typeof value === "string" && value.length <= 200) return value;
  throw invalid(`the EIP-2612 approval's ${key} is missing or not a string`);
}

function uintOf(info: Record<string, unknown>, key: string): bigint {
  const value = text(info, key);
  if (!/^(0|[1-9][0-9]{0,77})$/.test(value))
    throw invalid(`the EIP-2612 approval's ${key} must be a decimal unsigned integer`);
  return BigInt(value);
}

function addressOf(info: Record<string, unknown>, key: string): Address {
  const value = text(info, key);
  if (!isAddress(value, { strict: false }))
    throw invalid(`the EIP-2612 approval's ${key} is not an address`);
  return getAddress(value);
}

/** What a signed approval is checked against: the payment it rides and the gateway's terms. */
export interface ApprovalCheck {
  readonly chainId: number;
  readonly permit2: Address;
  readonly payer: Address;
  readonly token: Address;
  readonly signedAmount: bigint;
  /** The token's EIP-712 domain; undefined: the token takes no EIP-2612 approval here. */
  readonly domain: AssetDomain | undefined;
  /** Unix seconds. */
  readonly now: number;
  readonly minValiditySeconds: number;
}

/**
 * The payment's EIP-2612 approval of Permit2, if it carries one (the client fills the declared
 * extension's `info` only when its allowance is short; the declaration alone is none): checked
 * for its owner (the payer), token (the payment's), spender (Permit2), value (at least the
 * signed amount), deadline (long enough to serve and settle) and signature (recovering the
 * owner). Throws `eip2612_permit_invalid` or `eip2612_permit_expired` naming what failed.
 */
export async function checkApproval(
  extensions: unknown,
  check: ApprovalCheck,
): Promise<Permit2Approval | undefined> {
  const extension = (extensions as Record<string, unknown> | null | undefined)?.[eip2612Extension];
  if (extension === undefined || extension === null) return undefined;
  const info = (extension as { info?: unknown }).info;
  if (info === null || typeof info !== "object") throw invalid("the EIP-2612 approval has no info");
  const fields = info as Record<string, unknown>;
  // The declaration echoed back (description, version) without a signature: no approval.
  if (fields.signature === undefined && fields.from === undefined) return undefined;
  if (check.domain === undefined)
    throw invalid(`token ${check.token} takes no EIP-2612 approval at this gateway`);
  const from = addressOf(fields, "from");
  const asset = addressOf(fields, "asset");
  const spender = addressOf(fields, "spender");
  const value = uintOf(fields, "amount");
  const nonce = uintOf(fields, "nonce");
  const deadline = uintOf(fields, "deadline");
  const signature = text(fields, "signature");
  if (!isHex(signature) || signature.length !== 132)
    throw invalid("the EIP-2612 approval's signature is not a 65-byte hex signature");
  if (from !== check.payer)
    throw invalid(`the EIP-2612 approval is from ${from}, the payment from ${check.payer}`);
  if (asset !== check.token)
    throw invalid(`the EIP-2612 approval is for token ${asset}, the payment in ${check.token}`);
  if (spender !== check.permit2)
    throw invalid(`the EIP-2612 approval's spender must be Permit2 ${check.permit2}`);
  if (value < check.signedAmount)
    throw invalid(
      `the EIP-2612 approval allows ${value}, the payment moves up to ${check.signedAmount}`,
    );
  if (deadline < BigInt(check.now + check.minValiditySeconds))
    throw new GatewayError(
      "eip2612_permit_expired",
      `the EIP-2612 approval's deadline ${deadline} leaves less than ${check.minValiditySeconds} s to serve and settle it`,
    );
  let recovered: Address;
  try {
    recovered = await recoverTypedDataAddress({
      domain: { ...check.domain, chainId: check.chainId, verifyingContract: check.token },
      types: eip2612Types,
      primaryType: "Permit",
      message: { owner: from, spender, value, nonce, deadline },
      signature,
    });
  } catch {
    throw invalid("the EIP-2612 approval's signature does not recover");
  }
  if (recovered !== from) throw invalid(`the EIP-2612 approval was not signed by ${from}`);
  return { value, nonce, deadline, signature };
}
