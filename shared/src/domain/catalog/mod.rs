//! The catalog: what a deployment sells, read from `reeve.toml` (docs/architecture.md#configuration).
//!
//! The file is parsed into a plain `toml::Table` first and then walked field by
//! field, rather than deserialized with serde's derive: derive stops at the
//! first bad value, and an operator fixing a config wants every mistake at
//! once, each with its TOML path.
//!
//! Module map:
//! - [`read`]: walking a TOML table with paths, types and unknown-key checks.
//! - [`validate`]: the rules for each section, building a [`Catalog`].
//! - [`formats`]: ids, CAIP-2 networks, EVM addresses, URLs, media types.
//! - [`amount`]: atomic amounts and exact USD-to-atomic conversion.
//! - [`meter`]: the units a metered price counts, and its charge.
//! - [`uploads`]: the `[uploads]` section, alone (presign and the guard).
//! - [`networks`]: what a catalog is for (`network_kind`), and which
//!   networks are testnets.
//! - [`schema`]: task input schemas, from TOML to JSON, and compiled where
//!   inputs are validated (`input-schemas`).
//! - [`view`]: the public JSON view and the operator's one-line summary.
//! - [`error`]: [`CatalogError`] and [`Problem`].

#[cfg(feature = "catalog")]
mod amount;
mod error;
pub(crate) mod formats;
#[cfg(feature = "catalog")]
pub(crate) mod meter;
#[cfg(feature = "catalog")]
mod networks;
pub(crate) mod read;
#[cfg(feature = "catalog")]
mod schema;
pub(crate) mod uploads;
#[cfg(feature = "catalog")]
mod validate;
#[cfg(feature = "catalog")]
mod view;

use std::collections::BTreeMap;
use std::path::Path;
#[cfg(feature = "input-schemas")]
use std::sync::Arc;

#[cfg(feature = "input-schemas")]
use crate::infra::json_schema::JsonSchema;

/// Which executor runs a kind: declared by the executors, each in its own
/// file, and listed once in their registry.
#[cfg(feature = "catalog")]
pub use crate::domain::executors::registry::Executor;
pub use error::{CatalogError, Problem};
#[cfg(feature = "catalog")]
pub use meter::{Meter, Quantity, Unit};
#[cfg(feature = "catalog")]
pub use networks::{NetworkKind, testnet_name};
pub use uploads::{MAX_FILENAME_BYTES, Uploads};
#[cfg(feature = "catalog")]
pub use validate::{DELEGATED_CALL_SECONDS, MAX_DELEGATED_TIMEOUT_SECONDS, RUN_MARGIN_SECONDS};

/// The worker's time limit in seconds when none is given: the shipped
/// template's worker `Timeout`, so a catalog checked without one is checked
/// for what it will be deployed with.
#[cfg(feature = "catalog")]
pub const DEFAULT_WORKER_TIMEOUT_SECONDS: u32 = 360;
/// The longest a worker's time limit may be: Lambda's.
#[cfg(feature = "catalog")]
pub const MAX_WORKER_TIMEOUT_SECONDS: u32 = validate::MAX_TASK_TIMEOUT_SECONDS as u32;
/// The rule for a facilitator URL: https, or plain http on loopback only.
#[cfg(feature = "catalog")]
pub(crate) use validate::facilitator_url as check_facilitator_url;
#[cfg(feature = "catalog")]
pub use view::{PublicAsset, PublicCatalog, PublicPrice, PublicQuota, PublicTask, PublicUploads, price_summary};

#[cfg(feature = "catalog")]
/// The least queue time a metered payment's deadline must leave beyond the
/// task's timeout and the time to settle (and so the least
/// `metered_queue_seconds`): shorter, and the task would expire before any
/// worker could take it.
pub const METERED_MIN_QUEUE_SECONDS: u32 = 10;

#[cfg(feature = "catalog")]
/// The validated catalog. Every value in it has passed the checks in
/// [`validate`], so callers can rely on it without re-checking.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub assets: BTreeMap<String, Asset>,
    pub tasks: BTreeMap<String, TaskSpec>,
    /// Present whenever any task is priced.
    pub payments: Option<Payments>,
    pub uploads: Uploads,
    /// `[limits] running_per_space`: how many of one Space's tasks may run
    /// at once, over every kind without a limit of its own.
    pub running_per_space: u32,
}

#[cfg(feature = "catalog")]
/// `running_per_space` when `[limits]` leaves it out.
pub const DEFAULT_RUNNING_PER_SPACE: u32 = 10;

#[cfg(feature = "catalog")]
/// A token a task can be paid in (`[assets.<id>]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    /// CAIP-2, e.g. `eip155:8453`.
    pub network: String,
    /// The token contract; for `eip155` networks a `0x` address.
    pub contract: String,
    pub decimals: u8,
    /// Worth one US dollar per whole token, so `amount_usd` may price in it.
    pub usd_peg: bool,
    /// The token has EIP-2612 `permit`, so a metered price in it offers
    /// `eip2612GasSponsoring`: a payer without a Permit2 approval signs a
    /// permit instead of sending a transaction.
    pub eip2612: bool,
    /// The EIP-712 domain name x402 signs with, e.g. `USD Coin`.
    pub name: String,
    /// The EIP-712 domain version, e.g. `2`.
    pub version: String,
}

#[cfg(feature = "catalog")]
/// A kind of task clients can create (`[tasks.<kind>]`).
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub title: String,
    pub description: String,
    pub executor: Executor,
    pub timeout_seconds: u32,
    /// The schema as written, converted to JSON (what clients are shown).
    pub input_schema: serde_json::Value,
    /// The same schema, compiled once at load (with `format` checks on) by
    /// the loads that compile ([`Catalog::load_compiled_for`]), which the
    /// functions that validate inputs use; `None` from the others.
    #[cfg(feature = "input-schemas")]
    pub input_validator: Option<Arc<JsonSchema>>,
    /// Empty for a free task.
    pub accepts: Vec<Price>,
    /// What one space may do with a free task (`[tasks.<kind>.quota]`, or
    /// its defaults); `None` for a priced one, whose limit is its payment.
    pub quota: Option<Quota>,
    /// `tasks.<kind>.running_per_space`: the kind's own limit on a Space's
    /// tasks of it running at once, which then do not count against the
    /// catalog's; `None`, the kind shares the catalog's.
    pub running_per_space: Option<u32>,
}

#[cfg(feature = "catalog")]
impl TaskSpec {
    pub fn is_free(&self) -> bool {
        self.accepts.is_empty()
    }

    /// How long a worker waits for a run of this kind: its whole timeout,
    /// or for a kind whose service may answer `202` and report on its own,
    /// only as long as that answer may take ([`DELEGATED_CALL_SECONDS`]).
    pub fn waited_seconds(&self) -> u32 {
        if self.executor.delegates() { self.timeout_seconds.min(DELEGATED_CALL_SECONDS) } else { self.timeout_seconds }
    }
}

#[cfg(feature = "catalog")]
/// The ceiling on a free task, per space (`[tasks.<kind>.quota]`): the
/// operator pays for every run of it, and spaces cost nothing to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Tasks of the kind a space may create in any 60 minutes.
    pub per_hour: u32,
    /// Tasks of the kind a space may have queued or running at once.
    pub at_once: u32,
}

#[cfg(feature = "catalog")]
impl Default for Quota {
    fn default() -> Self {
        Quota { per_hour: 100, at_once: 10 }
    }
}

#[cfg(feature = "catalog")]
/// One way to pay for a task (`[[tasks.<kind>.accepts]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    /// An id from [`Catalog::assets`].
    pub asset: String,
    /// In atomic units of the asset, already converted from `amount_usd`:
    /// the price of an `exact` price, the ceiling per task of a metered one
    /// (what its `402` asks the payer to authorize).
    pub amount: u128,
    /// The USD price (or ceiling) as written, kept for display only.
    pub amount_usd: Option<String>,
    /// `Some` for a metered price (`scheme = "upto"`): charged per unit the
    /// task used, up to `amount`, when it ends.
    pub meter: Option<Meter>,
    /// `scheme = "batch"`: `amount` per task, paid with a voucher on the
    /// payer's x402 batch-settlement channel (money held in escrow before
    /// the task is created, claimed in batches later). Exact prices only.
    pub batch: bool,
}

#[cfg(feature = "catalog")]
impl Price {
    /// The x402 scheme this price is paid with.
    pub fn scheme(&self) -> &'static str {
        match (&self.meter, self.batch) {
            (Some(_), _) => "upto",
            (None, true) => "batch-settlement",
            (None, false) => "exact",
        }
    }
}

#[cfg(feature = "catalog")]
/// Where payments go (`[payments]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payments {
    pub pay_to: String,
    pub facilitator_url: String,
    /// How long a signed payment stays valid (x402 `maxTimeoutSeconds`).
    pub max_timeout_seconds: u32,
    /// How long a metered task may wait in the queue: its `upto`
    /// requirement's `maxTimeoutSeconds` is this, plus the kind's timeout,
    /// plus the time to settle.
    pub metered_queue_seconds: u32,
    /// What the catalog is for: mainnet (the default) or testnet.
    pub network_kind: NetworkKind,
    /// The address whose key signs offers and receipts (x402
    /// `offer-receipt`), published for buyers to check them against; the
    /// key itself is `REEVE_RECEIPT_KEY`, never here. `None`: nothing is
    /// signed.
    pub receipt_signer: Option<String>,
    /// The address that authorizes Reeve's claims and refunds on
    /// batch-settlement channels (their `receiverAuthorizer`, named in
    /// every channel a payer opens to Reeve). Required when a price is
    /// `scheme = "batch"`.
    pub batch_receiver_authorizer: Option<String>,
    /// How long a batch-settlement payer must wait between asking to
    /// withdraw and withdrawing (the channel's `withdrawDelay`): the time
    /// Reeve has to claim what its vouchers bought.
    pub batch_withdraw_delay_seconds: u64,
}

#[cfg(feature = "catalog")]
impl Catalog {
    /// Reads and validates the catalog at `path` for a worker of the
    /// default time limit ([`DEFAULT_WORKER_TIMEOUT_SECONDS`]), its input
    /// schemas compiled where this crate has the compiler: every check
    /// there is, for `reeve config check`'s kind of caller and the tests.
    /// Errors name the file as given.
    pub fn load(path: &Path) -> Result<Catalog, CatalogError> {
        #[cfg(feature = "input-schemas")]
        return Self::load_compiled_for(path, DEFAULT_WORKER_TIMEOUT_SECONDS);
        #[cfg(not(feature = "input-schemas"))]
        Self::load_for(path, DEFAULT_WORKER_TIMEOUT_SECONDS)
    }

    /// The catalog at `path` for a worker that may run a record for at
    /// most `worker_timeout` seconds (every task's `timeout_seconds` must
    /// fit), its input schemas read as JSON and not compiled: what a
    /// function that validates no input needs (task-status, the worker, the
    /// sweeper, the catalog).
    pub fn load_for(path: &Path, worker_timeout: u32) -> Result<Catalog, CatalogError> {
        Self::parse_named(&read_file(path)?, &path.display().to_string(), worker_timeout, &mut |_, _| Ok(()))
    }

    /// [`Catalog::load_for`], each kind's input schema compiled too (and so
    /// checked against its meta-schema, its problems listed with the
    /// others) and kept for validating inputs: task-create, MCP, `reeve
    /// serve`. The one caller of the compiler, so that a binary which never
    /// calls it links none.
    #[cfg(feature = "input-schemas")]
    pub fn load_compiled_for(path: &Path, worker_timeout: u32) -> Result<Catalog, CatalogError> {
        Self::parse_compiled(&read_file(path)?, &path.display().to_string(), worker_timeout)
    }

    /// Validates catalog text for a worker of the default time limit, as
    /// [`Catalog::load`] does; errors name it `reeve.toml`.
    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        #[cfg(feature = "input-schemas")]
        return Self::parse_compiled(text, "reeve.toml", DEFAULT_WORKER_TIMEOUT_SECONDS);
        #[cfg(not(feature = "input-schemas"))]
        Self::parse_named(text, "reeve.toml", DEFAULT_WORKER_TIMEOUT_SECONDS, &mut |_, _| Ok(()))
    }

    #[cfg(feature = "input-schemas")]
    fn parse_compiled(text: &str, name: &str, worker_timeout: u32) -> Result<Catalog, CatalogError> {
        let mut compiled = BTreeMap::new();
        let mut catalog = Self::parse_named(text, name, worker_timeout, &mut |kind, json| {
            compiled.insert(kind.to_owned(), Arc::new(JsonSchema::compile(json)?));
            Ok(())
        })?;
        for (kind, task) in &mut catalog.tasks {
            task.input_validator = compiled.remove(kind);
        }
        Ok(catalog)
    }

    fn parse_named(
        text: &str,
        name: &str,
        worker_timeout: u32,
        check: validate::SchemaCheck,
    ) -> Result<Catalog, CatalogError> {
        let table: toml::Table = text.parse().map_err(|error| CatalogError::syntax(name, text, &error))?;
        validate::catalog(&table, worker_timeout, check)
            .map_err(|problems| CatalogError::Invalid { path: name.to_owned(), problems })
    }

    pub fn task(&self, kind: &str) -> Option<&TaskSpec> {
        self.tasks.get(kind)
    }

    /// The running tasks a task of `kind` counts against in its Space, and
    /// how many may be: its kind's own limit and its tasks, or the
    /// catalog's and the tasks of every kind without one of its own. A kind
    /// no longer offered shares the catalog's.
    pub fn slots(&self, kind: &str) -> crate::domain::tasks::Slots {
        match self.task(kind).and_then(|spec| spec.running_per_space) {
            Some(limit) => crate::domain::tasks::Slots { limit, kind: Some(kind.to_owned()), others: Vec::new() },
            None => crate::domain::tasks::Slots {
                limit: self.running_per_space,
                kind: None,
                others: self
                    .tasks
                    .iter()
                    .filter(|(_, spec)| spec.running_per_space.is_some())
                    .map(|(kind, _)| kind.clone())
                    .collect(),
            },
        }
    }
}

#[cfg(feature = "catalog")]
fn read_file(path: &Path) -> Result<String, CatalogError> {
    std::fs::read_to_string(path).map_err(|source| CatalogError::Read { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployment_cap_only_lowers_the_limit() {
        let uploads = Uploads { max_bytes: 1000, ..Default::default() };
        assert_eq!(uploads.clone().capped(None).max_bytes, 1000);
        assert_eq!(uploads.clone().capped(Some(10)).max_bytes, 10);
        assert_eq!(uploads.capped(Some(5000)).max_bytes, 1000);
    }
}
