//! Each payment network's JSON-RPC endpoint, read with alloy's provider:
//! blocks, logs, receipts and view calls, each bounded by [`RPC_TIMEOUT`].
//! What those reads prove about a payment is [`super::proof`]'s.
//!
//! The endpoints are an operator setting, [`CHAIN_RPC_URLS`], one per
//! network (`eip155:8453=https://…,eip155:84532=http://127.0.0.1:8545`),
//! like the facilitator's URL. They are reached through the operators'
//! outbound policy with the endpoint's own host as the only allow-list
//! entry: never through the users' client, which task inputs steer.
//!
//! A catalog that prices in a network without an endpoint is refused
//! ([`Chains::unproven_prices`]): without one, a payment on it could only
//! be taken on the facilitator's word.
//!
//! What counts as proof is read at [`Chain::confirmed_head`]: the latest
//! block less the network's confirmations ([`CHAIN_CONFIRMATIONS`], 0 unless
//! set), so a block a reorganisation could still drop proves nothing.
//!
//! [`Chain::aggregate3`] reads several view calls at one block in one round
//! trip, through Multicall3 at its canonical address ([`MULTICALL3`]).

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::time::Duration;

use alloy_network::Ethereum;
use alloy_primitives::{Address, B256, Bytes};
use alloy_provider::{Provider, RootProvider};
use alloy_rpc_client::RpcClient;
use alloy_rpc_types_eth::{BlockId, BlockNumberOrTag, Filter, Log, TransactionReceipt, TransactionRequest};
use alloy_sol_types::{SolCall, sol};
use alloy_transport_http::Http;

use crate::infra::outbound::{Outbound, OutboundPolicy};

/// The operator setting: `network=url` pairs, comma-separated.
pub const CHAIN_RPC_URLS: &str = "REEVE_CHAIN_RPC_URLS";

/// The operator setting: `network=n` pairs, comma-separated: how many
/// blocks must follow one before what it holds counts as proof. 0 for a
/// network not listed.
pub const CHAIN_CONFIRMATIONS: &str = "REEVE_CHAIN_CONFIRMATIONS";

/// The most confirmations a network may be given: more would outwait the
/// paid create's budget on any chain and prove nothing more.
pub const MAX_CONFIRMATIONS: u64 = 64;

/// Multicall3, at its canonical address on every chain (scripts/payments.sh
/// places it on the local one).
pub const MULTICALL3: &str = "0xcA11bde05977b3631167028862bE2a173976CA11";

sol! {
    /// Multicall3's `Call3`: a call that may fail without failing the rest.
    struct Call3 { address target; bool allowFailure; bytes callData; }
    /// Multicall3's `Result`.
    struct Call3Result { bool success; bytes returnData; }
    /// Multicall3: every call at the same block.
    function aggregate3(Call3[] calls) external payable returns (Call3Result[] returnData);
    /// Multicall3: the block's timestamp.
    function getCurrentBlockTimestamp() external view returns (uint256 timestamp);
    /// Multicall3: the block's number.
    function getBlockNumber() external view returns (uint256 blockNumber);
}

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
    /// Blocks that must follow one before it proves anything.
    confirmations: u64,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("endpoint", &self.shown)
            .field("confirmations", &self.confirmations)
            .finish_non_exhaustive()
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

    /// Sets each network's confirmations from [`CHAIN_CONFIRMATIONS`]'
    /// value (`eip155:8453=3,…`); a network not listed keeps 0. Every
    /// problem is reported: a malformed pair, a number out of range, a
    /// network without an endpoint.
    pub fn with_confirmations(mut self, text: &str) -> Result<Chains, Vec<String>> {
        let mut problems = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((network, n)) = entry.split_once('=') else {
                problems.push(format!("{CHAIN_CONFIRMATIONS}: {entry:?} is not network=blocks"));
                continue;
            };
            let network = network.trim();
            let Some(n) = n.trim().parse::<u64>().ok().filter(|n| *n <= MAX_CONFIRMATIONS) else {
                problems.push(format!(
                    "{CHAIN_CONFIRMATIONS}: {network}: blocks must be an integer from 0 to {MAX_CONFIRMATIONS}"
                ));
                continue;
            };
            match self.by_network.get_mut(network) {
                Some(chain) => chain.confirmations = n,
                None => problems.push(format!(
                    "{CHAIN_CONFIRMATIONS}: {network} has no endpoint in {CHAIN_RPC_URLS} to confirm blocks on"
                )),
            }
        }
        if problems.is_empty() { Ok(self) } else { Err(problems) }
    }

    /// One problem per network `catalog` prices in that has no endpoint,
    /// naming the variable, the network and the prices on it: a payment
    /// there could only be taken on the facilitator's word.
    pub fn unproven_prices(&self, catalog: &crate::domain::catalog::Catalog) -> Vec<String> {
        let mut by_network: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (kind, task) in &catalog.tasks {
            for (index, price) in task.accepts.iter().enumerate() {
                let Some(asset) = catalog.assets.get(&price.asset) else { continue };
                if !self.by_network.contains_key(&asset.network) {
                    by_network.entry(&asset.network).or_default().push(format!("tasks.{kind}.accepts[{index}]"));
                }
            }
        }
        by_network
            .into_iter()
            .map(|(network, prices)| {
                format!(
                    "{CHAIN_RPC_URLS} has no JSON-RPC endpoint for {network}, which {} prices in: without one no \
                     payment on it can be proven; add {network}=https://… to {CHAIN_RPC_URLS}",
                    prices.join(", ")
                )
            })
            .collect()
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
        Ok(Chain { shown, url: url.to_owned(), provider, confirmations: 0 })
    }

    /// The blocks that must follow one before it proves anything.
    pub fn confirmations(&self) -> u64 {
        self.confirmations
    }

    /// The latest block.
    pub async fn head(&self) -> Result<Block, ChainError> {
        self.block(BlockNumberOrTag::Latest).await
    }

    /// The latest block that has the network's confirmations after it: the
    /// last one whose contents count as proof (the head itself with 0
    /// confirmations; one read more otherwise). A payment, a nonce's use or
    /// a deadline passed is read at or before it, never past it.
    pub async fn confirmed_head(&self) -> Result<Block, ChainError> {
        let head = self.head().await?;
        if self.confirmations == 0 {
            return Ok(head);
        }
        self.block(head.number.saturating_sub(self.confirmations)).await
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

    /// Each of `calls` (`to`, input) run at block `at`, in one `eth_call`
    /// through Multicall3's `aggregate3`, each allowed to fail alone: their
    /// answers in order (`None` for a call that reverted), and the block's
    /// number and timestamp as Multicall3 read them.
    pub async fn aggregate3(
        &self,
        calls: &[(Address, Vec<u8>)],
        at: BlockId,
    ) -> Result<(Block, Vec<Option<Bytes>>), ChainError> {
        let multicall: Address = MULTICALL3.parse().expect("a valid address");
        let mut call3: Vec<Call3> = calls
            .iter()
            .map(|(target, input)| Call3 { target: *target, allowFailure: true, callData: input.clone().into() })
            .collect();
        for input in [getBlockNumberCall {}.abi_encode(), getCurrentBlockTimestampCall {}.abi_encode()] {
            call3.push(Call3 { target: multicall, allowFailure: false, callData: input.into() });
        }
        let request =
            TransactionRequest::default().to(multicall).input(aggregate3Call { calls: call3 }.abi_encode().into());
        let answer = self.bounded("eth_call aggregate3", self.provider.call(request).block(at)).await?;
        let mut results = aggregate3Call::abi_decode_returns(&answer)
            .map_err(|e| ChainError::Rpc(format!("{}: Multicall3 answered {e}", self.shown)))?;
        let number_of = |r: Option<Call3Result>| -> Result<u64, ChainError> {
            let r = r
                .filter(|r| r.success)
                .ok_or_else(|| ChainError::Rpc(format!("{}: Multicall3 did not say its block", self.shown)))?;
            let n = alloy_primitives::U256::from_be_slice(&r.returnData[..r.returnData.len().min(32)]);
            u64::try_from(n).map_err(|_| ChainError::Rpc(format!("{}: Multicall3 answered {n}", self.shown)))
        };
        let timestamp = number_of(results.pop())?;
        let number = number_of(results.pop())?;
        if results.len() != calls.len() {
            return Err(ChainError::Rpc(format!(
                "{}: Multicall3 answered {} calls of {}",
                self.shown,
                results.len(),
                calls.len()
            )));
        }
        let answers = results.into_iter().map(|r| r.success.then_some(r.returnData)).collect();
        Ok((Block { number, timestamp }, answers))
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

    #[test]
    fn confirmations_are_per_network_bounded_and_only_where_there_is_an_endpoint() {
        let chains = Chains::parse("eip155:84532=http://127.0.0.1:8545, eip155:8453=https://rpc.example").unwrap();
        let chains = chains.with_confirmations("eip155:8453=3").unwrap();
        assert_eq!(chains.get("eip155:8453").unwrap().confirmations(), 3);
        assert_eq!(chains.get("eip155:84532").unwrap().confirmations(), 0, "0 unless set");
        let chains = Chains::parse("eip155:8453=https://rpc.example").unwrap();
        let problems = chains.with_confirmations("eip155:8453=65, eip155:1=2, eip155:8453").unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().all(|p| p.starts_with(CHAIN_CONFIRMATIONS)), "{problems:?}");
        assert!(problems[1].contains("eip155:1") && problems[1].contains(CHAIN_RPC_URLS), "{problems:?}");
    }

    #[test]
    fn every_network_priced_without_an_endpoint_is_named_with_its_prices() {
        let catalog = crate::domain::catalog::Catalog::parse(
            r#"
            [payments]
            pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
            facilitator_url = "https://x402.org/facilitator"
            [assets.base]
            network = "eip155:8453"
            contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
            decimals = 6
            name = "USD Coin"
            version = "2"
            [assets.sepolia]
            network = "eip155:84532"
            contract = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
            decimals = 6
            name = "USDC"
            version = "2"
            [assets.unused]
            network = "eip155:1"
            contract = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
            decimals = 6
            name = "USD Coin"
            version = "2"
            [tasks.digest]
            title = "Digest"
            description = "d"
            executor = "digest"
            timeout_seconds = 60
            [tasks.digest.input_schema]
            type = "object"
            [[tasks.digest.accepts]]
            asset = "base"
            amount = "10000"
            [[tasks.digest.accepts]]
            asset = "sepolia"
            amount = "10000"
            "#,
        )
        .expect("a valid catalog");
        let problems = Chains::none().unproven_prices(&catalog);
        assert_eq!(problems.len(), 2, "one per priced network, none for an asset nothing prices: {problems:?}");
        assert!(problems[0].starts_with(CHAIN_RPC_URLS) && problems[0].contains("eip155:8453"), "{problems:?}");
        assert!(problems[0].contains("tasks.digest.accepts[0]"), "{problems:?}");
        assert!(problems[1].contains("eip155:84532") && problems[1].contains("tasks.digest.accepts[1]"));
        let local = Chains::parse("eip155:84532=http://127.0.0.1:8545").unwrap();
        assert_eq!(local.unproven_prices(&catalog).len(), 1);
        let both = Chains::parse("eip155:84532=http://127.0.0.1:8545,eip155:8453=https://rpc.example").unwrap();
        assert!(both.unproven_prices(&catalog).is_empty());
    }
}
