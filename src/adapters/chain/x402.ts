/**
 * x402 payments on chain (issue 37): the Market's `settleWithPayments` as settlement encodes it
 * (permit charges and signed Permit2 transfers in one batch), the decoding of what a payment's
 * transfer failed on, and the simulation the gateway runs before it serves a paid request (the
 * settlement at the request's maximum, as the settlement operator would send it).
 */
import {
  BaseError,
  ContractFunctionRevertedError,
  ContractFunctionZeroDataError,
  decodeErrorResult,
  encodeFunctionData,
  erc20Abi,
  parseAbi,
  parseSignature,
  zeroAddress,
  zeroHash,
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
  type AssetDomain,
  type SimulatedSettlement,
  type UptoPayment,
} from "../../domain/x402/index.js";

/** The Market, whose `settleWithPayments` and `PaymentFailed` carry x402 payments. */
export const paymentsAbi = marketAbi;

const noncesAbi = parseAbi(["function nonces(address owner) view returns (uint256)"]);
const eip712DomainAbi = parseAbi([
  "function eip712Domain() view returns (bytes1 fields, string name, string version, uint256 chainId, address verifyingContract, bytes32 salt, uint256[] extensions)",
]);

/** How long a token found without EIP-2612 is not asked again (it may be redeployed, rarely). */
const noDomainSeconds = 300;

/**
 * A token's EIP-712 domain when it takes EIP-2612 approvals: its ERC-5267 `eip712Domain()` names
 * this chain and the token itself, and it has `nonces(owner)` (OpenZeppelin's `ERC20Permit`, as
 * `CreditToken`). Undefined otherwise, or when the chain could not be asked (not remembered).
 */
async function readAssetDomain(
  client: PublicClient,
  token: Address,
): Promise<{ domain: AssetDomain | undefined; remember: boolean }> {
  try {
    const [[, name, version, chainId, verifyingContract]] = await Promise.all([
      client.readContract({ address: token, abi: eip712DomainAbi, functionName: "eip712Domain" }),
      client.readContract({
        address: token,
        abi: noncesAbi,
        functionName: "nonces",
        args: [zeroAddress],
      }),
    ]);
    const ours =
      chainId === BigInt(await client.getChainId()) &&
      verifyingContract.toLowerCase() === token.toLowerCase();
    return { domain: ours ? { name, version } : undefined, remember: true };
  } catch (error) {
    const refused =
      error instanceof BaseError &&
      error.walk(
        (e) =>
          e instanceof ContractFunctionRevertedError || e instanceof ContractFunctionZeroDataError,
      ) !== null;
    return { domain: undefined, remember: refused };
  }
}

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

/** No EIP-2612 approval for the payment at this index (`deadline` 0). */
const noApproval = { value: 0n, deadline: 0n, v: 0, r: zeroHash, s: zeroHash };

/** A payer's EIP-2612 approval of Permit2 as `settleWithPaymentsAndApprovals` takes it. */
function approvalOf(payment: PaymentItem) {
  const approval = payment.approval;
  if (approval === undefined) return noApproval;
  const { r, s, v, yParity } = parseSignature(approval.signature);
  return {
    value: BigInt(approval.value),
    deadline: BigInt(approval.deadline),
    v: Number(v ?? BigInt(27 + yParity)),
    r,
    s,
  };
}

/**
 * The Market's call for a batch with x402 payments: `settleWithPayments`, or, when a payment
 * carries its payer's EIP-2612 approval of Permit2 (a gasless first payment),
 * `settleWithPaymentsAndApprovals`, which submits the approvals first.
 */
function paymentsCall(batchId: Hex, charges: readonly BatchCharge[]) {
  const paid = charges.filter((c): c is BatchCharge & { payment: PaymentItem } => !!c.payment);
  const permitCharges = charges
    .filter((c) => c.payment === undefined)
    .map((c) => ({ permitId: c.permitId, offerId: c.offerId, amount: c.amount }));
  const payments = paid.map(itemOf);
  if (paid.every((c) => c.payment.approval === undefined))
    return {
      abi: paymentsAbi,
      functionName: "settleWithPayments",
      args: [batchId, permitCharges, payments],
    } as const;
  return {
    abi: paymentsAbi,
    functionName: "settleWithPaymentsAndApprovals",
    args: [batchId, permitCharges, payments, paid.map((c) => approvalOf(c.payment))],
  } as const;
}

/** A batch with x402 payments as its Market calldata (permit charges beside them). */
export function encodeWithPayments(batchId: Hex, charges: readonly BatchCharge[]): Hex {
  return encodeFunctionData(paymentsCall(batchId, charges) as never);
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
  const domains = new Map<string, { domain: AssetDomain | undefined; until: number }>();
  return {
    /** The credit token's EIP-712 domain when it takes EIP-2612 (cached per token). */
    async assetDomain(token: Address): Promise<AssetDomain | undefined> {
      const known = domains.get(token.toLowerCase());
      if (known !== undefined && known.until > Date.now()) return known.domain;
      const { domain, remember } = await readAssetDomain(client, token);
      if (remember)
        domains.set(token.toLowerCase(), {
          domain,
          until: domain === undefined ? Date.now() + noDomainSeconds * 1000 : Infinity,
        });
      return domain;
    },

    async simulate(
      payment: UptoPayment,
      amount: bigint,
      offerId: Hex,
      permitId: Hex,
    ): Promise<SimulatedSettlement> {
      // Exact: the batch as settlement would send it, the payer's EIP-2612 approval included
      // (the Market submits it first), called as the operator on the chain's current state.
      const call = paymentsCall(`0x${"0".repeat(63)}1`, [
        { permitId, offerId, amount, requests: 1, payment: paymentItemOf(payment) },
      ]);
      try {
        await client.simulateContract({ address: market, account: operator, ...call } as never);
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
  const approval = payment.approval;
  if (allowance < amount && approval !== undefined) {
    // The Market submits the approval first: the token takes it only at the payer's nonce.
    const current = await client.readContract({
      address: payment.token,
      abi: noncesAbi,
      functionName: "nonces",
      args: [payment.payer],
    });
    if (current !== approval.nonce)
      return {
        ok: false,
        code: "eip2612_permit_invalid",
        message: `the EIP-2612 approval was signed for nonce ${approval.nonce}; payer ${payment.payer}'s nonce at token ${payment.token} is ${current}: sign afresh`,
      };
  }
  if (allowance < amount && approval === undefined)
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
