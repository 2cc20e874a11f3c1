//! What a catalog is for, and whether a network is a test network.
//!
//! A catalog says `[payments] network_kind = "mainnet"` (the default) or
//! `"testnet"`. A mainnet catalog that prices a task in a testnet asset
//! would sell work for tokens with no value, so `reeve config check` warns
//! about each such price ([`super::Catalog::warnings`]).

use super::read::KeyPath;
use super::{Catalog, Problem};

/// What a catalog's prices are for (`[payments] network_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkKind {
    /// Real money: a deployment's catalog.
    #[default]
    Mainnet,
    /// Test tokens: development, tests and staging.
    Testnet,
}

impl NetworkKind {
    pub const NAMES: [&str; 2] = ["mainnet", "testnet"];

    pub fn parse(name: &str) -> Result<NetworkKind, String> {
        match name {
            "mainnet" => Ok(NetworkKind::Mainnet),
            "testnet" => Ok(NetworkKind::Testnet),
            other => Err(format!("{other:?} is neither \"mainnet\" nor \"testnet\"")),
        }
    }
}

/// Solana's test clusters, by their CAIP-2 ids (the genesis hash prefix).
const SOLANA_TESTNETS: [(&str, &str); 2] = [
    ("solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "Solana devnet"),
    ("solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z", "Solana testnet"),
];

/// The test network a CAIP-2 id names, if it is one Reeve knows: EVM chains
/// by alloy's chain registry (every public testnet and the local dev
/// chains), Solana's test clusters by name. An unknown network is not
/// called a testnet.
pub fn testnet_name(network: &str) -> Option<String> {
    if let Some(id) = network.strip_prefix("eip155:") {
        let chain = alloy_chains::NamedChain::try_from(id.parse::<u64>().ok()?).ok()?;
        return chain.is_testnet().then(|| chain.to_string());
    }
    SOLANA_TESTNETS.iter().find(|(id, _)| *id == network).map(|(_, name)| (*name).to_owned())
}

impl Catalog {
    /// What is legal but probably a mistake, each at its TOML path: a
    /// testnet asset priced in a mainnet catalog. Empty for a catalog marked
    /// `network_kind = "testnet"`, or one that prices nothing.
    pub fn warnings(&self) -> Vec<Problem> {
        let mut warnings = Vec::new();
        let Some(payments) = &self.payments else { return warnings };
        if payments.network_kind != NetworkKind::Mainnet {
            return warnings;
        }
        for (kind, task) in &self.tasks {
            for (index, price) in task.accepts.iter().enumerate() {
                let Some(asset) = self.assets.get(&price.asset) else { continue };
                let Some(name) = testnet_name(&asset.network) else { continue };
                let path = KeyPath::default().key("tasks").key(kind).key("accepts").index(index).key("asset");
                path.report(
                    &mut warnings,
                    format!(
                        "{:?} is on {} ({}), a testnet, in a catalog for mainnet ([payments] network_kind): \
                         its tokens have no value; price in a mainnet asset, or mark the catalog \
                         network_kind = \"testnet\"",
                        price.asset, asset.network, name
                    ),
                );
            }
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testnets_are_told_from_mainnets() {
        for testnet in ["eip155:84532", "eip155:11155111", "eip155:31337", "eip155:80002", "eip155:43113"] {
            assert!(testnet_name(testnet).is_some(), "{testnet}");
        }
        for mainnet in
            ["eip155:8453", "eip155:1", "eip155:137", "eip155:43114", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"]
        {
            assert_eq!(testnet_name(mainnet), None, "{mainnet}");
        }
        assert_eq!(testnet_name("solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1").as_deref(), Some("Solana devnet"));
        assert_eq!(testnet_name("eip155:4242424242"), None, "an unknown chain is not called a testnet");
    }
}
