//! Each payment network's JSON-RPC endpoint, read with alloy's provider:
//! blocks, logs, receipts and view calls, each bounded by [`RPC_TIMEOUT`].
//! What those reads prove about a payment is [`super::proof`]'s.
//!
//! The endpoints are an operator setting, [`CHAIN_RPC_URLS`], one per
//! network (`eip155:8453=https://…,eip155:84532=http://127.0.0.1:8545`),
//! like the facilitator's URL. They are reached through the operators'
//! outbound policy with the endpoint's own host as the only allow-list
//! entry: never through the users' client, which task inputs steer.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::time::Duration;

use alloy_network::Ethereum;
use alloy_primitives::{Address, B256, Bytes};
use alloy_provider::{Provider, RootProvider};
use alloy_rpc_client::RpcClient;
use alloy_rpc_types_eth::{BlockId, BlockNumberOrTag, Filter, Log, TransactionReceipt, TransactionRequest};
use alloy_transport_http::Http;

use crate::infra::outbound::{Outbound, OutboundPolicy};

/// The operator setting: `network=url` pairs, comma-separated.
pub const CHAIN_RPC_URLS: &str = "REEVE_CHAIN_RPC_URLS";

/// One JSON-RPC call may take this long: a sweep reads several, and a paid
/// create waits for a few.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The whole URL, only to scrub it from an error's text.
    url: String,
    provider: RootProvider<Ethereum>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("endpoint", &self.shown).finish_non_exhaustive()
    }
}

/// What a transaction asked for: its sender, the contract it called (none
/// for a deployment) and the call's data.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct SentTransaction {
    pub from: Address,
    pub to: Option<Address>,
    pub input: Bytes,
}

/// A block's number and time (unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub number: u64,
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
        Ok(Chain { shown, url: url.to_owned(), provider })
    }

    /// The latest block.
    pub async fn head(&self) -> Result<Block, ChainError> {
        self.block(BlockNumberOrTag::Latest).await
    }

    /// Block `at`.
    pub async fn block(&self, at: impl Into<BlockNumberOrTag>) -> Result<Block, ChainError> {
        let block = self.bounded("eth_getBlockByNumber", self.provider.get_block_by_number(at.into())).await?;
        let block = block.ok_or_else(|| ChainError::Rpc(format!("{}: no such block", self.shown)))?;
        Ok(Block { number: block.header.number, timestamp: block.header.timestamp })
    }

    /// The logs `filter` matches (its block range kept small by the caller:
    /// hosted endpoints refuse wide ones).
    pub async fn logs(&self, filter: &Filter) -> Result<Vec<Log>, ChainError> {
        self.bounded("eth_getLogs", self.provider.get_logs(filter)).await
    }

    /// A transaction's receipt: `None` while it is not mined (or unknown).
    pub async fn receipt(&self, transaction: B256) -> Result<Option<TransactionReceipt>, ChainError> {
        self.bounded("eth_getTransactionReceipt", self.provider.get_transaction_receipt(transaction)).await
    }

    /// A transaction as it was sent: who sent it, to whom, and its
    /// calldata (what it asked a contract to do). `None`: unknown.
    pub async fn transaction(&self, transaction: B256) -> Result<Option<SentTransaction>, ChainError> {
        let sent: Option<SentTransaction> = self
            .bounded(
                "eth_getTransactionByHash",
                self.provider.raw_request("eth_getTransactionByHash".into(), (transaction,)),
            )
            .await?;
        Ok(sent)
    }

    /// A view call to `to` at block `at`.
    pub async fn call(&self, to: Address, input: Vec<u8>, at: u64) -> Result<Bytes, ChainError> {
        let request = TransactionRequest::default().to(to).input(input.into());
        self.bounded("eth_call", self.provider.call(request).block(BlockId::number(at))).await
    }

    /// One call within [`RPC_TIMEOUT`], its error without the endpoint's path.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        what: &str,
        call: impl IntoFuture<Output = Result<T, E>>,
    ) -> Result<T, ChainError> {
        match tokio::time::timeout(RPC_TIMEOUT, call.into_future()).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(ChainError::Rpc(format!(
                "{}: {what}: {}",
                self.shown,
                e.to_string().replace(&self.url, &self.shown)
            ))),
            Err(_) => Err(ChainError::Rpc(format!(
                "{}: {what} did not answer within {} s",
                self.shown,
                RPC_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// A transaction hash as JSON-RPC spells it.
pub fn parse_hash(hash: &str) -> Result<B256, ChainError> {
    hash.parse().map_err(|_| ChainError::Malformed(format!("transaction {hash:?}")))
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
}
