/**
 * x402 `upto` payments (issue 37, DESIGN.md section 11; docs/decisions/agent-payments.md): what
 * the gateway asks an agent to pay for one chat request (the 402's requirements), and the checks
 * of a signed payment that need no chain: its shape, what it was signed for, its signature, its
 * time window and its amount against the request's maximum. What only the chain knows (balance,
 * Permit2 allowance, the nonce unspent) is the settlement's simulation (`X402Chain.simulate`).
 */
import type { PaymentPayload, PaymentRequired, PaymentRequirements } from "@x402/core/types";
import {
  encodeAbiParameters,
  getAddress,
  isAddress,
  keccak256,
  recoverTypedDataAddress,
  toBytes,
  type Address,
  type Hex,
} from "viem";
import { GatewayError, type ErrorCode } from "../errors.js";
import type { SignatureVerifier } from "../signatures.js";
import type { PaymentItem } from "../settlement/index.js";
import {
  checkApproval,
  eip2612Declaration,
  type AssetDomain,
  type Permit2Approval,
} from "./approval.js";

/** Permit2 and the canonical upto proxy: the addresses every x402 client signs for. */
export const permit2Address: Address = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
export const uptoProxyAddress: Address = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002";

/** Permit2's `PermitWitnessTransferFrom` with the upto witness (x402's `uptoPermit2WitnessTypes`). */
export const uptoWitnessTypes = {
  PermitWitnessTransferFrom: [
    { name: "permitted", type: "TokenPermissions" },
    { name: "spender", type: "address" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
    { name: "witness", type: "Witness" },
  ],
  TokenPermissions: [
    { name: "token", type: "address" },
    { name: "amount", type: "uint256" },
  ],
  Witness: [
    { name: "to", type: "address" },
    { name: "facilitator", type: "address" },
    { name: "validAfter", type: "uint256" },
  ],
} as const;

/** Where this gateway takes x402 payments: its chain and Market (payee and facilitator). */
export interface X402Terms {
  readonly chainId: number;
  readonly market: Address;
  /**
   * How long a signature stays valid (the requirements' `maxTimeoutSeconds`): long enough for
   * the request and its settlement's batch (a few seconds), and for a slow agent to retry.
   */
  readonly maxTimeoutSeconds: number;
}

/** One priced request as the 402 offers it. */
export interface PriceAsked {
  /** The request's priced maximum (input bound, priced output limit, wake fee), base units. */
  readonly amount: bigint;
  /** The model's credit token. */
  readonly asset: Address;
  /**
   * The credit token's EIP-712 domain, known when it takes EIP-2612: the 402 then names it
   * (`extra.name`, `extra.version`) and declares x402's `eip2612GasSponsoring`.
   */
  readonly assetDomain?: AssetDomain | undefined;
  /** The route the request was made on (`resource.url`). */
  readonly url: string;
  readonly description: string;
}

/** The upto requirements this gateway accepts for `price` (one entry of the 402's `accepts`). */
export function requirementsFor(terms: X402Terms, price: PriceAsked): PaymentRequirements {
  return {
    scheme: "upto",
    network: `eip155:${terms.chainId}`,
    asset: getAddress(price.asset),
    amount: price.amount.toString(),
    payTo: terms.market,
    maxTimeoutSeconds: terms.maxTimeoutSeconds,
    extra: {
      facilitatorAddress: terms.market,
      ...(price.assetDomain === undefined
        ? {}
        : { name: price.assetDomain.name, version: price.assetDomain.version }),
    },
  };
}

/** The 402's `PAYMENT-REQUIRED` value: x402 v2, one upto entry, and why when a payment was refused. */
export function paymentRequiredFor(
  terms: X402Terms,
  price: PriceAsked,
  error?: string,
): PaymentRequired {
  return {
    x402Version: 2,
    ...(error === undefined ? {} : { error }),
    resource: { url: price.url, description: price.description, mimeType: "application/json" },
    accepts: [requirementsFor(terms, price)],
    ...(price.assetDomain === undefined ? {} : { extensions: eip2612Declaration() }),
  };
}

/**
 * A 402 that carries what to pay: the gateway's error body, and the PAYMENT-REQUIRED header the
 * REST facade writes from `paymentRequired`.
 */
/**
 * The codes of a payment refused (402 with a fresh PAYMENT-REQUIRED), besides
 * `payment_required`, which asks for one: the payment was sent and checked, and failed.
 */
export const paymentRefusalCodes = [
  "payment_invalid",
  "payment_insufficient",
  "payment_expired",
  "payment_used",
  "payment_refused",
  "permit2_allowance_required",
  "payment_exposure_exceeded",
  "payer_blocked",
  "eip2612_permit_invalid",
  "eip2612_permit_expired",
] as const satisfies readonly ErrorCode[];

export class PaymentRequiredError extends GatewayError {
  constructor(
    code: ErrorCode,
    message: string,
    readonly paymentRequired: PaymentRequired,
  ) {
    super(code, message);
  }
}

/** A signed upto payment whose shape, terms and signature checked out. */
export interface UptoPayment {
  /** The payer: the signer, checked by recovering the signature. */
  readonly payer: Address;
  readonly token: Address;
  /** The most the signature lets move (`permitted.amount`). */
  readonly signedAmount: bigint;
  readonly nonce: bigint;
  /** Unix seconds. */
  readonly deadline: bigint;
  readonly validAfter: bigint;
  readonly signature: Hex;
  /** The Permit2 transfer and witness as settlement submits them. */
  readonly permit: {
    readonly permitted: { readonly token: Address; readonly amount: bigint };
    readonly nonce: bigint;
    readonly deadline: bigint;
  };
  readonly witness: {
    readonly to: Address;
    readonly facilitator: Address;
    readonly validAfter: bigint;
  };
  /** The payer's EIP-2612 approval of Permit2, submitted with the settlement (gasless). */
  readonly approval?: Permit2Approval | undefined;
}

/** A decoded `PAYMENT-SIGNATURE` header's payer, before anything else is checked (rate limits). */
export function claimedPayer(payload: unknown): Address | undefined {
  const from = (payload as { payload?: { permit2Authorization?: { from?: unknown } } } | null)
    ?.payload?.permit2Authorization?.from;
  return typeof from === "string" && isAddress(from, { strict: false })
    ? getAddress(from)
    : undefined;
}

const uint = /^(0|[1-9][0-9]{0,77})$/;

function field(value: unknown, what: string): string {
  if (typeof value === "string" && value.length <= 200) return value;
  throw invalid(`${what} is missing or not a string`);
}

function uintOf(value: unknown, what: string): bigint {
  const text = typeof value === "number" && Number.isSafeInteger(value) ? String(value) : value;
  if (typeof text === "string" && uint.test(text)) return BigInt(text);
  throw invalid(`${what} must be a decimal unsigned integer`);
}

function addressOf(value: unknown, what: string): Address {
  const text = field(value, what);
  if (!isAddress(text, { strict: false })) throw invalid(`${what} is not an address`);
  return getAddress(text);
}

const invalid = (message: string) => new GatewayError("payment_invalid", message);

/** What a payment is checked against: the gateway's terms, the request's price, the time. */
export interface PaymentCheck {
  readonly terms: X402Terms;
  readonly price: PriceAsked;
  /** Unix seconds. */
  readonly now: number;
  /**
   * Seconds the signature must stay valid from now: the request and its settlement's batch
   * (settlement submits it before `deadline`).
   */
  readonly minValiditySeconds: number;
  /**
   * Asks the chain whether a contract wallet (ERC-1271) signed, when the signature does not
   * recover the payer as an account's; absent: only accounts pay.
   */
  readonly contractSigner?: SignatureVerifier | undefined;
}

/**
 * The checks of a signed payment that need no chain (but a contract wallet's signature), in the order a client can act on:
 * x402 v2 and `upto` on this chain, the token, the payee and facilitator (this Market), the
 * spender (the canonical upto proxy), the signature recovering the payer it names, the time
 * window, and an amount that covers the request's maximum. Throws a {@link GatewayError}
 * (`payment_invalid`, `payment_expired`, `payment_insufficient`) naming what failed.
 */
export function checkPayment(payload: PaymentPayload, check: PaymentCheck): Promise<UptoPayment> {
  return checked(payload, check);
}

async function checked(payload: PaymentPayload, check: PaymentCheck): Promise<UptoPayment> {
  const { terms, price, now } = check;
  if (payload === null || typeof payload !== "object")
    throw invalid("the payment is not an object");
  if (payload.x402Version !== 2) throw invalid("only x402 version 2 payments are accepted");
  const accepted = payload.accepted as Partial<PaymentRequirements> | undefined;
  if (accepted?.scheme !== "upto") throw invalid('the payment\'s scheme must be "upto"');
  if (accepted.network !== `eip155:${terms.chainId}`)
    throw invalid(
      `the payment is for network ${String(accepted.network)}, not eip155:${terms.chainId}`,
    );
  const inner = payload.payload as
    { signature?: unknown; permit2Authorization?: Record<string, unknown> } | undefined;
  const auth = inner?.permit2Authorization;
  if (auth === undefined || auth === null || typeof auth !== "object")
    throw invalid("the payment carries no permit2Authorization");
  const signature = field(inner?.signature, "signature");
  if (!/^0x[0-9a-fA-F]{130,}$/.test(signature) || signature.length > 2 + 2 * 4096)
    throw invalid("signature is not a hex signature");
  const payer = addressOf(auth.from, "permit2Authorization.from");
  const permitted = auth.permitted as Record<string, unknown> | undefined;
  const token = addressOf(permitted?.token, "permitted.token");
  const signedAmount = uintOf(permitted?.amount, "permitted.amount");
  const spender = addressOf(auth.spender, "spender");
  const nonce = uintOf(auth.nonce, "nonce");
  const deadline = uintOf(auth.deadline, "deadline");
  const w = auth.witness as Record<string, unknown> | undefined;
  const witness = {
    to: addressOf(w?.to, "witness.to"),
    facilitator: addressOf(w?.facilitator, "witness.facilitator"),
    validAfter: uintOf(w?.validAfter, "witness.validAfter"),
  };
  if (token !== getAddress(price.asset))
    throw invalid(
      `the payment is in token ${token}, this model is paid in ${getAddress(price.asset)}`,
    );
  if (witness.to !== terms.market || witness.facilitator !== terms.market)
    throw invalid(`the payment must be to and settled by the Market ${terms.market}`);
  if (spender !== uptoProxyAddress)
    throw invalid(`the payment's spender must be the upto proxy ${uptoProxyAddress}`);
  const permit = { permitted: { token, amount: signedAmount }, nonce, deadline };
  // What costs nothing before the signature's recovery (milliseconds of CPU).
  if (witness.validAfter > BigInt(now))
    throw new GatewayError(
      "payment_expired",
      `the payment is not valid before ${witness.validAfter}`,
    );
  if (deadline < BigInt(now + check.minValiditySeconds))
    throw new GatewayError(
      "payment_expired",
      `the payment's deadline ${deadline} leaves less than ${check.minValiditySeconds} s to serve and settle it`,
    );
  if (signedAmount < price.amount)
    throw new GatewayError(
      "payment_insufficient",
      `the payment allows ${signedAmount}, this request's maximum is ${price.amount}`,
    );
  const typedData = {
    domain: { name: "Permit2", chainId: terms.chainId, verifyingContract: permit2Address },
    types: uptoWitnessTypes,
    primaryType: "PermitWitnessTransferFrom" as const,
    message: { permitted: permit.permitted, spender, nonce, deadline, witness },
  };
  let recovered: Address | undefined;
  try {
    recovered = await recoverTypedDataAddress({ ...typedData, signature: signature as Hex });
  } catch {
    recovered = undefined;
  }
  // Not the payer's key: a contract wallet's signature (ERC-1271), as Permit2 checks it.
  if (
    recovered !== payer &&
    !(await check.contractSigner?.verifyTypedData({
      address: payer,
      typedData: typedData as never,
      signature: signature as Hex,
    }))
  )
    throw invalid(
      recovered === undefined
        ? "the signature does not recover"
        : `the signature was not made by ${payer}`,
    );
  const approval = await checkApproval(payload.extensions, {
    chainId: terms.chainId,
    permit2: permit2Address,
    payer,
    token,
    signedAmount,
    domain: price.assetDomain,
    now,
    minValiditySeconds: check.minValiditySeconds,
  });
  return {
    payer,
    token,
    signedAmount,
    nonce,
    deadline,
    validAfter: witness.validAfter,
    signature: signature as Hex,
    permit,
    witness,
    ...(approval === undefined ? {} : { approval }),
  };
}

const x402Tag = keccak256(toBytes("x402-upto"));

/**
 * The permit id the Market records a payment under (`Market.x402PermitId`): one per (payer,
 * Permit2 nonce), in a space of its own on chain (no `openPermit` can take it).
 */
export function x402PermitId(payer: Address, nonce: bigint): Hex {
  return keccak256(
    encodeAbiParameters(
      [{ type: "bytes32" }, { type: "address" }, { type: "uint256" }],
      [x402Tag, payer, nonce],
    ),
  );
}

/** The signed transfer as settlement submits it (`Market.settleWithPayments`; JSON-safe). */
export function paymentItemOf(payment: UptoPayment): PaymentItem {
  return {
    permit: {
      permitted: { token: payment.token, amount: payment.signedAmount.toString() },
      nonce: payment.nonce.toString(),
      deadline: payment.deadline.toString(),
    },
    owner: payment.payer,
    witness: {
      to: payment.witness.to,
      facilitator: payment.witness.facilitator,
      validAfter: payment.validAfter.toString(),
    },
    signature: payment.signature,
    ...(payment.approval === undefined
      ? {}
      : {
          approval: {
            value: payment.approval.value.toString(),
            deadline: payment.approval.deadline.toString(),
            signature: payment.approval.signature,
          },
        }),
  };
}
