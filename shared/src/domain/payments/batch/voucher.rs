//! What a batch-settlement voucher is and who signed it, checked locally:
//! no chain, no facilitator. The EIP-712 types and domain are the escrow's
//! (`@x402/evm`'s `voucherTypes` and channel config type under
//! "x402 Batch Settlement" version 1, bound to the chain and the escrow's
//! address), so a voucher this file accepts is one the escrow will honour
//! when Reeve claims it, and none other.

use alloy_primitives::{Address, B256, Signature, U256};
use alloy_sol_types::{Eip712Domain, SolStruct, eip712_domain, sol};

sol! {
    /// A channel's immutable configuration; its EIP-712 hash is the
    /// channel's id.
    #[derive(Debug, PartialEq, Eq)]
    struct ChannelConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }

    /// What a payer signs: the most the receiver may ever claim from the
    /// channel, cumulatively.
    #[derive(Debug, PartialEq, Eq)]
    struct Voucher {
        bytes32 channelId;
        uint128 maxClaimableAmount;
    }
}

/// `@x402/evm`'s `BATCH_SETTLEMENT_ADDRESS`: the escrow, the same on every
/// chain.
pub const ESCROW: Address = alloy_primitives::address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");

/// The escrow's bounds on a channel's withdraw delay (seconds): a channel
/// outside them can never be deposited into.
pub const MIN_WITHDRAW_DELAY: u64 = 15 * 60;
pub const MAX_WITHDRAW_DELAY: u64 = 30 * 24 * 60 * 60;

/// The EIP-712 domain of everything signed for the escrow on `chain_id`.
pub fn domain(chain_id: u64) -> Eip712Domain {
    eip712_domain! {
        name: "x402 Batch Settlement",
        version: "1",
        chain_id: chain_id,
        verifying_contract: ESCROW,
    }
}

impl ChannelConfig {
    /// The channel's id on `chain_id` (the escrow's `getChannelId`).
    pub fn id(&self, chain_id: u64) -> B256 {
        self.eip712_signing_hash(&domain(chain_id))
    }

    /// Who signs its vouchers: the payer's authorizer when it names one,
    /// else the payer.
    pub fn voucher_signer(&self) -> Address {
        if self.payerAuthorizer.is_zero() { self.payer } else { self.payerAuthorizer }
    }
}

/// Why a voucher is not the payer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the voucher's signature is not a 65-byte ECDSA signature")]
    Malformed,
    /// The escrow (OpenZeppelin's ECDSA) refuses the upper half of `s`: a
    /// voucher signed so could never be claimed.
    #[error("the voucher's signature has a high s value, which the escrow refuses")]
    HighS,
    #[error("the voucher is signed by {signer}, not by the channel's payer or its authorizer {expected}")]
    AnotherKey { signer: Address, expected: Address },
}

/// The upper bound of a canonical ECDSA `s` on secp256k1 (n / 2).
const HALF_ORDER: U256 =
    alloy_primitives::uint!(0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0_U256);

/// Checks that `signature` over the voucher `(channel, ceiling)` on
/// `chain_id` is by the channel's voucher signer, as the escrow will when
/// the voucher is claimed. Only plain keys (ECDSA) are checked: a payer
/// that is a contract (ERC-1271) would need a chain call, and is refused as
/// another key.
pub fn check_signature(
    config: &ChannelConfig,
    chain_id: u64,
    ceiling: u128,
    signature: &[u8],
) -> Result<(), SignatureError> {
    let signature = Signature::from_raw(signature).map_err(|_| SignatureError::Malformed)?;
    if signature.s() > HALF_ORDER {
        return Err(SignatureError::HighS);
    }
    let voucher = Voucher { channelId: config.id(chain_id), maxClaimableAmount: ceiling };
    let digest = voucher.eip712_signing_hash(&domain(chain_id));
    let signer = signature.recover_address_from_prehash(&digest).map_err(|_| SignatureError::Malformed)?;
    let expected = config.voucher_signer();
    if signer != expected {
        return Err(SignatureError::AnotherKey { signer, expected });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::aliases::U40;
    use alloy_primitives::{address, b256, hex};

    const CHAIN: u64 = 84532;

    /// A channel and a voucher for it made by `@x402/evm` 2.27 itself
    /// (`computeChannelId`, `signVoucher`, anvil's account 1 as payer and
    /// payer authorizer, as the package's client sets it).
    fn official() -> (ChannelConfig, B256, Vec<u8>) {
        let payer = address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        let config = ChannelConfig {
            payer,
            payerAuthorizer: payer,
            receiver: address!("0x3333333333333333333333333333333333333333"),
            receiverAuthorizer: address!("0x4444444444444444444444444444444444444444"),
            token: address!("0x036CbD53842c5426634e7929541eC2318f3dCF7e"),
            withdrawDelay: U40::from(900),
            salt: B256::ZERO,
        };
        let id = b256!("0xfe877dc4819ae963aa4af45584c77bec299db0b11f2762c13752c6bf97f4d088");
        let signature = hex!(
            "7af5c3d5d7773e8b067e43a4c6d93e03c122d88166fa2a75f3653df62cc9f0ee349c41e6a1c1e71f5b76b7534b3cada409c221998aa82f6c511c19a031a757931c"
        );
        (config, id, signature.to_vec())
    }

    #[test]
    fn a_channel_has_the_id_the_official_package_computes() {
        let (config, id, _) = official();
        assert_eq!(config.id(CHAIN), id);
        // Another chain, another channel: a voucher cannot cross chains.
        assert_ne!(config.id(8453), id);
    }

    #[test]
    fn a_voucher_the_official_client_signed_is_its_payers_for_that_amount_only() {
        let (config, _, signature) = official();
        assert_eq!(check_signature(&config, CHAIN, 3000, &signature), Ok(()));
        // The same signature over another amount, channel or chain names
        // another signer.
        assert!(matches!(check_signature(&config, CHAIN, 3001, &signature), Err(SignatureError::AnotherKey { .. })));
        let other = ChannelConfig { salt: B256::repeat_byte(1), ..config.clone() };
        assert!(matches!(check_signature(&other, CHAIN, 3000, &signature), Err(SignatureError::AnotherKey { .. })));
        assert!(matches!(check_signature(&config, 8453, 3000, &signature), Err(SignatureError::AnotherKey { .. })));
    }

    #[test]
    fn a_voucher_signed_by_anyone_but_the_payers_authorizer_is_refused() {
        // The channel names an authorizer other than the key that signed.
        let (config, _, signature) = official();
        let authorizer = address!("0x5555555555555555555555555555555555555555");
        let delegated = ChannelConfig { payerAuthorizer: authorizer, ..config };
        let refused = check_signature(&delegated, CHAIN, 3000, &signature);
        assert!(
            matches!(refused, Err(SignatureError::AnotherKey { expected, .. }) if expected == authorizer),
            "{refused:?}"
        );
    }

    #[test]
    fn a_signature_the_escrow_would_refuse_is_refused_here() {
        let (config, _, signature) = official();
        assert_eq!(check_signature(&config, CHAIN, 3000, &signature[..64]), Err(SignatureError::Malformed));
        // The same signature with s mirrored into the upper half: valid
        // ECDSA for the same key, but never claimable.
        let parsed = Signature::from_raw(&signature).unwrap();
        let order = alloy_primitives::uint!(0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141_U256);
        let high = Signature::new(parsed.r(), order - parsed.s(), !parsed.v());
        assert_eq!(check_signature(&config, CHAIN, 3000, &high.as_bytes()), Err(SignatureError::HighS));
    }
}
