// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {MarketBase} from "./MarketBase.sol";
import {ISignatureTransfer} from "./x402/ISignatureTransfer.sol";
import {IX402UptoPermit2Proxy} from "./x402/IX402UptoPermit2Proxy.sol";

/// @title MarketX402
/// @notice The market as x402 `upto` facilitator: an agent signs a Permit2 transfer of at most
/// the request's priced maximum to the x402 upto proxy, with the market as both `witness.to` and
/// `witness.facilitator`; the settlement operator settles what the meter judged in its batches,
/// next to permit charges. Each payment is recorded as a permit opened and settled at once
/// (`getX402Payment`), in its own id space, and paid to the offer's payout.
/// @dev Exactly-once: the batch id settles once, each x402 id is recorded once, and Permit2
/// consumes the payer's nonce. A failing payment reverts the whole batch with
/// `PaymentFailed(permitId, reason)` so the settlement worker can take that payment out.
abstract contract MarketX402 is MarketBase {
    using SafeERC20 for IERC20;

    /// @notice The canonical x402 `upto` Permit2 proxy (the spender `@x402/evm` clients sign for).
    address public constant X402_UPTO_PROXY = 0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002;

    /// @notice Canonical Permit2: the spender of a payer's EIP-2612 approval (gasless first payment).
    address public constant PERMIT2 = 0x000000000022D473030F116dDEE9F6B43aC78BA3;

    bytes32 private constant X402_ID_TAG = keccak256("x402-upto");

    struct X402Payment {
        /// @dev `x402PermitId(owner, permit.nonce)`.
        bytes32 permitId;
        bytes32 offerId;
        /// @dev What is charged: at most `permit.permitted.amount`, more than zero.
        uint256 amount;
        ISignatureTransfer.PermitTransferFrom permit;
        address owner;
        IX402UptoPermit2Proxy.Witness witness;
        bytes signature;
    }

    /// @dev A payer's EIP-2612 `permit(owner, PERMIT2, value, deadline, v, r, s)` on the credit
    /// token of the payment at the same index (x402's `eip2612GasSponsoring`); `deadline` 0: none.
    struct Permit2Approval {
        uint256 value;
        uint256 deadline;
        uint8 v;
        bytes32 r;
        bytes32 s;
    }

    /// @notice A payment could not be settled; `reason` is the revert data of the proxy (or of
    /// Permit2, or the token, bubbled up) or one of `WrongPaymentToken`, `WrongPaymentWitness`.
    error PaymentFailed(bytes32 permitId, bytes reason);
    /// @notice Reason of `PaymentFailed`: the permit is for another token than the offer's model's.
    error WrongPaymentToken(address expected, address token);
    /// @notice Reason of `PaymentFailed`: the payment is not to and settled by this market.
    error WrongPaymentWitness(address to, address facilitator);

    event X402PaymentSettled(
        bytes32 indexed batchId,
        bytes32 indexed permitId,
        address indexed payer,
        bytes32 offerId,
        uint256 amount,
        uint256 nonce
    );

    mapping(bytes32 => Permit) private _x402Payments;

    /// @notice The record id of an x402 payment: one per payer and Permit2 nonce.
    function x402PermitId(address owner_, uint256 nonce) public pure returns (bytes32) {
        return keccak256(abi.encode(X402_ID_TAG, owner_, nonce));
    }

    /// @notice An x402 payment's record: payer, model, offer, deposit = settled = the amount,
    /// `expiresAt` = the permit's deadline (capped to uint64), state Closed. State None if absent.
    function getX402Payment(bytes32 permitId) external view returns (Permit memory) {
        return _x402Payments[permitId];
    }

    /// @notice Settles permit charges and x402 payments in one exactly-once batch (settlement
    /// operator only). Any bad charge or payment reverts all of it; a payment the proxy, Permit2
    /// or the token refuses reverts with `PaymentFailed` naming it.
    function settleWithPayments(
        bytes32 batchId,
        Charge[] calldata charges,
        X402Payment[] calldata payments
    ) external {
        uint256 items = charges.length + payments.length;
        _beginBatch(batchId, items);
        _settleAll(batchId, items, charges, payments);
    }

    /// @notice `settleWithPayments` for payments whose payers approve Permit2 by an EIP-2612
    /// signature (a gasless first payment; the operator pays its gas): `approvals[i]` goes with
    /// `payments[i]`, on that payment's credit token, submitted first and only while the payer's
    /// allowance to Permit2 is below its value. An approval the token refuses (used, front-run,
    /// expired) is ignored: a payment still without allowance then fails with `PaymentFailed`.
    function settleWithPaymentsAndApprovals(
        bytes32 batchId,
        Charge[] calldata charges,
        X402Payment[] calldata payments,
        Permit2Approval[] calldata approvals
    ) external {
        uint256 items = charges.length + payments.length;
        _beginBatch(batchId, items);
        if (approvals.length != payments.length) revert InvalidArgument();
        for (uint256 i = 0; i < payments.length; ++i) {
            if (approvals[i].deadline != 0) _approvePermit2(payments[i], approvals[i]);
        }
        _settleAll(batchId, items, charges, payments);
    }

    function _settleAll(
        bytes32 batchId,
        uint256 items,
        Charge[] calldata charges,
        X402Payment[] calldata payments
    ) private {
        uint256 total = _settleCharges(batchId, charges);
        for (uint256 i = 0; i < payments.length; ++i) {
            total += _settlePayment(batchId, payments[i]);
        }
        emit BatchSettled(batchId, items, total);
    }

    /// @dev Only on the payment's model's credit token (a payment in another token fails later).
    function _approvePermit2(X402Payment calldata p, Permit2Approval calldata a) private {
        address token = _models[_existingOffer(p.offerId).modelId].creditToken;
        if (p.permit.permitted.token != token) return;
        if (IERC20(token).allowance(p.owner, PERMIT2) >= a.value) return;
        try
            IERC20Permit(token).permit(p.owner, PERMIT2, a.value, a.deadline, a.v, a.r, a.s)
        {} catch {} // solhint-disable-line no-empty-blocks
    }

    function _settlePayment(bytes32 batchId, X402Payment calldata p) private returns (uint256) {
        if (p.permitId != x402PermitId(p.owner, p.permit.nonce)) revert InvalidArgument();
        Offer storage offer = _existingOffer(p.offerId);
        bytes32 modelId = offer.modelId;
        IERC20 token = IERC20(_models[modelId].creditToken);
        _checkPayee(p, address(token));
        if (p.amount == 0) revert InvalidArgument();
        Permit storage record = _x402Payments[p.permitId];
        if (record.state != PermitState.None) revert AlreadyExists();
        record.payer = p.owner;
        record.modelId = modelId;
        record.offerId = p.offerId;
        record.deposit = p.amount;
        record.settled = p.amount;
        record.expiresAt = p.permit.deadline > type(uint64).max
            ? type(uint64).max
            : uint64(p.permit.deadline);
        record.state = PermitState.Closed;
        emit X402PaymentSettled(batchId, p.permitId, p.owner, p.offerId, p.amount, p.permit.nonce);
        emit ChargeSettled(batchId, p.permitId, p.offerId, p.amount);

        // The escrow of one token is shared, so the payment must deliver exactly `amount`.
        uint256 before = token.balanceOf(address(this));
        try
            IX402UptoPermit2Proxy(X402_UPTO_PROXY).settle(
                p.permit,
                p.amount,
                p.owner,
                p.witness,
                p.signature
            )
        {} catch (bytes memory reason) {
            revert PaymentFailed(p.permitId, reason);
        }
        uint256 received = token.balanceOf(address(this)) - before;
        if (received != p.amount) revert DepositNotReceived(p.amount, received);
        token.safeTransfer(offer.payout, p.amount);
        return p.amount;
    }

    function _checkPayee(X402Payment calldata p, address token) private view {
        if (p.permit.permitted.token != token) {
            revert PaymentFailed(
                p.permitId,
                abi.encodeWithSelector(WrongPaymentToken.selector, token, p.permit.permitted.token)
            );
        }
        if (p.witness.to != address(this) || p.witness.facilitator != address(this)) {
            revert PaymentFailed(
                p.permitId,
                abi.encodeWithSelector(
                    WrongPaymentWitness.selector,
                    p.witness.to,
                    p.witness.facilitator
                )
            );
        }
    }
}
