// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

/// @title MarketBase
/// @notice The market's types, errors, events and storage, and the settlement steps both
/// settlement entry points share (`Market.settle`, `MarketX402.settleWithPayments`).
abstract contract MarketBase {
    using SafeERC20 for IERC20;

    enum ModelStatus {
        Pending,
        Active,
        Paused,
        Retired
    }

    enum OfferStatus {
        Active,
        Paused,
        Retired
    }

    enum PermitState {
        None,
        Open,
        Closing,
        Closed
    }

    struct Model {
        address creator;
        address creditToken;
        string repository;
        string revision;
        string task;
        bytes32 poolId;
        uint256 positionTokenId;
        ModelStatus status;
    }

    struct Tariff {
        uint64 version;
        uint256 inputPricePerMTok;
        uint256 outputPricePerMTok;
        uint256 wakeFee;
    }

    /// @dev `capabilities` is JSON object text, e.g.
    /// {"max_output_tokens":4096,"context_window":8192,"streaming":true}
    struct OfferMetadata {
        string region;
        string hardware;
        uint32 maxConcurrency;
        string capabilities;
    }

    struct Offer {
        bytes32 modelId;
        address owner;
        address operator;
        address payout;
        OfferStatus status;
        Tariff tariff;
        OfferMetadata metadata;
    }

    struct Permit {
        address payer;
        bytes32 modelId;
        bytes32 offerId;
        uint256 deposit;
        uint256 settled;
        uint64 expiresAt;
        PermitState state;
        uint64 closableAt;
    }

    struct Charge {
        bytes32 permitId;
        bytes32 offerId;
        uint256 amount;
    }

    error Unauthorized();
    error NotSettlementOperator();
    error NotFound();
    error AlreadyExists();
    error InvalidState();
    error InvalidArgument();
    error BatchAlreadySettled(bytes32 batchId);
    error ChargeExceedsDeposit(bytes32 permitId, uint256 available, uint256 amount);
    error OfferMismatch(bytes32 permitId, bytes32 offerId);
    error GracePeriodNotOver(uint64 closableAt);
    error DepositNotReceived(uint256 expected, uint256 received);

    event SettlementOperatorChanged(address indexed settlementOperator);
    event ModelCreated(
        bytes32 indexed modelId,
        address indexed creator,
        address creditToken,
        string repository,
        string revision,
        string task,
        bytes32 poolId,
        uint256 positionTokenId
    );
    event ModelStatusChanged(bytes32 indexed modelId, ModelStatus status);
    event OfferCreated(
        bytes32 indexed offerId,
        bytes32 indexed modelId,
        address indexed operator,
        address owner,
        address payout
    );
    event OfferStatusChanged(bytes32 indexed offerId, OfferStatus status);
    event OfferTariffChanged(
        bytes32 indexed offerId,
        uint64 version,
        uint256 inputPricePerMTok,
        uint256 outputPricePerMTok,
        uint256 wakeFee
    );
    event OfferMetadataChanged(
        bytes32 indexed offerId,
        string region,
        string hardware,
        uint32 maxConcurrency,
        string capabilities
    );
    event OfferOperatorChanged(bytes32 indexed offerId, address indexed operator);
    event OfferPayoutChanged(bytes32 indexed offerId, address indexed payout);
    event PermitOpened(
        bytes32 indexed permitId,
        address indexed payer,
        bytes32 indexed modelId,
        bytes32 offerId,
        uint256 deposit,
        uint64 expiresAt
    );
    event PermitCloseRequested(bytes32 indexed permitId, uint64 closableAt);
    event PermitClosed(bytes32 indexed permitId, uint256 refund);
    event ChargeSettled(
        bytes32 indexed batchId,
        bytes32 indexed permitId,
        bytes32 indexed offerId,
        uint256 amount
    );
    event BatchSettled(bytes32 indexed batchId, uint256 charges, uint256 total);

    address public owner;
    address public settlementOperator;
    /// @notice Seconds between `requestClose` and the earliest `finalizeClose`; the window in
    /// which usage already incurred can still be settled against the permit.
    uint64 public closeGracePeriod;

    mapping(bytes32 => Model) internal _models;
    mapping(bytes32 => Offer) internal _offers;
    mapping(bytes32 => Permit) internal _permits;
    mapping(bytes32 => bool) internal _settledBatches;

    modifier onlyOwner() {
        if (msg.sender != owner) revert Unauthorized();
        _;
    }

    modifier onlyOfferOwner(bytes32 offerId) {
        Offer storage offer = _existingOffer(offerId);
        if (msg.sender != offer.owner) revert Unauthorized();
        _;
    }

    modifier onlyOfferOwnerOrOperator(bytes32 offerId) {
        Offer storage offer = _existingOffer(offerId);
        if (msg.sender != offer.owner && msg.sender != offer.operator) revert Unauthorized();
        _;
    }

    // ---------------------------------------------------------------- settlement steps

    /// @dev Admits a batch: settlement operator only, a non-zero id, at least one item, and an
    /// id never settled before (one id space for all entry points); marks it settled.
    function _beginBatch(bytes32 batchId, uint256 items) internal {
        if (msg.sender != settlementOperator) revert NotSettlementOperator();
        if (batchId == bytes32(0) || items == 0) revert InvalidArgument();
        if (_settledBatches[batchId]) revert BatchAlreadySettled(batchId);
        _settledBatches[batchId] = true;
    }

    /// @dev Moves each charge's amount from its permit's escrow to its offer's payout; returns
    /// the sum. Any bad charge reverts.
    function _settleCharges(
        bytes32 batchId,
        Charge[] calldata charges
    ) internal returns (uint256 total) {
        for (uint256 i = 0; i < charges.length; ++i) {
            Charge calldata charge = charges[i];
            Permit storage permit = _existingPermit(charge.permitId);
            if (permit.state != PermitState.Open && permit.state != PermitState.Closing) {
                revert InvalidState();
            }
            Offer storage offer = _existingOffer(charge.offerId);
            if (
                offer.modelId != permit.modelId ||
                (permit.offerId != bytes32(0) && permit.offerId != charge.offerId)
            ) {
                revert OfferMismatch(charge.permitId, charge.offerId);
            }
            if (charge.amount == 0) revert InvalidArgument();
            uint256 available = permit.deposit - permit.settled;
            if (charge.amount > available) {
                revert ChargeExceedsDeposit(charge.permitId, available, charge.amount);
            }
            permit.settled += charge.amount;
            total += charge.amount;
            emit ChargeSettled(batchId, charge.permitId, charge.offerId, charge.amount);
            IERC20(_models[permit.modelId].creditToken).safeTransfer(offer.payout, charge.amount);
        }
    }

    // ---------------------------------------------------------------- lookups

    function _existingModel(bytes32 modelId) internal view returns (Model storage model) {
        model = _models[modelId];
        if (model.creator == address(0)) revert NotFound();
    }

    function _existingOffer(bytes32 offerId) internal view returns (Offer storage offer) {
        offer = _offers[offerId];
        if (offer.owner == address(0)) revert NotFound();
    }

    function _existingPermit(bytes32 permitId) internal view returns (Permit storage permit) {
        permit = _permits[permitId];
        if (permit.state == PermitState.None) revert NotFound();
    }
}
