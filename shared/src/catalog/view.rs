//! How a catalog is shown: to clients as JSON (`GET /v1/catalog`) and to
//! operators as one line at start-up.

use serde_json::{Value, json};

use super::{Catalog, Price};

impl Catalog {
    /// What `GET /v1/catalog` returns. Amounts are strings because atomic
    /// units overflow a JSON number's safe integer range. Http endpoints are
    /// left out: where a task runs is the operator's business.
    pub fn public_view(&self) -> Value {
        let assets: Vec<Value> = self
            .assets
            .iter()
            .map(|(id, asset)| {
                json!({
                    "id": id,
                    "network": asset.network,
                    "contract": asset.contract,
                    "decimals": asset.decimals,
                    "usd_peg": asset.usd_peg,
                    "name": asset.name,
                    "version": asset.version,
                })
            })
            .collect();
        let tasks: Vec<Value> = self
            .tasks
            .iter()
            .map(|(kind, task)| {
                json!({
                    "kind": kind,
                    "title": task.title,
                    "description": task.description,
                    "input_schema": task.input_schema,
                    "timeout_seconds": task.timeout_seconds,
                    "free": task.is_free(),
                    "prices": task.accepts.iter().map(|price| self.price_view(price)).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "assets": assets,
            "tasks": tasks,
            "uploads": {
                "max_bytes": self.uploads.max_bytes,
                "content_types": self.uploads.content_types,
                "url_expiry_seconds": self.uploads.url_expiry_seconds,
            },
        })
    }

    fn price_view(&self, price: &Price) -> Value {
        let mut view = json!({
            "asset": price.asset,
            "network": self.assets.get(&price.asset).map(|asset| &asset.network),
            "amount": price.amount.to_string(),
        });
        if let Some(usd) = &price.amount_usd {
            view["amount_usd"] = json!(usd);
        }
        view
    }

    /// One line for logs and `reeve config check`, e.g.
    /// `3 tasks (digest free, fetch 2 prices, http 1 price), 2 assets, uploads up to 100 MiB`.
    pub fn summary(&self) -> String {
        let tasks: Vec<String> = self
            .tasks
            .iter()
            .map(|(kind, task)| match task.accepts.len() {
                0 => format!("{kind} free"),
                1 => format!("{kind} 1 price"),
                n => format!("{kind} {n} prices"),
            })
            .collect();
        let task_list = if tasks.is_empty() {
            String::new()
        } else {
            format!(" ({})", tasks.join(", "))
        };
        format!(
            "{}{task_list}, {}, uploads up to {}",
            plural(self.tasks.len(), "task"),
            plural(self.assets.len(), "asset"),
            human_bytes(self.uploads.max_bytes),
        )
    }
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Exact binary units only, so a limit is never shown rounded.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| bytes.is_multiple_of(*size))
        .map_or_else(
            || format!("{bytes} bytes"),
            |(size, unit)| format!("{} {unit}", bytes / size),
        )
}
