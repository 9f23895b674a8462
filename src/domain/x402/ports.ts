/**
 * What the chat pipeline needs to take x402 payments (issue 37): the gateway's terms, the chain's
 * word on a payment (the simulation of its settlement) and the store that makes one signature
 * pay one request, across processes, within the exposure caps.
 */
import type { Address, Hex } from "viem";
import type { ErrorCode } from "../errors.js";
import type { SignedUsageReceipt } from "../receipt-types.js";
import type { ReceiptRecord } from "../receipts.js";
import type { SignatureVerifier } from "../signatures.js";
import type { AssetDomain } from "./approval.js";
import type { UptoPayment, X402Terms } from "./payment.js";

/** What the chain says of settling `payment` at `amount` for `offerId` (a simulation). */
export type SimulatedSettlement =
  | { readonly ok: true }
  | { readonly ok: false; readonly code: ErrorCode; readonly message: string };

/** A payment as stored when it is taken for one request. */
export interface OpenedPayment {
  readonly payment: UptoPayment;
  readonly permitId: Hex;
  /** The request's maximum (what is reserved), at most the signed amount. */
  readonly maximum: bigint;
  /** Unix seconds. */
  readonly now: number;
}

/** Why a payment was not taken: its nonce paid before, its payer is blocked, a cap is reached. */
export type OpenRefusal =
  | {
      readonly ok: false;
      readonly code: "payment_used" | "payer_blocked";
      readonly message: string;
    }
  | { readonly ok: false; readonly code: "payment_exposure_exceeded"; readonly message: string };

export interface X402Store {
  /**
   * Takes the payment for one request, atomically: refused when its (payer, nonce) was taken
   * before (on any process), its payer is blocked, or the open payments of its payer (or of the
   * deployment) in its token would exceed their cap with this one's maximum.
   */
  open(opened: OpenedPayment): Promise<{ readonly ok: true } | OpenRefusal>;
  /** Gives back a payment whose request was never reserved (its signature may pay again). */
  release(permitId: Hex): Promise<void>;
}

export interface X402Payments {
  readonly terms: X402Terms;
  /** Seconds a signature must stay valid from admission: the request and its settlement. */
  readonly minValiditySeconds: number;
  /** Asks the chain whether a contract wallet signed (ERC-1271); absent: accounts only. */
  readonly contractSigner?: SignatureVerifier | undefined;
  readonly store: X402Store;
  /** The settlement of `payment` at `amount` for `offerId`, as `permitId`, simulated on chain. */
  simulate(
    payment: UptoPayment,
    amount: bigint,
    offerId: Hex,
    permitId: Hex,
  ): Promise<SimulatedSettlement>;
  /**
   * The credit token's EIP-712 domain when it takes EIP-2612 approvals (a gasless first
   * payment); undefined when it does not (or the chain could not say).
   */
  assetDomain?(token: Address): Promise<AssetDomain | undefined>;
  /**
   * Signs a closed paid request's usage receipt, which its streamed answer ends with; absent
   * when the gateway has no receipt key (the stream ends without one).
   */
  readonly receipt?: ((record: ReceiptRecord) => Promise<SignedUsageReceipt>) | undefined;
}
