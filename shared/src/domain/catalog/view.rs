//! How a catalog is shown: to clients as JSON (`GET /v1/catalog`) and to
//! operators as one line at start-up.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{Catalog, Price};

// Doc comments on these types are their OpenAPI schema descriptions
// (`GET /v1/openapi.json`): they are written for clients.

/// What Reeve sells: tasks with their input schemas and prices, the assets
/// prices are paid in, and the upload policy.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Catalog)]
pub struct PublicCatalog {
    pub assets: Vec<PublicAsset>,
    pub tasks: Vec<PublicTask>,
    pub uploads: PublicUploads,
    /// Who signs this deployment's offers and receipts; absent when it
    /// signs none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipts: Option<PublicReceipts>,
}

/// How offers and receipts are signed (x402's `offer-receipt` extension):
/// a JWS (`ES256K`) whose `kid` is a secp256k1 `did:key`. A receipt is the
/// seller's when that key's Ethereum address is `signer`. `reeve receipt
/// verify FILE` checks one.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = ReceiptSigner)]
pub struct PublicReceipts {
    /// The signing key's address.
    pub signer: String,
    /// Always `jws`.
    pub format: String,
    /// Always `ES256K`.
    pub alg: String,
}

/// A token prices are paid in.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Asset)]
pub struct PublicAsset {
    /// The name prices refer to it by.
    pub id: String,
    /// CAIP-2, e.g. `eip155:8453`.
    pub network: String,
    /// The token contract.
    pub contract: String,
    /// Atomic units per whole token, as a power of ten.
    pub decimals: u8,
    /// Whether one token is worth one US dollar.
    pub usd_peg: bool,
    /// Whether the token has EIP-2612 `permit` (a metered price in it
    /// offers `eip2612GasSponsoring`).
    pub eip2612: bool,
    /// The token's EIP-712 domain name.
    pub name: String,
    /// The token's EIP-712 domain version.
    pub version: String,
}

/// A kind of task on offer: `POST /v1/tasks/{kind}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = CatalogTask)]
pub struct PublicTask {
    pub kind: String,
    pub title: String,
    pub description: String,
    /// The JSON Schema the task's `input` must match.
    #[schema(value_type = Object)]
    pub input_schema: Value,
    pub timeout_seconds: u32,
    /// True when the task has no price: it is created without payment.
    pub free: bool,
    /// One entry per way to pay; empty when free.
    pub prices: Vec<PublicPrice>,
    /// For a free task, what one Space may do with it; absent when priced
    /// (payment is the limit). `GET /v1/space` shows how much is used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<PublicQuota>,
}

/// A free task's ceiling, per Space. Over it, `POST /v1/tasks/{kind}`
/// answers `429 quota_exceeded` with `Retry-After`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[schema(as = Quota)]
pub struct PublicQuota {
    /// Tasks of this kind a Space may create in any 60 minutes.
    pub per_hour: u32,
    /// Tasks of this kind a Space may have queued or running at once.
    pub at_once: u32,
}

/// One way to pay for a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Price)]
pub struct PublicPrice {
    /// The `id` of an asset in `assets`.
    pub asset: String,
    /// The asset's CAIP-2 network.
    pub network: Option<String>,
    /// `exact`: `amount` is paid before the task is queued. `upto`
    /// (metered): the payer authorizes up to `amount`, and is charged
    /// `rate` per `unit` the task used, capped at `amount`, when it ends;
    /// nothing if it fails or is canceled.
    pub scheme: String,
    /// Atomic units, as a decimal string: they may not fit a JSON number.
    /// The price of an `exact` price; the ceiling per task of a metered one.
    pub amount: String,
    /// The price (or ceiling) in US dollars as the operator wrote it, for a
    /// USD-pegged asset priced that way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount_usd: Option<String>,
    /// What a metered price counts: `byte`, `KiB`, `MiB`, `GiB` (bytes
    /// fetched or hashed) or `second` (an `http` call's time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// A metered price's atomic units per `unit`, as a decimal string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_usd: Option<String>,
    /// The price in words, e.g. `up to 0.10 USD (100000 atomic units),
    /// charged 0.001 USD per MiB`.
    pub summary: String,
}

/// What `POST /v1/uploads` accepts.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = UploadPolicy)]
pub struct PublicUploads {
    /// The largest file, in bytes.
    pub max_bytes: u64,
    /// The allowed `content_type` values.
    pub content_types: Vec<String>,
    /// How long an upload URL stays valid.
    pub url_expiry_seconds: u32,
}

impl Catalog {
    /// What `GET /v1/catalog` returns. Amounts are strings because atomic
    /// units overflow a JSON number's safe integer range. Http endpoints are
    /// left out: where a task runs is the operator's business.
    pub fn public(&self) -> PublicCatalog {
        let assets = self
            .assets
            .iter()
            .map(|(id, asset)| PublicAsset {
                id: id.clone(),
                network: asset.network.clone(),
                contract: asset.contract.clone(),
                decimals: asset.decimals,
                usd_peg: asset.usd_peg,
                eip2612: asset.eip2612,
                name: asset.name.clone(),
                version: asset.version.clone(),
            })
            .collect();
        let tasks = self
            .tasks
            .iter()
            .map(|(kind, task)| PublicTask {
                kind: kind.clone(),
                title: task.title.clone(),
                description: task.description.clone(),
                input_schema: task.input_schema.clone(),
                timeout_seconds: task.timeout_seconds,
                free: task.is_free(),
                prices: task.accepts.iter().map(|price| self.price_view(price)).collect(),
                quota: task.quota.map(|q| PublicQuota { per_hour: q.per_hour, at_once: q.at_once }),
            })
            .collect();
        PublicCatalog {
            assets,
            tasks,
            uploads: PublicUploads {
                max_bytes: self.uploads.max_bytes,
                content_types: self.uploads.content_types.clone(),
                url_expiry_seconds: self.uploads.url_expiry_seconds,
            },
            receipts: self.payments.as_ref().and_then(|p| p.receipt_signer.clone()).map(|signer| PublicReceipts {
                signer,
                format: "jws".to_owned(),
                alg: "ES256K".to_owned(),
            }),
        }
    }

    /// [`Catalog::public`] as a JSON value.
    pub fn public_view(&self) -> Value {
        serde_json::to_value(self.public()).expect("strings, numbers and JSON values serialise")
    }

    fn price_view(&self, price: &Price) -> PublicPrice {
        let meter = price.meter.as_ref();
        PublicPrice {
            asset: price.asset.clone(),
            network: self.assets.get(&price.asset).map(|asset| asset.network.clone()),
            scheme: price.scheme().to_owned(),
            amount: price.amount.to_string(),
            amount_usd: price.amount_usd.clone(),
            unit: meter.map(|m| m.unit.name().to_owned()),
            rate: meter.map(|m| m.rate.to_string()),
            rate_usd: meter.and_then(|m| m.rate_usd.clone()),
            summary: price_summary(price),
        }
    }

    /// One line for logs and `reeve config check`, e.g.
    /// `3 tasks (digest free, fetch 2 prices, http 1 price), 2 assets, uploads up to 100 MiB`.
    pub fn summary(&self) -> String {
        let tasks: Vec<String> = self
            .tasks
            .iter()
            .map(|(kind, task)| {
                let metered = if task.accepts.iter().any(|p| p.meter.is_some()) { "metered " } else { "" };
                match task.accepts.len() {
                    0 => format!("{kind} free"),
                    1 => format!("{kind} 1 {metered}price"),
                    n => format!("{kind} {n} {metered}prices"),
                }
            })
            .collect();
        let task_list = if tasks.is_empty() { String::new() } else { format!(" ({})", tasks.join(", ")) };
        format!(
            "{}{task_list}, {}, uploads up to {}",
            plural(self.tasks.len(), "task"),
            plural(self.assets.len(), "asset"),
            human_bytes(self.uploads.max_bytes),
        )
    }
}

/// A price in words, as the catalog view, the `402`'s resource description
/// and the MCP tool descriptions give it.
pub fn price_summary(price: &Price) -> String {
    let said = |atomic: u128, usd: &Option<String>| match usd {
        Some(usd) => format!("{usd} USD ({atomic} atomic units of {})", price.asset),
        None => format!("{atomic} atomic units of {}", price.asset),
    };
    match &price.meter {
        None => said(price.amount, &price.amount_usd),
        Some(meter) => format!(
            "up to {}, charged {} per {} used; nothing if the task fails",
            said(price.amount, &price.amount_usd),
            match &meter.rate_usd {
                Some(usd) => format!("{usd} USD"),
                None => format!("{} atomic units", meter.rate),
            },
            meter.unit.name()
        ),
    }
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 { format!("1 {noun}") } else { format!("{count} {noun}s") }
}

/// Exact binary units only, so a limit is never shown rounded.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| bytes.is_multiple_of(*size))
        .map_or_else(|| format!("{bytes} bytes"), |(size, unit)| format!("{} {unit}", bytes / size))
}
