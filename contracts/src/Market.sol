// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {MarketX402} from "./MarketX402.sol";

/// @title Market
/// @notice Reference on-chain model market the gateway reads: models (one ERC-20 credit token
/// each), offers that serve a model at a versioned tariff, permits that escrow a payer's credits,
/// and exactly-once batch settlement of charges from permits to offer payouts.
/// @dev Every state change emits an event so an indexer can rebuild models and offers from logs.
/// External token calls always come after the state they depend on is written
/// (checks-effects-interactions), so a hostile credit token cannot re-enter into a stale state.
/// Types, errors, events and storage are in `MarketBase`; x402 `upto` payments in `MarketX402`.
contract Market is MarketX402 {
    using SafeERC20 for IERC20;

    constructor(address settlementOperator_, uint64 closeGracePeriod_) {
        if (settlementOperator_ == address(0)) revert InvalidArgument();
        owner = msg.sender;
        settlementOperator = settlementOperator_;
        closeGracePeriod = closeGracePeriod_;
        emit SettlementOperatorChanged(settlementOperator_);
    }

    function setSettlementOperator(address settlementOperator_) external onlyOwner {
        if (settlementOperator_ == address(0)) revert InvalidArgument();
        settlementOperator = settlementOperator_;
        emit SettlementOperatorChanged(settlementOperator_);
    }

    // ---------------------------------------------------------------- models

    function createModel(
        bytes32 modelId,
        address creditToken,
        string calldata repository,
        string calldata revision,
        string calldata task,
        bytes32 poolId,
        uint256 positionTokenId
    ) external {
        if (modelId == bytes32(0) || creditToken == address(0)) revert InvalidArgument();
        Model storage model = _models[modelId];
        if (model.creator != address(0)) revert AlreadyExists();
        model.creator = msg.sender;
        model.creditToken = creditToken;
        model.repository = repository;
        model.revision = revision;
        model.task = task;
        model.poolId = poolId;
        model.positionTokenId = positionTokenId;
        model.status = ModelStatus.Pending;
        emit ModelCreated(
            modelId,
            msg.sender,
            creditToken,
            repository,
            revision,
            task,
            poolId,
            positionTokenId
        );
    }

    function setModelStatus(bytes32 modelId, ModelStatus status) external {
        Model storage model = _existingModel(modelId);
        if (msg.sender != model.creator) revert Unauthorized();
        model.status = status;
        emit ModelStatusChanged(modelId, status);
    }

    // ---------------------------------------------------------------- offers

    /// @notice Creates an active offer owned by the caller. The tariff's version is always 1
    /// here (the passed version is ignored); each later tariff change bumps it by one.
    function createOffer(
        bytes32 offerId,
        bytes32 modelId,
        address operator,
        address payout,
        Tariff calldata tariff,
        OfferMetadata calldata metadata
    ) external {
        if (offerId == bytes32(0) || operator == address(0) || payout == address(0)) {
            revert InvalidArgument();
        }
        _existingModel(modelId);
        Offer storage offer = _offers[offerId];
        if (offer.owner != address(0)) revert AlreadyExists();
        offer.modelId = modelId;
        offer.owner = msg.sender;
        offer.operator = operator;
        offer.payout = payout;
        offer.status = OfferStatus.Active;
        offer.tariff = Tariff({
            version: 1,
            inputPricePerMTok: tariff.inputPricePerMTok,
            outputPricePerMTok: tariff.outputPricePerMTok,
            wakeFee: tariff.wakeFee
        });
        offer.metadata = metadata;
        emit OfferCreated(offerId, modelId, operator, msg.sender, payout);
        emit OfferTariffChanged(
            offerId,
            1,
            tariff.inputPricePerMTok,
            tariff.outputPricePerMTok,
            tariff.wakeFee
        );
        _emitMetadata(offerId, metadata);
    }

    function setOfferStatus(
        bytes32 offerId,
        OfferStatus status
    ) external onlyOfferOwnerOrOperator(offerId) {
        _offers[offerId].status = status;
        emit OfferStatusChanged(offerId, status);
    }

    function setOfferTariff(
        bytes32 offerId,
        uint256 inputPricePerMTok,
        uint256 outputPricePerMTok,
        uint256 wakeFee
    ) external onlyOfferOwnerOrOperator(offerId) {
        Tariff storage tariff = _offers[offerId].tariff;
        uint64 version = tariff.version + 1;
        tariff.version = version;
        tariff.inputPricePerMTok = inputPricePerMTok;
        tariff.outputPricePerMTok = outputPricePerMTok;
        tariff.wakeFee = wakeFee;
        emit OfferTariffChanged(offerId, version, inputPricePerMTok, outputPricePerMTok, wakeFee);
    }

    function setOfferMetadata(
        bytes32 offerId,
        OfferMetadata calldata metadata
    ) external onlyOfferOwnerOrOperator(offerId) {
        _offers[offerId].metadata = metadata;
        _emitMetadata(offerId, metadata);
    }

    function setOfferOperator(bytes32 offerId, address operator) external onlyOfferOwner(offerId) {
        if (operator == address(0)) revert InvalidArgument();
        _offers[offerId].operator = operator;
        emit OfferOperatorChanged(offerId, operator);
    }

    function setOfferPayout(bytes32 offerId, address payout) external onlyOfferOwner(offerId) {
        if (payout == address(0)) revert InvalidArgument();
        _offers[offerId].payout = payout;
        emit OfferPayoutChanged(offerId, payout);
    }

    // ---------------------------------------------------------------- permits

    /// @notice Opens a permit: escrows `deposit` of the model's credit token from the caller.
    /// `offerId` zero lets any offer of the model charge it; otherwise only that offer may.
    function openPermit(
        bytes32 permitId,
        bytes32 modelId,
        bytes32 offerId,
        uint256 deposit,
        uint64 expiresAt
    ) external {
        if (permitId == bytes32(0) || deposit == 0 || expiresAt <= block.timestamp) {
            revert InvalidArgument();
        }
        Model storage model = _existingModel(modelId);
        if (offerId != bytes32(0) && _existingOffer(offerId).modelId != modelId) {
            revert OfferMismatch(permitId, offerId);
        }
        Permit storage permit = _permits[permitId];
        if (permit.state != PermitState.None) revert AlreadyExists();
        permit.payer = msg.sender;
        permit.modelId = modelId;
        permit.offerId = offerId;
        permit.deposit = deposit;
        permit.expiresAt = expiresAt;
        permit.state = PermitState.Open;
        emit PermitOpened(permitId, msg.sender, modelId, offerId, deposit, expiresAt);

        // The escrow of one token is shared by all permits of its models, so a token that
        // delivers less than asked (fee on transfer) would let one permit spend another's deposit.
        IERC20 token = IERC20(model.creditToken);
        uint256 before = token.balanceOf(address(this));
        token.safeTransferFrom(msg.sender, address(this), deposit);
        uint256 received = token.balanceOf(address(this)) - before;
        if (received != deposit) revert DepositNotReceived(deposit, received);
    }

    /// @notice Starts the grace period after which the payer can take back what was not settled.
    /// Settlement of usage already incurred stays possible until the permit is closed.
    function requestClose(bytes32 permitId) external {
        Permit storage permit = _existingPermit(permitId);
        if (msg.sender != permit.payer) revert Unauthorized();
        if (permit.state != PermitState.Open) revert InvalidState();
        uint64 closableAt = uint64(block.timestamp) + closeGracePeriod;
        permit.state = PermitState.Closing;
        permit.closableAt = closableAt;
        emit PermitCloseRequested(permitId, closableAt);
    }

    /// @notice Closes a permit whose grace period is over and refunds `deposit - settled` to the
    /// payer. Anyone may call it; the refund always goes to the payer.
    function finalizeClose(bytes32 permitId) external {
        Permit storage permit = _existingPermit(permitId);
        if (permit.state != PermitState.Closing) revert InvalidState();
        if (block.timestamp < permit.closableAt) revert GracePeriodNotOver(permit.closableAt);
        uint256 refund = permit.deposit - permit.settled;
        permit.state = PermitState.Closed;
        emit PermitClosed(permitId, refund);
        if (refund > 0) {
            IERC20(_models[permit.modelId].creditToken).safeTransfer(permit.payer, refund);
        }
    }

    // ---------------------------------------------------------------- settlement

    /// @notice Moves each charge's amount from its permit's escrow to its offer's payout.
    /// A batch id settles at most once, which makes settlement exactly-once for a caller that
    /// derives batch ids deterministically; any bad charge reverts the whole batch.
    /// @dev Expiry does not block settlement: the usage was incurred while the permit was valid.
    function settle(bytes32 batchId, Charge[] calldata charges) external {
        _beginBatch(batchId, charges.length);
        uint256 total = _settleCharges(batchId, charges);
        emit BatchSettled(batchId, charges.length, total);
    }

    // ---------------------------------------------------------------- views

    function getModel(bytes32 modelId) external view returns (Model memory) {
        return _models[modelId];
    }

    function getOffer(bytes32 offerId) external view returns (Offer memory) {
        return _offers[offerId];
    }

    function getPermit(bytes32 permitId) external view returns (Permit memory) {
        return _permits[permitId];
    }

    function isBatchSettled(bytes32 batchId) external view returns (bool) {
        return _settledBatches[batchId];
    }

    function modelExists(bytes32 modelId) external view returns (bool) {
        return _models[modelId].creator != address(0);
    }

    function offerExists(bytes32 offerId) external view returns (bool) {
        return _offers[offerId].owner != address(0);
    }

    // ---------------------------------------------------------------- internals

    function _emitMetadata(bytes32 offerId, OfferMetadata calldata metadata) private {
        emit OfferMetadataChanged(
            offerId,
            metadata.region,
            metadata.hardware,
            metadata.maxConcurrency,
            metadata.capabilities
        );
    }
}
