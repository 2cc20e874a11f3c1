// SPDX-License-Identifier: MIT
// A test stablecoin for the local chain only: an ERC-20 with USDC's EIP-3009
// `transferWithAuthorization`, which is what x402's `exact` scheme settles
// with, its `receiveWithAuthorization`, which batch settlement's deposit
// collector pulls a deposit with, and USDC's EIP-2612 `permit`, which lets an `upto` payer approve
// Permit2 by signature (the eip2612GasSponsoring extension) instead of
// sending an `approve` and paying its gas. Anyone may mint: the chain is a
// throwaway anvil on loopback.
//
// Name and symbol are constants rather than storage so the runtime code can
// be copied to another address (anvil_setCode) and still answer correctly;
// OpenZeppelin's EIP712 keeps its domain in immutables and recomputes the
// separator for the new address by itself.
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {IERC20Permit} from "@openzeppelin/contracts/token/ERC20/extensions/IERC20Permit.sol";
import {SignatureChecker} from "@openzeppelin/contracts/utils/cryptography/SignatureChecker.sol";

contract Token is ERC20, EIP712, IERC20Permit {
    bytes32 public constant TRANSFER_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );

    bytes32 public constant RECEIVE_WITH_AUTHORIZATION_TYPEHASH = keccak256(
        "ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
    );

    bytes32 public constant PERMIT_TYPEHASH =
        keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)");

    mapping(address => mapping(bytes32 => bool)) private _used;
    // Declared after `_used` (not inherited from OpenZeppelin's Nonces, which
    // would come first), so a chain holding the older token keeps its
    // balances and used authorizations when deploy.mjs replaces the code.
    mapping(address => uint256) private _permitNonces;

    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);

    constructor() ERC20("", "") EIP712("USDC", "2") {}

    function name() public pure override returns (string memory) { return "USDC"; }
    function symbol() public pure override returns (string memory) { return "USDC"; }
    function decimals() public pure override returns (uint8) { return 6; }
    function version() external pure returns (string memory) { return "2"; }
    function DOMAIN_SEPARATOR() external view returns (bytes32) { return _domainSeparatorV4(); }
    function nonces(address owner) external view returns (uint256) { return _permitNonces[owner]; }

    function mint(address to, uint256 value) external { _mint(to, value); }

    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool) {
        return _used[authorizer][nonce];
    }

    function transferWithAuthorization(
        address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce,
        bytes memory signature
    ) public {
        _useAuthorization(
            TRANSFER_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce, signature
        );
    }

    // Like transferWithAuthorization, but only the payee may submit it, so an
    // authorization seen in the mempool cannot be spent by anyone else
    // (ERC-3009's answer to front-running a contract's deposit).
    function receiveWithAuthorization(
        address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce,
        bytes memory signature
    ) public {
        require(to == msg.sender, "caller must be the payee");
        _useAuthorization(
            RECEIVE_WITH_AUTHORIZATION_TYPEHASH, from, to, value, validAfter, validBefore, nonce, signature
        );
    }

    function receiveWithAuthorization(
        address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce,
        uint8 v, bytes32 r, bytes32 s
    ) external {
        receiveWithAuthorization(from, to, value, validAfter, validBefore, nonce, abi.encodePacked(r, s, v));
    }

    // Both kinds share one set of used nonces, as in USDC.
    function _useAuthorization(
        bytes32 typehash, address from, address to, uint256 value, uint256 validAfter, uint256 validBefore,
        bytes32 nonce, bytes memory signature
    ) private {
        require(block.timestamp > validAfter, "authorization is not yet valid");
        require(block.timestamp < validBefore, "authorization is expired");
        require(!_used[from][nonce], "authorization is used or canceled");
        bytes32 digest = _hashTypedDataV4(keccak256(abi.encode(
            typehash, from, to, value, validAfter, validBefore, nonce
        )));
        require(SignatureChecker.isValidSignatureNow(from, digest, signature), "invalid signature");
        _used[from][nonce] = true;
        emit AuthorizationUsed(from, nonce);
        _transfer(from, to, value);
    }

    function transferWithAuthorization(
        address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce,
        uint8 v, bytes32 r, bytes32 s
    ) external {
        transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, abi.encodePacked(r, s, v));
    }

    function permit(address owner, address spender, uint256 value, uint256 deadline, uint8 v, bytes32 r, bytes32 s)
        external
    {
        require(block.timestamp <= deadline, "permit is expired");
        bytes32 digest = _hashTypedDataV4(keccak256(abi.encode(
            PERMIT_TYPEHASH, owner, spender, value, _permitNonces[owner]++, deadline
        )));
        require(SignatureChecker.isValidSignatureNow(owner, digest, abi.encodePacked(r, s, v)), "invalid signature");
        _approve(owner, spender, value);
    }
}
