// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {ISignatureTransfer} from "./ISignatureTransfer.sol";

/// @title x402UptoPermit2Proxy
/// @notice A Permit2 spender for x402's `upto` scheme, with the ABI of the canonical proxy the
/// x402 EVM clients sign for: the payer signs a Permit2 `PermitWitnessTransferFrom` for a
/// maximum, with the witness `{to, facilitator, validAfter}`; only `witness.facilitator` may
/// settle, any amount up to the maximum, once (Permit2's nonce), to `witness.to`.
/// @dev Written for this project (not the canonical source); the name is lower-case so that the
/// ABI's struct names equal the canonical ones. Its only immutable is `PERMIT2` and its only
/// storage the reentrancy guard's slot, which works from zero (not entered) as well, so its
/// runtime code can be placed at the canonical address of a local chain as it is.
// solhint-disable-next-line contract-name-capwords
contract x402UptoPermit2Proxy is ReentrancyGuard {
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    /// @dev An EIP-2612 `permit(owner, PERMIT2, value, deadline, v, r, s)` signature.
    struct EIP2612Permit {
        uint256 value;
        uint256 deadline;
        bytes32 r;
        bytes32 s;
        uint8 v;
    }

    /// @notice The witness part of the signed type, as Permit2 appends it to
    /// `PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,`.
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";

    bytes32 public constant WITNESS_TYPEHASH =
        keccak256("Witness(address to,address facilitator,uint256 validAfter)");

    ISignatureTransfer public immutable PERMIT2;

    event Settled();
    event SettledWithPermit();

    error InvalidPermit2Address();
    error UnauthorizedFacilitator();
    error PaymentTooEarly();
    error AmountExceedsPermitted();
    error InvalidDestination();
    error InvalidOwner();
    error Permit2612AmountMismatch();

    constructor(ISignatureTransfer permit2) {
        if (address(permit2) == address(0)) revert InvalidPermit2Address();
        PERMIT2 = permit2;
    }

    /// @notice Moves `amount` (at most the signed maximum) from `owner` to `witness.to`.
    /// Callable only by `witness.facilitator`, not before `witness.validAfter`.
    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _check(permit, amount, owner, witness);
        _transfer(permit, amount, owner, witness, signature);
        emit Settled();
    }

    /// @notice `settle`, first submitting the owner's EIP-2612 approval of Permit2 for the
    /// permitted amount (a gasless first payment). An approval already used (or front-run) is
    /// tolerated: the transfer then stands on the allowance Permit2 has.
    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _check(permit, amount, owner, witness);
        if (permit2612.value != permit.permitted.amount) revert Permit2612AmountMismatch();
        try
            IERC20Permit(permit.permitted.token).permit(
                owner,
                address(PERMIT2),
                permit2612.value,
                permit2612.deadline,
                permit2612.v,
                permit2612.r,
                permit2612.s
            )
        {} catch {} // solhint-disable-line no-empty-blocks
        _transfer(permit, amount, owner, witness, signature);
        emit SettledWithPermit();
    }

    function _check(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness
    ) private view {
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        if (witness.to == address(0)) revert InvalidDestination();
        if (owner == address(0)) revert InvalidOwner();
    }

    function _transfer(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: amount}),
            owner,
            keccak256(abi.encode(WITNESS_TYPEHASH, witness)),
            WITNESS_TYPE_STRING,
            signature
        );
    }
}
