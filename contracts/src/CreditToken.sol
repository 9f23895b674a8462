// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Permit.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";

/// @title CreditToken
/// @notice The ERC-20 credit a model is paid in (one token per model). Permits escrow it in the
/// market; settlement moves it to offer payouts. Only the owner can mint.
/// @dev EIP-2612 `permit` (EIP-712 domain: the token's name, version "1") lets a payer approve
/// Permit2 without a transaction of its own, as x402's `eip2612GasSponsoring` does.
contract CreditToken is ERC20Permit, Ownable {
    constructor(
        string memory name_,
        string memory symbol_,
        address initialOwner
    ) ERC20(name_, symbol_) ERC20Permit(name_) Ownable(initialOwner) {}

    function mint(address to, uint256 amount) external onlyOwner {
        _mint(to, amount);
    }
}
