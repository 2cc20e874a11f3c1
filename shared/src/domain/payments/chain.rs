//! What the chain says about a payment: EIP-3009's
//! `authorizationState(authorizer, nonce)`, read through each network's
//! JSON-RPC endpoint with alloy's provider, to resolve a settlement whose
//! outcome Reeve never learnt.
//!
//! The endpoints are an operator setting, [`CHAIN_RPC_URLS`], one per
//! network (`eip155:8453=https://…,eip155:84532=http://127.0.0.1:8545`),
//! like the facilitator's URL. They are reached through the operators'
//! outbound policy with the endpoint's own host as the only allow-list
//! entry: never through the users' client, which task inputs steer.
//!
//! An authorization can land only in a block whose timestamp is before its
//! `validBefore`. So a nonce still unused at a block at or past
//! `validBefore` can never be used by that authorization: the read pins the
//! state to the block whose time it compares.

use std::collections::BTreeMap;
use std::time::Duration;

use alloy_network::Ethereum;
use alloy_primitives::{Address, B256, U256};
use alloy_provider::{Provider, RootProvider};
use alloy_rpc_client::RpcClient;
use alloy_rpc_types_eth::{BlockId, BlockNumberOrTag, TransactionRequest};
use alloy_sol_types::{SolCall, sol};
use alloy_transport_http::Http;

use crate::infra::outbound::{Outbound, OutboundPolicy};

/// The operator setting: `network=url` pairs, comma-separated.
pub const CHAIN_RPC_URLS: &str = "REEVE_CHAIN_RPC_URLS";

/// One JSON-RPC call may take this long.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

sol! {
    /// EIP-3009: whether `nonce` of `authorizer` was used (or canceled).
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
}

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("no JSON-RPC endpoint for {0} (set {CHAIN_RPC_URLS})")]
    NoEndpoint(String),
    #[error("{0}")]
    Malformed(String),
    #[error("JSON-RPC: {0}")]
    Rpc(String),
}

/// Every network's endpoint.
#[derive(Clone, Debug, Default)]
pub struct Chains {
    by_network: BTreeMap<String, Chain>,
}

/// One network's endpoint.
#[derive(Clone)]
pub struct Chain {
    /// Scheme and host only: the path of a hosted endpoint often holds its
    /// API key, so it never goes to a log.
    shown: String,
    provider: RootProvider<Ethereum>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("endpoint", &self.shown).finish_non_exhaustive()
    }
}

/// An authorization as the chain has it at one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub used: bool,
    pub block: u64,
    /// The block's timestamp (unix seconds).
    pub timestamp: u64,
}

impl Chains {
    /// No endpoint at all: nothing can be resolved from the chain.
    pub fn none() -> Chains {
        Chains::default()
    }

    /// Parses [`CHAIN_RPC_URLS`]' value. Every problem is reported, without
    /// repeating a URL's path.
    pub fn parse(text: &str) -> Result<Chains, Vec<String>> {
        let mut chains = Chains::default();
        let mut problems = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((network, url)) = entry.split_once('=') else {
                problems.push(format!("{CHAIN_RPC_URLS}: {:?} is not network=url", shown_entry(entry)));
                continue;
            };
            let network = network.trim();
            if !network.starts_with("eip155:") || network[7..].parse::<u64>().is_err() {
                problems.push(format!("{CHAIN_RPC_URLS}: {network:?} is not an eip155:<chain id> network"));
                continue;
            }
            match Chain::new(url.trim()) {
                Ok(chain) => {
                    if chains.by_network.insert(network.to_owned(), chain).is_some() {
                        problems.push(format!("{CHAIN_RPC_URLS}: {network} is listed twice"));
                    }
                }
                Err(e) => problems.push(format!("{CHAIN_RPC_URLS}: {network}: {e}")),
            }
        }
        if problems.is_empty() { Ok(chains) } else { Err(problems) }
    }

    /// Logs the catalog's payment networks that have no endpoint: an
    /// unknown settlement on one of them stays pending until it has.
    pub fn warn_missing(&self, catalog: &crate::domain::catalog::Catalog) {
        let missing = self.missing(catalog.assets.values().map(|a| a.network.as_str()));
        if !missing.is_empty() && catalog.payments.is_some() {
            tracing::warn!(
                networks = %missing.join(", "),
                "no JSON-RPC endpoint ({CHAIN_RPC_URLS}) for these payment networks: a payment on them whose \
                 settlement's outcome is lost stays pending until one is set"
            );
        }
    }

    pub fn get(&self, network: &str) -> Result<&Chain, ChainError> {
        self.by_network.get(network).ok_or_else(|| ChainError::NoEndpoint(network.to_owned()))
    }

    /// The networks of `wanted` without an endpoint.
    pub fn missing<'a>(&self, wanted: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let mut missing: Vec<String> =
            wanted.into_iter().filter(|n| !self.by_network.contains_key(*n)).map(str::to_owned).collect();
        missing.sort();
        missing.dedup();
        missing
    }
}

/// `network=` and the URL's scheme and host, for a message.
fn shown_entry(entry: &str) -> String {
    entry.split_once("://").map_or_else(
        || entry.chars().take(40).collect(),
        |(scheme, rest)| format!("{scheme}://{}", rest.split(['/', '?']).next().unwrap_or_default()),
    )
}

impl Chain {
    /// An endpoint at `url`: https, or plain http on loopback (the local
    /// chain), reached through the operators' outbound policy.
    pub fn new(url: &str) -> Result<Chain, String> {
        let parsed = reqwest::Url::parse(url).map_err(|_| "the endpoint is not a URL".to_owned())?;
        let host = parsed.host_str().unwrap_or_default().to_owned();
        let shown = format!("{}://{host}", parsed.scheme());
        let loopback = matches!(host.as_str(), "127.0.0.1" | "localhost" | "[::1]" | "::1");
        if parsed.scheme() != "https" && !(parsed.scheme() == "http" && loopback) {
            return Err(format!("{shown} must use https (plain http only for 127.0.0.1, localhost or [::1])"));
        }
        let policy = OutboundPolicy {
            timeout: RPC_TIMEOUT,
            ..super::facilitator::operator_policy(url).map_err(|_| format!("{shown}: not a usable URL"))?
        };
        let outbound = Outbound::new(policy).map_err(|e| format!("{shown}: {e}"))?;
        outbound.check_url(url).map_err(|_| format!("{shown}: refused by the outbound policy"))?;
        let transport = Http::with_client(outbound.reqwest_client(), parsed);
        let provider = RootProvider::new(RpcClient::new(transport, loopback));
        Ok(Chain { shown, provider })
    }

    /// Whether `nonce` of `authorizer` is used on `token`, at the latest
    /// block, with that block's number and time.
    pub async fn authorization(&self, token: &str, authorizer: &str, nonce: &str) -> Result<Seen, ChainError> {
        let token: Address = token.parse().map_err(|_| ChainError::Malformed(format!("token {token:?}")))?;
        let authorizer: Address =
            authorizer.parse().map_err(|_| ChainError::Malformed(format!("authorizer {authorizer:?}")))?;
        let nonce: B256 = nonce.parse().map_err(|_| ChainError::Malformed(format!("nonce {nonce:?}")))?;
        let rpc = |e| rpc_error(&self.shown, e);
        let block = self
            .provider
            .get_block_by_number(BlockNumberOrTag::Latest)
            .await
            .map_err(rpc)?
            .ok_or_else(|| ChainError::Rpc(format!("{}: no latest block", self.shown)))?;
        let (number, timestamp) = (block.header.number, block.header.timestamp);
        let call = TransactionRequest::default()
            .to(token)
            .input(authorizationStateCall { authorizer, nonce }.abi_encode().into());
        let answer = self.provider.call(call).block(BlockId::number(number)).await.map_err(rpc)?;
        let used = authorizationStateCall::abi_decode_returns(&answer)
            .map_err(|e| ChainError::Rpc(format!("{}: authorizationState answered {e}", self.shown)))?;
        Ok(Seen { used, block: number, timestamp })
    }
}

fn rpc_error(shown: &str, e: impl std::fmt::Display) -> ChainError {
    ChainError::Rpc(format!("{shown}: {e}"))
}

/// Whether an authorization valid before `valid_before` (decimal unix
/// seconds) can still land, seen at a block of `timestamp`.
pub fn can_still_land(valid_before: &str, timestamp: u64) -> bool {
    match valid_before.parse::<U256>() {
        Ok(before) => U256::from(timestamp) < before,
        // Unreadable: assume it can, so it is never failed on a guess.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_one_per_network_and_never_shown_whole() {
        let chains =
            Chains::parse("eip155:84532=http://127.0.0.1:8545, eip155:8453=https://rpc.example/v2/SECRET").unwrap();
        assert!(chains.get("eip155:84532").is_ok());
        assert_eq!(chains.missing(["eip155:8453", "eip155:1", "eip155:1"]), ["eip155:1"]);
        let shown = format!("{:?}", chains.get("eip155:8453").unwrap());
        assert!(shown.contains("https://rpc.example") && !shown.contains("SECRET"), "{shown}");

        let problems = Chains::parse("eip155:8453=http://rpc.example/v2/SECRET,base=https://x,eip155:1").unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().all(|p| !p.contains("SECRET")), "{problems:?}");
        assert!(problems[0].contains("must use https"), "{problems:?}");
        assert!(Chains::parse("eip155:1=https://a,eip155:1=https://b").unwrap_err()[0].contains("twice"));
        assert!(Chains::parse("").unwrap().missing(["eip155:1"]) == ["eip155:1"]);
    }

    #[test]
    fn an_authorization_lands_only_in_a_block_before_valid_before() {
        assert!(can_still_land("1000", 999));
        assert!(!can_still_land("1000", 1000));
        assert!(!can_still_land("1000", 1001));
        assert!(can_still_land("115792089237316195423570985008687907853269984665640564039457584007913129639935", 5));
        assert!(can_still_land("not a number", u64::MAX));
    }
}
