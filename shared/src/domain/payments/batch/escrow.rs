//! What the escrow holds, read from the chain: for a channel, the state a
//! voucher is checked against ([`super::channel::decide`] asks for a read
//! when the one it keeps is older than the staleness bound); for a
//! receiver, what its claims credited it that is not paid out yet.

use alloy_primitives::{Address, B256};
use alloy_rpc_types_eth::BlockId;
use alloy_sol_types::{SolCall, sol};

use super::channel::OnChain;
use super::voucher::ESCROW;
use crate::domain::payments::chain::{Chain, ChainError};

sol! {
    /// What the channel holds, and what of it the receiver has claimed.
    function channels(bytes32 channelId) external view returns (uint128 balance, uint128 totalClaimed);
    /// The payer's pending withdrawal: how much, and when it asked (0: none).
    function pendingWithdrawals(bytes32 channelId) external view returns (uint128 amount, uint40 initiatedAt);
    /// How many cooperative refunds the channel has had: the next refund
    /// is signed for this count.
    function refundNonce(bytes32 channelId) external view returns (uint256);
    /// What claims credited the receiver in `token`, and what of it was
    /// paid out (`settle`).
    function receivers(address receiver, address token) external view returns (uint128 totalClaimed, uint128 totalSettled);
}

/// The escrow's state of `channel` at the latest block, every call read at
/// the same block (one Multicall3 round trip).
pub async fn read(chain: &Chain, channel: B256) -> Result<OnChain, ChainError> {
    let calls = [
        (ESCROW, channelsCall { channelId: channel }.abi_encode()),
        (ESCROW, pendingWithdrawalsCall { channelId: channel }.abi_encode()),
        (ESCROW, refundNonceCall { channelId: channel }.abi_encode()),
    ];
    let (_, answers) = chain.aggregate3(&calls, BlockId::latest()).await?;
    let silent = || ChainError::Malformed("the batch-settlement escrow did not answer".into());
    let [Some(held), Some(withdrawal), Some(refunds)] = answers.as_slice() else { return Err(silent()) };
    let held = channelsCall::abi_decode_returns(held).map_err(|_| silent())?;
    let withdrawal = pendingWithdrawalsCall::abi_decode_returns(withdrawal).map_err(|_| silent())?;
    let refunds = refundNonceCall::abi_decode_returns(refunds).map_err(|_| silent())?;
    Ok(OnChain {
        balance: held.balance,
        total_claimed: held.totalClaimed,
        withdraw_requested_at: withdrawal.initiatedAt.to::<u64>(),
        refund_nonce: refunds.saturating_to::<u64>(),
    })
}

/// What the escrow holds for `receiver` in `token` that claims credited it
/// and no `settle` has paid out yet.
pub async fn unpaid(chain: &Chain, receiver: Address, token: Address) -> Result<u128, ChainError> {
    let calls = [(ESCROW, receiversCall { receiver, token }.abi_encode())];
    let (_, answers) = chain.aggregate3(&calls, BlockId::latest()).await?;
    let silent = || ChainError::Malformed("the batch-settlement escrow did not answer".into());
    let [Some(answer)] = answers.as_slice() else { return Err(silent()) };
    let state = receiversCall::abi_decode_returns(answer).map_err(|_| silent())?;
    Ok(state.totalClaimed.saturating_sub(state.totalSettled))
}
