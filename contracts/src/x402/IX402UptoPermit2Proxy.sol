// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ISignatureTransfer} from "./ISignatureTransfer.sol";

/// @title IX402UptoPermit2Proxy
/// @notice What a facilitator calls on x402's `upto` proxy (canonically at
/// 0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002): `settle` moves up to the signed maximum.
interface IX402UptoPermit2Proxy {
    /// @dev The witness the payer signs: where the funds go, who may settle, and from when.
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external;
}
