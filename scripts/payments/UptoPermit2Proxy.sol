// SPDX-License-Identifier: MIT
// x402's `upto` settlement contract for the local chain only.
//
// No registry package ships the bytecode of x402's x402UptoPermit2Proxy, but
// @x402/evm publishes its ABI (x402UptoPermit2ProxyABI) and the witness the
// clients sign (uptoPermit2WitnessTypes). This contract implements that ABI,
// compile.mjs checks every entry of it against the compiled one, and
// deploy.mjs copies its runtime code to the address the clients and the
// facilitator name (0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002).
//
// What a payer signs is a Permit2 PermitWitnessTransferFrom whose spender is
// this contract: up to `permitted.amount` of one token, before `deadline`,
// bound by the witness to one recipient (`to`) and one facilitator. The
// facilitator later chooses how much of it to take (the task's actual use);
// Permit2 itself refuses more than was signed, a spent nonce and a passed
// deadline.
//
// PERMIT2 is an immutable, so it lives in the runtime code and survives the
// copy; the reentrancy guard is transient storage (Cancun or later), so the
// copy needs no constructor-initialised storage either.
pragma solidity ^0.8.24;

import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ISignatureTransfer} from "@uniswap/v4-periphery/lib/permit2/src/interfaces/ISignatureTransfer.sol";

contract UptoPermit2Proxy is ReentrancyGuardTransient {
    /// The witness a payer signs: where the money goes, which facilitator may
    /// move it, and from when.
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    /// An EIP-2612 permit that approves Permit2 for the payer, so a payer who
    /// never sent an `approve` still pays without gas.
    struct EIP2612Permit {
        uint256 value;
        uint256 deadline;
        bytes32 r;
        bytes32 s;
        uint8 v;
    }

    // Permit2 hashes "PermitWitnessTransferFrom(TokenPermissions permitted,
    // address spender,uint256 nonce,uint256 deadline," + this string; EIP-712
    // lists referenced types alphabetically, so TokenPermissions comes first.
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,address facilitator,uint256 validAfter)");

    ISignatureTransfer public immutable PERMIT2;

    event Settled();
    event SettledWithPermit();

    error AmountExceedsPermitted();
    error InvalidDestination();
    error InvalidOwner();
    error InvalidPermit2Address();
    error PaymentTooEarly();
    error Permit2612AmountMismatch();
    error UnauthorizedFacilitator();

    constructor(address permit2) {
        if (permit2 == address(0)) revert InvalidPermit2Address();
        PERMIT2 = ISignatureTransfer(permit2);
    }

    /// Takes `amount` (at most what was signed) from `owner` to the witness's
    /// recipient. Only the facilitator the payer named may call it.
    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _settle(permit, amount, owner, witness, signature);
        emit Settled();
    }

    /// The same, after applying the payer's EIP-2612 permit for Permit2. A
    /// permit that fails (already used, or an allowance already in place) is
    /// ignored: the transfer then stands or falls on the existing allowance.
    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        if (permit2612.value != permit.permitted.amount) revert Permit2612AmountMismatch();
        try IERC20Permit(permit.permitted.token).permit(
            owner, address(PERMIT2), permit2612.value, permit2612.deadline, permit2612.v, permit2612.r, permit2612.s
        ) {} catch {}
        _settle(permit, amount, owner, witness, signature);
        emit SettledWithPermit();
    }

    function _settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        if (owner == address(0)) revert InvalidOwner();
        if (witness.to == address(0)) revert InvalidDestination();
        // The facilitator is part of what was signed: any other sender could
        // otherwise settle a payer's authorization for a different amount.
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
        bytes32 witnessHash = keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.facilitator, witness.validAfter));
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: amount}),
            owner,
            witnessHash,
            WITNESS_TYPE_STRING,
            signature
        );
    }
}
