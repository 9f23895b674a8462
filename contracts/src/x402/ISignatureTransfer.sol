// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @title ISignatureTransfer
/// @notice The part of Permit2's signature-transfer interface the x402 `upto` flow calls. The
/// structs have Permit2's exact layouts (they are hashed into the payer's EIP-712 signature).
interface ISignatureTransfer {
    struct TokenPermissions {
        address token;
        uint256 amount;
    }

    struct PermitTransferFrom {
        TokenPermissions permitted;
        uint256 nonce;
        uint256 deadline;
    }

    struct SignatureTransferDetails {
        address to;
        uint256 requestedAmount;
    }

    /// @notice Moves `transferDetails.requestedAmount` (at most `permit.permitted.amount`) of
    /// the token from `owner` to `transferDetails.to`, checking `owner`'s signature over the
    /// permit, the caller as spender and the witness; consumes the unordered `permit.nonce`.
    function permitWitnessTransferFrom(
        PermitTransferFrom calldata permit,
        SignatureTransferDetails calldata transferDetails,
        address owner,
        bytes32 witness,
        string calldata witnessTypeString,
        bytes calldata signature
    ) external;
}
