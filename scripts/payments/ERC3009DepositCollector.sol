// SPDX-License-Identifier: MIT
// The batch-settlement escrow's ERC-3009 deposit collector, for the local
// chain only (deploy.mjs copies its runtime code to @x402/evm's
// ERC3009_DEPOSIT_COLLECTOR_ADDRESS).
//
// A payer deposits without gas by signing the token's EIP-3009
// ReceiveWithAuthorization to this contract. `receiveWithAuthorization`
// only lets the payee (`to`) submit it, so nobody can front-run the
// authorization into a plain transfer; the collector receives the tokens
// and passes them on to the escrow, which checks its balance grew by the
// deposit. The authorization's nonce is keccak256(abi.encode(channelId,
// salt)), so a signature deposits into one channel only.
//
// Only the escrow may call `collect`: anyone else could otherwise spend a
// payer's signature into a channel of their choosing. The escrow's address
// is an immutable, so it survives the code copy.
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";

interface IERC3009Receive {
    function receiveWithAuthorization(
        address from,
        address to,
        uint256 value,
        uint256 validAfter,
        uint256 validBefore,
        bytes32 nonce,
        bytes memory signature
    ) external;
}

contract ERC3009DepositCollector {
    using SafeERC20 for IERC20;

    address public immutable x402BatchSettlement;

    error OnlyX402BatchSettlement();
    error InvalidX402BatchSettlementAddress();

    constructor(address settlement) {
        if (settlement == address(0)) revert InvalidX402BatchSettlementAddress();
        x402BatchSettlement = settlement;
    }

    /// `collectorData` is abi.encode(validAfter, validBefore, salt, signature).
    function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes calldata collectorData)
        external
    {
        if (msg.sender != x402BatchSettlement) revert OnlyX402BatchSettlement();
        (uint256 validAfter, uint256 validBefore, uint256 salt, bytes memory signature) =
            abi.decode(collectorData, (uint256, uint256, uint256, bytes));
        bytes32 nonce = keccak256(abi.encode(channelId, salt));
        IERC3009Receive(token).receiveWithAuthorization(
            payer, address(this), amount, validAfter, validBefore, nonce, signature
        );
        IERC20(token).safeTransfer(x402BatchSettlement, amount);
    }
}
