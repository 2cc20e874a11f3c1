//! A `402` from task create: the task is priced and no payment was sent.
//! This is the one place the client handles it: it shows the x402
//! requirements (one row per way to pay) and the command exits 3; paying
//! (`--pay`, in `pay.rs`) starts from the same challenge. A metered
//! (`upto`) requirement's amount is a ceiling, and says so.

use reeve_shared::payments::PaymentRequired;
use serde_json::Value;

use super::output;

/// One way to pay, from the challenge's `accepts`, with the asset's decimals
/// looked up in the catalog (the challenge carries only its contract).
pub struct Requirement {
    pub network: String,
    pub asset: String,
    pub amount_atomic: String,
    /// The amount in the asset's units; for `upto`, "up to" the ceiling
    /// and how it is charged.
    pub amount_human: String,
    pub pay_to: String,
}

/// The requirements of `challenge`; `catalog` is `GET /v1/catalog`'s answer,
/// for the asset names and decimals (`Value::Null` if it could not be read).
pub fn requirements(challenge: &PaymentRequired, catalog: &Value) -> Vec<Requirement> {
    let assets = catalog["assets"].as_array().cloned().unwrap_or_default();
    challenge
        .accepts
        .iter()
        .map(|accept| {
            let network = accept.network.clone();
            let contract = accept.asset.clone();
            let amount_atomic = accept.amount.clone();
            let known = assets.iter().find(|a| {
                a["network"].as_str() == Some(network.as_str())
                    && a["contract"].as_str().is_some_and(|c| c.eq_ignore_ascii_case(&contract))
            });
            let (asset, amount_human) = match known {
                Some(a) => {
                    let decimals = a["decimals"].as_u64().unwrap_or(0) as u32;
                    let name = a["id"].as_str().unwrap_or(&contract).to_owned();
                    (name, output::human_amount(&amount_atomic, decimals))
                }
                None => (contract.clone(), "?".to_owned()),
            };
            let amount_human = if accept.scheme == "upto" {
                format!("up to {amount_human} (charged for what the task uses; nothing if it fails)")
            } else {
                amount_human
            };
            Requirement { network, asset, amount_atomic, amount_human, pay_to: accept.pay_to.clone() }
        })
        .collect()
}

/// What a person sees: why, then the table (a `402` body that is not a
/// challenge shows as it came).
pub fn describe(challenge: &Value, catalog: &Value) -> String {
    let Ok(challenge) = serde_json::from_value::<PaymentRequired>(challenge.clone()) else {
        return format!("error: this task is priced (payment_required): {challenge}");
    };
    let rows: Vec<Vec<String>> = requirements(&challenge, catalog)
        .into_iter()
        .map(|r| vec![r.network, r.asset, r.amount_human, r.amount_atomic, r.pay_to])
        .collect();
    let why = challenge.error.as_str();
    format!(
        "error: this task is priced: {why} (payment_required); pay with one of:\n{}",
        output::table(&["NETWORK", "ASSET", "AMOUNT", "ATOMIC", "PAY TO"], &rows)
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_upto_requirement_shows_its_amount_as_a_ceiling() {
        let challenge = json!({
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {"url": "http://127.0.0.1:8080/v1/tasks/transcode", "description": "Transcode",
                         "mimeType": "application/json"},
            "accepts": [
                {"scheme": "upto", "network": "eip155:84532", "amount": "1500000",
                 "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 930,
                 "extra": {"name": "USDC", "version": "2",
                           "facilitatorAddress": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"}},
                {"scheme": "exact", "network": "eip155:84532", "amount": "10000",
                 "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                 "extra": {"name": "USDC", "version": "2"}}
            ]
        });
        let catalog = json!({"assets": [{"id": "usdc-local", "network": "eip155:84532",
                                         "contract": "0x036cbd53842c5426634e7929541ec2318f3dcf7e", "decimals": 6}]});
        let shown = describe(&challenge, &catalog);
        assert!(
            shown.contains("up to 1.5 (charged for what the task uses; nothing if it fails)"),
            "the ceiling, and how it is charged: {shown}"
        );
        assert!(shown.contains("1500000") && shown.contains("usdc-local"), "{shown}");
        let exact = shown.lines().find(|l| l.contains("10000")).unwrap();
        assert!(exact.contains("0.01") && !exact.contains("up to"), "an exact price is the price: {exact}");
    }
}
