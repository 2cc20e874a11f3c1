// SPDX-License-Identifier: MIT
// x402's `batch-settlement` escrow for the local chain only.
//
// No registry package ships the bytecode of x402's x402BatchSettlement. This
// contract is written against what @x402/evm's clients, servers and
// facilitator call (batch-settlement-abi.json, a pinned copy of the ABI the
// package encodes its calls with, which compile.mjs checks this contract
// against), the EIP-712 types they sign (voucherTypes, refundTypes,
// claimBatchTypes, the channel config's type) under the domain
// "x402 Batch Settlement" version 1, and the scheme's specification.
// deploy.mjs copies its runtime code to BATCH_SETTLEMENT_ADDRESS.
//
// A channel is one payer's escrow for one receiver in one token, named by
// the EIP-712 hash of its immutable configuration. The payer deposits (a
// collector pulls the tokens, e.g. by an ERC-3009 authorization the payer
// signed, so the facilitator pays the gas); then signs cumulative vouchers
// off chain, each a ceiling on what the receiver may ever take from the
// channel. The receiver side claims (records a cumulative total no higher
// than a voucher's ceiling nor than the channel's balance) and settles
// (moves everything claimed to the receiver), many channels in one
// transaction. What is not claimed goes back to the payer: by a cooperative
// refund the receiver side authorizes, or by the payer's own withdrawal
// after the channel's delay, which only ever reaches unclaimed money.
//
// Accounting: `balance` is what the channel holds for its receiver and payer
// together (deposits minus refunds and withdrawals); `totalClaimed` is the
// receiver's share of it. Settling moves the receiver's share out of the
// contract without changing either, so `balance - totalClaimed` is always
// what the payer can still get back.
//
// The EIP-712 domain lives in immutables that OpenZeppelin recomputes when
// the code runs at another address, and the reentrancy guard is transient
// storage, so the copied runtime code needs no constructor-set storage.
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {SignatureChecker} from "@openzeppelin/contracts/utils/cryptography/SignatureChecker.sol";
import {Multicall} from "@openzeppelin/contracts/utils/Multicall.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";

/// Pulls a deposit from the payer into the settlement contract: the
/// interface between BatchSettlement.deposit and ERC3009DepositCollector.
interface IDepositCollector {
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external;
}

contract BatchSettlement is EIP712, Multicall, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    /// What a channel is; its EIP-712 hash is the channel's id.
    struct ChannelConfig {
        address payer;
        /// When not zero, the key that signs the payer's vouchers (ECDSA only).
        address payerAuthorizer;
        address receiver;
        /// Signs claim batches and refunds for the receiver side.
        address receiverAuthorizer;
        address token;
        /// Seconds between a payer's withdrawal request and its finalization:
        /// the receiver side's time to claim what it is owed.
        uint40 withdrawDelay;
        bytes32 salt;
    }

    struct Voucher {
        ChannelConfig channel;
        uint128 maxClaimableAmount;
    }

    /// A payer-signed voucher and the cumulative total claimed with it.
    struct VoucherClaim {
        Voucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }

    struct ChannelState {
        uint128 balance;
        uint128 totalClaimed;
    }

    struct WithdrawalState {
        uint128 amount;
        /// When the payer asked (unix seconds); zero when nothing is pending.
        uint40 initiatedAt;
    }

    struct ReceiverState {
        uint128 totalClaimed;
        uint128 totalSettled;
    }

    uint40 public constant MIN_WITHDRAW_DELAY = 15 minutes;
    uint40 public constant MAX_WITHDRAW_DELAY = 30 days;

    bytes32 public constant CHANNEL_CONFIG_TYPEHASH = keccak256(
        "ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)"
    );
    bytes32 public constant VOUCHER_TYPEHASH = keccak256("Voucher(bytes32 channelId,uint128 maxClaimableAmount)");
    bytes32 public constant REFUND_TYPEHASH = keccak256("Refund(bytes32 channelId,uint256 nonce,uint128 amount)");
    bytes32 public constant CLAIM_ENTRY_TYPEHASH =
        keccak256("ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)");
    bytes32 public constant CLAIM_BATCH_TYPEHASH = keccak256(
        "ClaimBatch(ClaimEntry[] claims)ClaimEntry(bytes32 channelId,uint128 maxClaimableAmount,uint128 totalClaimed)"
    );

    mapping(bytes32 channelId => ChannelState) public channels;
    /// Counts the refunds of a channel: a signed refund names the count it is
    /// for, so it is good once.
    mapping(bytes32 channelId => uint256) public refundNonce;
    mapping(bytes32 channelId => WithdrawalState) public pendingWithdrawals;
    mapping(address receiver => mapping(address token => ReceiverState)) public receivers;

    event ChannelCreated(bytes32 indexed channelId, ChannelConfig config);
    event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance);
    event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed);
    event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount);
    event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount);
    event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter);
    event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount);

    error InvalidChannel();
    error WithdrawDelayOutOfRange();
    error ZeroDeposit();
    error InvalidCollector();
    error DepositOverflow();
    error DepositCollectionFailed();
    error EmptyBatch();
    error NotAuthorizedToClaim();
    error NotReceiverAuthorizer();
    error InvalidSignature();
    error ClaimExceedsCeiling();
    error ClaimExceedsBalance();
    error NotAuthorizedToRefund();
    error InvalidRefundNonce();
    error ZeroRefund();
    error NotPayer();
    error NothingToWithdraw();
    error WithdrawalAlreadyPending();
    error WithdrawAmountExceedsAvailable();
    error WithdrawalNotPending();
    error WithdrawDelayNotElapsed();

    constructor() EIP712("x402 Batch Settlement", "1") {}

    // ------------------------------------------------------------ deposits

    /// Adds `amount` to the channel, pulled from the payer by `collector`.
    /// The contract's own token balance must grow by exactly `amount`, so a
    /// collector that pulls less (or a fee-taking token) cannot inflate a
    /// channel.
    function deposit(ChannelConfig calldata config, uint128 amount, address collector, bytes calldata collectorData)
        external
        nonReentrant
    {
        if (
            config.payer == address(0) || config.receiver == address(0) || config.receiverAuthorizer == address(0)
                || config.token == address(0)
        ) revert InvalidChannel();
        if (config.withdrawDelay < MIN_WITHDRAW_DELAY || config.withdrawDelay > MAX_WITHDRAW_DELAY) {
            revert WithdrawDelayOutOfRange();
        }
        if (amount == 0) revert ZeroDeposit();
        if (collector == address(0)) revert InvalidCollector();

        bytes32 channelId = getChannelId(config);
        ChannelState storage channel = channels[channelId];
        if (channel.balance > type(uint128).max - amount) revert DepositOverflow();
        bool first = channel.balance == 0 && channel.totalClaimed == 0;
        channel.balance += amount;

        IERC20 token = IERC20(config.token);
        uint256 before = token.balanceOf(address(this));
        IDepositCollector(collector).collect(config.payer, config.token, amount, channelId, collectorData);
        if (token.balanceOf(address(this)) != before + amount) revert DepositCollectionFailed();

        if (first) emit ChannelCreated(channelId, config);
        emit Deposited(channelId, msg.sender, amount, channel.balance);
    }

    // ------------------------------------------------------ claims, settles

    /// Records claims, sent by each channel's receiver or receiver authorizer.
    function claim(VoucherClaim[] calldata voucherClaims) external nonReentrant {
        if (voucherClaims.length == 0) revert EmptyBatch();
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            ChannelConfig calldata config = voucherClaims[i].voucher.channel;
            if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) {
                revert NotAuthorizedToClaim();
            }
            _claim(voucherClaims[i]);
        }
    }

    /// Records claims that one receiver authorizer signed as a batch; anyone
    /// (a facilitator) may send it.
    function claimWithSignature(VoucherClaim[] calldata voucherClaims, bytes calldata authorizerSignature)
        external
        nonReentrant
    {
        if (voucherClaims.length == 0) revert EmptyBatch();
        address authorizer = voucherClaims[0].voucher.channel.receiverAuthorizer;
        if (!SignatureChecker.isValidSignatureNow(authorizer, getClaimBatchDigest(voucherClaims), authorizerSignature))
        {
            revert InvalidSignature();
        }
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            if (voucherClaims[i].voucher.channel.receiverAuthorizer != authorizer) revert NotReceiverAuthorizer();
            _claim(voucherClaims[i]);
        }
    }

    /// Moves everything claimed and not yet settled for `receiver` in `token`
    /// to the receiver. Anyone may call it: the money only goes one way.
    function settle(address receiver, address token) external nonReentrant {
        ReceiverState storage state = receivers[receiver][token];
        uint128 amount = state.totalClaimed - state.totalSettled;
        if (amount == 0) return;
        state.totalSettled = state.totalClaimed;
        IERC20(token).safeTransfer(receiver, amount);
        emit Settled(receiver, token, msg.sender, amount);
    }

    // --------------------------------------------------------------- refunds

    /// A cooperative refund sent by the receiver side itself.
    function refund(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.receiver && msg.sender != config.receiverAuthorizer) revert NotAuthorizedToRefund();
        _refund(config, amount);
    }

    /// A cooperative refund the receiver authorizer signed for this channel's
    /// current refund count; anyone may send it.
    function refundWithSignature(
        ChannelConfig calldata config,
        uint128 amount,
        uint256 nonce,
        bytes calldata receiverAuthorizerSignature
    ) external nonReentrant {
        bytes32 channelId = getChannelId(config);
        if (nonce != refundNonce[channelId]) revert InvalidRefundNonce();
        if (!SignatureChecker.isValidSignatureNow(
                config.receiverAuthorizer, getRefundDigest(channelId, nonce, amount), receiverAuthorizerSignature
            )) revert InvalidSignature();
        _refund(config, amount);
    }

    // ------------------------------------------------- the payer's withdrawal

    /// The payer asks for `amount` of its unclaimed money back; it can take
    /// it `withdrawDelay` seconds later.
    function initiateWithdraw(ChannelConfig calldata config, uint128 amount) external nonReentrant {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) revert NotPayer();
        if (amount == 0) revert NothingToWithdraw();
        bytes32 channelId = getChannelId(config);
        WithdrawalState storage withdrawal = pendingWithdrawals[channelId];
        if (withdrawal.initiatedAt != 0) revert WithdrawalAlreadyPending();
        ChannelState storage channel = channels[channelId];
        if (amount > channel.balance - channel.totalClaimed) revert WithdrawAmountExceedsAvailable();
        withdrawal.amount = amount;
        withdrawal.initiatedAt = uint40(block.timestamp);
        emit WithdrawInitiated(channelId, amount, uint40(block.timestamp) + config.withdrawDelay);
    }

    /// After the delay, pays the payer what it asked for, capped at what is
    /// still unclaimed then (claims made during the delay come first).
    function finalizeWithdraw(ChannelConfig calldata config) external nonReentrant {
        if (msg.sender != config.payer && msg.sender != config.payerAuthorizer) revert NotPayer();
        bytes32 channelId = getChannelId(config);
        WithdrawalState storage withdrawal = pendingWithdrawals[channelId];
        if (withdrawal.initiatedAt == 0) revert WithdrawalNotPending();
        if (block.timestamp < uint256(withdrawal.initiatedAt) + config.withdrawDelay) {
            revert WithdrawDelayNotElapsed();
        }
        ChannelState storage channel = channels[channelId];
        uint128 available = channel.balance - channel.totalClaimed;
        uint128 amount = withdrawal.amount < available ? withdrawal.amount : available;
        delete pendingWithdrawals[channelId];
        channel.balance -= amount;
        emit WithdrawFinalized(channelId, msg.sender, amount);
        if (amount > 0) IERC20(config.token).safeTransfer(config.payer, amount);
    }

    // ------------------------------------------------------------------ views

    function getChannelId(ChannelConfig calldata config) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(CHANNEL_CONFIG_TYPEHASH, config)));
    }

    function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(VOUCHER_TYPEHASH, channelId, maxClaimableAmount)));
    }

    function getRefundDigest(bytes32 channelId, uint256 nonce, uint128 amount) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(REFUND_TYPEHASH, channelId, nonce, amount)));
    }

    /// EIP-712 hash of `ClaimBatch(ClaimEntry[] claims)`: an array member is
    /// encoded as the hash of its entries' struct hashes, concatenated.
    function getClaimBatchDigest(VoucherClaim[] calldata voucherClaims) public view returns (bytes32) {
        bytes32[] memory entries = new bytes32[](voucherClaims.length);
        for (uint256 i = 0; i < voucherClaims.length; ++i) {
            entries[i] = keccak256(
                abi.encode(
                    CLAIM_ENTRY_TYPEHASH,
                    getChannelId(voucherClaims[i].voucher.channel),
                    voucherClaims[i].voucher.maxClaimableAmount,
                    voucherClaims[i].totalClaimed
                )
            );
        }
        return _hashTypedDataV4(keccak256(abi.encode(CLAIM_BATCH_TYPEHASH, keccak256(abi.encodePacked(entries)))));
    }

    // --------------------------------------------------------------- internal

    /// Raises a channel's claimed total to `vc.totalClaimed`. Totals are
    /// cumulative, so a claim at or below what is already recorded changes
    /// nothing: a voucher claimed twice pays once.
    function _claim(VoucherClaim calldata vc) internal {
        ChannelConfig calldata config = vc.voucher.channel;
        bytes32 channelId = getChannelId(config);
        ChannelState storage channel = channels[channelId];
        if (vc.totalClaimed <= channel.totalClaimed) return;
        if (vc.totalClaimed > vc.voucher.maxClaimableAmount) revert ClaimExceedsCeiling();
        if (vc.totalClaimed > channel.balance) revert ClaimExceedsBalance();

        bytes32 digest = getVoucherDigest(channelId, vc.voucher.maxClaimableAmount);
        bool signed;
        if (config.payerAuthorizer != address(0)) {
            // A payer authorizer is a plain key: its signature is checked
            // without calling a contract that could answer otherwise later.
            (address signer, ECDSA.RecoverError error,) = ECDSA.tryRecover(digest, vc.signature);
            signed = error == ECDSA.RecoverError.NoError && signer == config.payerAuthorizer;
        } else {
            signed = SignatureChecker.isValidSignatureNow(config.payer, digest, vc.signature);
        }
        if (!signed) revert InvalidSignature();

        uint128 delta = vc.totalClaimed - channel.totalClaimed;
        channel.totalClaimed = vc.totalClaimed;
        receivers[config.receiver][config.token].totalClaimed += delta;
        emit Claimed(channelId, msg.sender, delta, vc.totalClaimed);
    }

    /// Returns up to `amount` of the channel's unclaimed money to the payer.
    /// The refund count moves on even when nothing is left to return, so a
    /// signature for this count is spent either way.
    function _refund(ChannelConfig calldata config, uint128 amount) internal {
        if (amount == 0) revert ZeroRefund();
        bytes32 channelId = getChannelId(config);
        refundNonce[channelId] += 1;
        ChannelState storage channel = channels[channelId];
        uint128 available = channel.balance - channel.totalClaimed;
        uint128 refunded = amount < available ? amount : available;
        if (refunded == 0) return;
        channel.balance -= refunded;

        // A pending withdrawal asked for money the refund has just returned.
        WithdrawalState storage withdrawal = pendingWithdrawals[channelId];
        if (withdrawal.initiatedAt != 0) {
            if (refunded >= withdrawal.amount) delete pendingWithdrawals[channelId];
            else withdrawal.amount -= refunded;
        }
        emit Refunded(channelId, msg.sender, refunded);
        IERC20(config.token).safeTransfer(config.payer, refunded);
    }
}
