//! What a facilitator settles (its `GET /supported`), against what the
//! catalog prices. A price in a network the facilitator does not list can
//! never be settled: a client would sign it, and every `/settle` would fail.
//! So Reeve refuses to price in it, naming each such price by its TOML path.
//!
//! Where the question is asked:
//! - `reeve config check --facilitator` asks it and fails on any such price
//!   ([`unsupported_prices`]), before a deploy;
//! - `reeve serve` asks it at start-up and names each such price;
//! - a Lambda asks it on the first priced request of its instance, never at
//!   init: a cold start makes no network call for it, and free tasks never
//!   wait on the facilitator ([`Facilitator::known_kinds`](super::Facilitator)).
//!
//! Either way the answer is kept for the process, and a price it does not
//! list is left out of every `402` ([`settleable`]). A facilitator that does
//! not answer changes nothing: every price stays offered, and a payment
//! meets `/verify`'s own answer.

use serde::Deserialize;

use super::challenge::{EIP2612_GAS_SPONSORING, PaymentRequired, X402_VERSION};
use super::scheme::Scheme;
use crate::domain::catalog::{Catalog, Problem};

/// One `(x402Version, scheme, network)` a facilitator settles.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SupportedKind {
    #[serde(rename = "x402Version")]
    pub x402_version: u32,
    pub scheme: String,
    /// CAIP-2 for x402 v2 (`eip155:8453`); v1 used names (`base`). A
    /// reference of `*` stands for every network of its namespace.
    pub network: String,
    /// For `upto`, `{"facilitatorAddress"}`: who settles, which the payer
    /// names in what it signs.
    #[serde(default)]
    pub extra: Option<serde_json::Value>,
}

impl SupportedKind {
    fn lists(&self, scheme: &str, network: &str) -> bool {
        let network_listed = self.network == network
            || self.network.strip_suffix(":*").is_some_and(|namespace| network.split(':').next() == Some(namespace));
        self.x402_version == X402_VERSION && self.scheme == scheme && network_listed
    }

    /// The address an `upto` payer must name as its facilitator.
    fn facilitator_address(&self) -> Option<&str> {
        self.extra.as_ref()?.get("facilitatorAddress")?.as_str()
    }
}

/// `GET /supported`'s answer: what it settles, and the extensions it
/// honours (`eip2612GasSponsoring`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Supported {
    pub kinds: Vec<SupportedKind>,
    #[serde(default)]
    pub extensions: Vec<String>,
}

/// Does a facilitator listing `kinds` settle x402 v2 payments of `scheme`
/// on `network`?
pub fn settles(kinds: &[SupportedKind], scheme: &str, network: &str) -> bool {
    kinds.iter().any(|k| k.lists(scheme, network))
}

/// Every price of `catalog` in a network the facilitator at `url` (listing
/// `kinds`) does not settle, at its TOML path.
pub fn unsupported_prices(catalog: &Catalog, kinds: &[SupportedKind], url: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (kind, task) in &catalog.tasks {
        for (index, price) in task.accepts.iter().enumerate() {
            let Some(asset) = catalog.assets.get(&price.asset) else { continue };
            let scheme = price.scheme();
            let mut listed: Vec<&str> = kinds
                .iter()
                .filter(|k| k.x402_version == X402_VERSION && k.scheme == scheme)
                .map(|k| k.network.as_str())
                .collect();
            listed.dedup();
            let listed = if listed.is_empty() { "none".to_owned() } else { listed.join(", ") };
            if !settles(kinds, scheme, &asset.network) {
                problems.push(Problem {
                    // Kinds are ids (letters, digits, - and _): bare TOML keys.
                    path: format!("tasks.{kind}.accepts[{index}]"),
                    message: format!(
                        "asset {:?} is on {}, which the facilitator {url} does not settle (x402 v{X402_VERSION}, \
                         scheme {scheme}; it lists: {listed}): no payment in it could be settled",
                        price.asset, asset.network
                    ),
                });
            }
        }
    }
    problems
}

/// `challenge` with only the prices the facilitator settles: the others
/// are refused (logged with their TOML path, `tasks.<kind>`'s accepts in the
/// same order), and a payment in them finds no offer to match. An `upto`
/// offer gets the facilitator's address, without which no client can sign
/// it, and `eip2612GasSponsoring` stays offered only if the facilitator
/// lists it. `None` when no price of the kind is left: the task
/// cannot be paid for here, and must not look free either.
pub fn settleable(mut challenge: PaymentRequired, supported: &Supported, kind: &str) -> Option<PaymentRequired> {
    let kinds = &supported.kinds;
    // A permit the facilitator would not apply would be signed for nothing.
    if !supported.extensions.iter().any(|e| e == EIP2612_GAS_SPONSORING) {
        challenge.extensions.remove(EIP2612_GAS_SPONSORING);
    }
    let mut index = 0;
    challenge.accepts.retain_mut(|offer| {
        let listed = kinds.iter().find(|k| k.lists(&offer.scheme, &offer.network));
        let names_facilitator = Scheme::named(&offer.scheme).is_some_and(Scheme::names_facilitator);
        if names_facilitator {
            offer.extra.facilitator_address = listed.and_then(|k| k.facilitator_address()).map(str::to_owned);
        }
        let settled = listed.is_some() && (!names_facilitator || offer.extra.facilitator_address.is_some());
        if !settled {
            tracing::error!(
                price = %format!("tasks.{kind}.accepts[{index}]"),
                network = %offer.network,
                "not offered: the facilitator does not settle this scheme on this network"
            );
        }
        index += 1;
        settled
    });
    (!challenge.accepts.is_empty()).then_some(challenge)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(version: u32, scheme: &str, network: &str) -> SupportedKind {
        SupportedKind { x402_version: version, scheme: scheme.into(), network: network.into(), extra: None }
    }

    #[test]
    fn a_network_is_settled_in_v2_with_the_scheme_asked_for() {
        let local = [kind(2, "exact", "eip155:84532"), kind(1, "exact", "base")];
        assert!(settles(&local, "exact", "eip155:84532"));
        assert!(!settles(&local, "upto", "eip155:84532"), "another scheme");
        assert!(!settles(&local, "exact", "eip155:8453"), "v1's `base` is not v2's eip155:8453");
        assert!(!settles(&[kind(1, "exact", "eip155:8453")], "exact", "eip155:8453"), "v1 only");
        let every_evm = [kind(2, "exact", "eip155:*")];
        assert!(settles(&every_evm, "exact", "eip155:8453"));
        assert!(!settles(&every_evm, "exact", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"));
    }

    /// The permit a payer would sign for a facilitator that does not apply
    /// it is not offered; the price stays payable with an approval.
    #[test]
    fn gas_sponsoring_stays_offered_only_if_the_facilitator_lists_it() {
        let catalog = crate::domain::catalog::Catalog::parse(
            r#"
            [payments]
            pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
            facilitator_url = "https://x402.org/facilitator"
            [assets.usdc]
            network = "eip155:8453"
            contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
            decimals = 6
            name = "USD Coin"
            version = "2"
            [tasks.metered]
            title = "Metered"
            description = "d"
            executor = "fetch"
            input_schema = { type = "object" }
            [[tasks.metered.accepts]]
            asset = "usdc"
            scheme = "upto"
            unit = "MiB"
            rate = "10"
            amount = "1000"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let challenge = || {
            super::super::payment_required(&catalog, catalog.task("metered").unwrap(), "/v1/tasks/metered", "x")
                .unwrap()
        };
        assert!(challenge().extensions.contains_key(EIP2612_GAS_SPONSORING), "the token has a permit");
        let supported = |extensions: &[&str]| Supported {
            kinds: vec![SupportedKind {
                extra: Some(serde_json::json!({"facilitatorAddress": "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f"})),
                ..kind(2, "upto", "eip155:8453")
            }],
            extensions: extensions.iter().map(|e| e.to_string()).collect(),
        };
        let kept = settleable(challenge(), &supported(&[EIP2612_GAS_SPONSORING]), "metered").unwrap();
        assert!(kept.extensions.contains_key(EIP2612_GAS_SPONSORING));
        let dropped = settleable(challenge(), &supported(&[]), "metered").unwrap();
        assert!(!dropped.extensions.contains_key(EIP2612_GAS_SPONSORING), "a permit nobody would apply");
        assert!(dropped.accepts[0].extra.facilitator_address.is_some(), "still payable, with an approval");
    }

    #[test]
    fn the_local_facilitator_s_answer_parses() {
        // As @x402/core's facilitator (scripts/payments/facilitator.mjs) answers.
        let body = r#"{"kinds":[{"x402Version":2,"scheme":"exact","network":"eip155:84532"},
            {"x402Version":1,"scheme":"exact","network":"base-sepolia"}],"extensions":[],
            "signers":{"eip155:*":["0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"]}}"#;
        let supported: Supported = serde_json::from_str(body).unwrap();
        assert_eq!(supported.kinds[0], kind(2, "exact", "eip155:84532"));
    }
}
