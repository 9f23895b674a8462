/**
 * x402 payments on chain (issue 37): the Market's `settleWithPayments` as settlement encodes it
 * (permit charges and signed Permit2 transfers in one batch), the decoding of what a payment's
 * transfer failed on, and the simulation the gateway runs before it serves a paid request (the
 * settlement at the request's maximum, as the settlement operator would send it).
 */
import {
  BaseError,
  ContractFunctionRevertedError,
  decodeErrorResult,
  encodeFunctionData,
  erc20Abi,
  parseAbi,
  type Address,
  type Hex,
  type PublicClient,
} from "viem";
import { marketAbi } from "../../../gen/contracts/artifacts.js";
import type { BatchCharge, PaymentItem } from "../../domain/settlement/index.js";
import { GatewayError } from "../../domain/errors.js";
import {
  paymentItemOf,
  permit2Address,
  type SimulatedSettlement,
  type UptoPayment,
} from "../../domain/x402/index.js";

/** The Market, whose `settleWithPayments` and `PaymentFailed` carry x402 payments. */
export const paymentsAbi = marketAbi;

/** What Permit2, the upto proxy and a token may answer inside `PaymentFailed`. */
const innerErrorsAbi = parseAbi([
  "error InvalidNonce()",
  "error SignatureExpired(uint256 signatureDeadline)",
  "error InvalidSigner()",
  "error InvalidSignature()",
  "error InvalidSignatureLength()",
  "error InvalidContractSignature()",
  "error InvalidAmount(uint256 maxAmount)",
  "error UnauthorizedFacilitator()",
  "error PaymentTooEarly()",
  "error AmountExceedsPermitted()",
  "error InvalidDestination()",
  "error InvalidOwner()",
  "error ERC20InsufficientBalance(address sender, uint256 balance, uint256 needed)",
  "error ERC20InsufficientAllowance(address spender, uint256 allowance, uint256 needed)",
  "error WrongPaymentToken(address expected, address token)",
  "error WrongPaymentWitness(address to, address facilitator)",
]);

/** The name of the error inside a `PaymentFailed`'s reason (`TRANSFER_FROM_FAILED`, `InvalidNonce`, ...). */
export function paymentFailureDetail(reason: Hex): string {
  if (reason === "0x" || reason.length < 10) return "reverted";
  try {
    const decoded = decodeErrorResult({ abi: innerErrorsAbi, data: reason });
    // A `require` string (solmate's TRANSFER_FROM_FAILED) is viem's built-in Error(string).
    const { errorName, args } = decoded as { errorName: string; args?: readonly unknown[] };
    if (errorName === "Error") return String(args?.[0] ?? "Error").slice(0, 80);
    return errorName;
  } catch {
    try {
      const decoded = decodeErrorResult({ abi: parseAbi(["error Error(string)"]), data: reason });
      return String(decoded.args[0]).slice(0, 80);
    } catch {
      return reason.slice(0, 10);
    }
  }
}

const itemOf = (c: BatchCharge & { payment: PaymentItem }) => ({
  permitId: c.permitId,
  offerId: c.offerId,
  amount: c.amount,
  permit: {
    permitted: {
      token: c.payment.permit.permitted.token,
      amount: BigInt(c.payment.permit.permitted.amount),
    },
    nonce: BigInt(c.payment.permit.nonce),
    deadline: BigInt(c.payment.permit.deadline),
  },
  owner: c.payment.owner,
  witness: {
    to: c.payment.witness.to,
    facilitator: c.payment.witness.facilitator,
    validAfter: BigInt(c.payment.witness.validAfter),
  },
  signature: c.payment.signature,
});

/** A batch with x402 payments as `settleWithPayments` calldata (permit charges beside them). */
export function encodeWithPayments(batchId: Hex, charges: readonly BatchCharge[]): Hex {
  const paid = charges.filter((c): c is BatchCharge & { payment: PaymentItem } => !!c.payment);
  return encodeFunctionData({
    abi: paymentsAbi,
    functionName: "settleWithPayments",
    args: [
      batchId,
      charges
        .filter((c) => c.payment === undefined)
        .map((c) => ({ permitId: c.permitId, offerId: c.offerId, amount: c.amount })),
      paid.map(itemOf),
    ],
  });
}

export interface X402ChainOptions {
  readonly client: PublicClient;
  readonly market: Address;
  /** The settlement operator's address: the only caller the Market takes a settlement from. */
  readonly operator: Address;
}

/**
 * The settlement of `payment` at `amount` for `offerId`, simulated as the operator would send
 * it; a refusal says why in a code the 402 carries (the allowance to Permit2 missing, the
 * balance short, the nonce spent, anything else the transfer refused).
 */
export function createX402Chain(options: X402ChainOptions) {
  const { client, market, operator } = options;
  return {
    async simulate(
      payment: UptoPayment,
      amount: bigint,
      offerId: Hex,
      permitId: Hex,
    ): Promise<SimulatedSettlement> {
      const item = itemOf({
        permitId,
        offerId,
        amount,
        requests: 1,
        payment: paymentItemOf(payment),
      });
      try {
        await client.simulateContract({
          address: market,
          abi: paymentsAbi,
          functionName: "settleWithPayments",
          args: [`0x${"0".repeat(63)}1`, [], [item]],
          account: operator,
        });
        return { ok: true };
      } catch (error) {
        const reverted =
          error instanceof BaseError
            ? error.walk((e) => e instanceof ContractFunctionRevertedError)
            : undefined;
        if (!(reverted instanceof ContractFunctionRevertedError) || reverted.raw === undefined)
          throw new GatewayError("chain_unavailable", "the chain could not be asked (payment)", {
            cause: error,
          });
        const detail =
          reverted.data?.errorName === "PaymentFailed"
            ? paymentFailureDetail((reverted.data.args as readonly [Hex, Hex])[1])
            : (reverted.data?.errorName ?? "reverted");
        return explain(client, payment, amount, detail);
      }
    },
  };
}

/** Why the chain refused a payment, in the 402's words, read from the token and Permit2. */
async function explain(
  client: PublicClient,
  payment: UptoPayment,
  amount: bigint,
  detail: string,
): Promise<SimulatedSettlement> {
  if (detail === "InvalidNonce")
    return {
      ok: false,
      code: "payment_used",
      message: "this payment's Permit2 nonce is already spent: sign a new one",
    };
  const [balance, allowance] = await Promise.all([
    client.readContract({
      address: payment.token,
      abi: erc20Abi,
      functionName: "balanceOf",
      args: [payment.payer],
    }),
    client.readContract({
      address: payment.token,
      abi: erc20Abi,
      functionName: "allowance",
      args: [payment.payer, permit2Address],
    }),
  ]);
  if (allowance < amount)
    return {
      ok: false,
      code: "permit2_allowance_required",
      message: `payer ${payment.payer} has approved ${allowance} of token ${payment.token} to Permit2 (${permit2Address}); this request needs ${amount} (PERMIT2_ALLOWANCE_REQUIRED)`,
    };
  if (balance < amount)
    return {
      ok: false,
      code: "payment_refused",
      message: `payer ${payment.payer} holds ${balance} of token ${payment.token}; this request may cost ${amount}`,
    };
  return {
    ok: false,
    code: "payment_refused",
    message: `the settlement of this payment would fail on chain (${detail})`,
  };
}
