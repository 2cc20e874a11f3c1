//! Does the facilitator settle what the catalog prices? Asked by `reeve
//! serve` at start-up and by `reeve config check --facilitator`; a Lambda
//! asks on its first priced request instead (see `payments::supported`).

use super::Config;
use crate::domain::catalog::{Catalog, Problem};
use crate::domain::payments::{self, Facilitator, FacilitatorError, facilitator};

/// What the facilitator's `GET /supported` says about the catalog's prices.
#[derive(Debug)]
pub enum FacilitatorCheck {
    /// The catalog prices nothing: no facilitator to ask.
    Unpriced,
    /// Every price is in a network it settles (these networks).
    Settles { url: String, networks: Vec<String> },
    /// These prices are in networks it does not settle.
    Refuses(Vec<Problem>),
    /// It could not be asked (down, slow, or an unreadable answer).
    Unknown { url: String, error: FacilitatorError },
}

/// Asks the catalog's facilitator (its `facilitator_url`, after
/// `REEVE_FACILITATOR_URL`) and remembers the answer in `facilitator`, so
/// the first priced request does not ask again.
pub async fn check_facilitator(catalog: &Catalog, facilitator: Option<&Facilitator>) -> FacilitatorCheck {
    let (Some(_), Some(facilitator)) = (&catalog.payments, facilitator) else {
        return FacilitatorCheck::Unpriced;
    };
    let url = facilitator.url().to_owned();
    match facilitator.supported().await {
        Err(error) => FacilitatorCheck::Unknown { url, error },
        Ok(supported) => {
            let refused = payments::unsupported_prices(catalog, &supported.kinds, &url);
            let mut networks: Vec<String> = catalog
                .tasks
                .values()
                .flat_map(|t| &t.accepts)
                .filter_map(|p| catalog.assets.get(&p.asset).map(|a| a.network.clone()))
                .collect();
            networks.sort();
            networks.dedup();
            facilitator.remember(supported);
            if refused.is_empty() {
                FacilitatorCheck::Settles { url, networks }
            } else {
                FacilitatorCheck::Refuses(refused)
            }
        }
    }
}

/// The facilitator client for `catalog` as this deployment configures it
/// (`REEVE_FACILITATOR_URL` replaces the catalog's URL): `None` when the
/// catalog prices nothing.
pub fn facilitator_for(config: &Config, catalog: &Catalog) -> Result<Option<Facilitator>, String> {
    let Some(payments) = &catalog.payments else { return Ok(None) };
    let url = facilitator::effective_url(&payments.facilitator_url, |k| config.get(k))?;
    Facilitator::new(&url).map(Some)
}

/// `reeve serve`'s start-up: each price in a network its facilitator does
/// not settle is named (an error, with its TOML path) and will not be
/// offered; the process still starts, since free tasks and the other prices
/// do not depend on it. A facilitator that cannot be asked is a warning:
/// the first priced request asks again.
pub(super) async fn announce_unsettled_prices(catalog: &Catalog, facilitator: Option<&Facilitator>, source: &str) {
    match check_facilitator(catalog, facilitator).await {
        FacilitatorCheck::Refuses(problems) => {
            for problem in problems {
                tracing::error!("{source}: {problem}; it is not offered");
            }
        }
        FacilitatorCheck::Unknown { url, error } => {
            tracing::warn!(facilitator = %url, error = %error, "cannot ask the facilitator what it settles yet");
        }
        FacilitatorCheck::Unpriced | FacilitatorCheck::Settles { .. } => {}
    }
}
