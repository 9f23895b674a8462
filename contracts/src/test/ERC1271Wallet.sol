// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @title ERC1271Wallet
/// @notice Test-only contract wallet: a signature is valid when it was made by `owner`. Lets tests
/// use a contract as an offer operator (ERC-1271 verification of registrations).
contract ERC1271Wallet {
    bytes4 internal constant MAGIC_VALUE = 0x1626ba7e;
    bytes4 internal constant INVALID = 0xffffffff;

    address public immutable owner;

    constructor(address owner_) {
        owner = owner_;
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        address recovered;
        ECDSA.RecoverError err;
        if (signature.length == 64) {
            // EIP-2098 compact signature (r, yParityAndS)
            (recovered, err, ) = ECDSA.tryRecover(hash, bytes32(signature[0:32]), bytes32(signature[32:64]));
        } else {
            (recovered, err, ) = ECDSA.tryRecover(hash, signature);
        }
        if (err != ECDSA.RecoverError.NoError || recovered != owner) {
            return INVALID;
        }
        return MAGIC_VALUE;
    }
}
