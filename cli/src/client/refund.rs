//! `reeve payments refund KIND`: the payer takes back what its
//! batch-settlement channel to the deployment holds beyond what was
//! charged, at once, by a cooperative refund (`GET /v1/refund/{kind}`, as
//! `@x402/evm`'s `refundChannel` asks it), instead of announcing a
//! withdrawal and waiting the channel's withdraw delay. The channel is the
//! one `reeve task create --pay --channel` pays on, its record under the
//! credentials directory kept up to date.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use reeve_shared::payments::{PAYMENT_REQUIRED_HEADER, PAYMENT_RESPONSE_HEADER, PaymentRequired, PaymentResponse};
use serde_json::{Value, json};

use super::{Client, ClientError, ClientOpts, output};
use crate::pay::channel;

#[derive(Args, Debug, Clone)]
pub struct RefundArgs {
    /// A kind priced by batch settlement: the channel is the one its offer
    /// names (every such kind of a deployment shares it).
    pub kind: String,
    /// Take back only this much (the token's smallest units), not all that
    /// was not charged.
    #[arg(long, value_name = "AMOUNT")]
    pub amount: Option<u128>,
    /// A file holding the paying wallet's private key (hex).
    #[arg(long, value_name = "PATH")]
    pub wallet_key_file: Option<PathBuf>,
    /// The paying wallet's private key, from REEVE_WALLET_KEY only.
    #[arg(long, env = reeve_shared::settings::WALLET_KEY, hide = true, hide_env_values = true, value_parser = crate::pay::WalletKeyParser)]
    pub wallet_key: Option<crate::pay::WalletKey>,
    #[command(flatten)]
    pub client: ClientOpts,
}

/// One ask of the refund route, and what it answered.
struct Answer {
    status: reqwest::StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn ask(client: &Client, url: &str, payment: Option<&str>) -> Result<Answer, ClientError> {
    let mut request = client.http.get(url);
    if let Some(payment) = payment {
        request = request.header("payment-signature", payment);
    }
    let unreachable =
        |e: reqwest::Error| ClientError::Unreachable { endpoint: client.endpoint.clone(), cause: e.to_string() };
    let response = request.send().await.map_err(unreachable)?;
    let (status, headers) = (response.status(), response.headers().clone());
    let body = response.json().await.unwrap_or(Value::Null);
    Ok(Answer { status, headers, body })
}

impl Answer {
    /// The challenge of a `402` (in `PAYMENT-REQUIRED`, or its body).
    fn challenge(&self) -> Option<PaymentRequired> {
        (self.status == reqwest::StatusCode::PAYMENT_REQUIRED).then_some(())?;
        self.headers
            .get(PAYMENT_REQUIRED_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(PaymentRequired::from_header_value)
            .or_else(|| serde_json::from_value(self.body.clone()).ok())
    }

    /// The server's refusal, as every client command reports one.
    fn refused(&self) -> ClientError {
        let code =
            self.body["error"]["code"].as_str().map_or_else(|| format!("http_{}", self.status.as_u16()), str::to_owned);
        let message = self.body["error"]["message"].as_str().unwrap_or("the refund was refused").to_owned();
        ClientError::Refused { status: self.status.as_u16(), code, message }
    }
}

pub async fn refund(client: &mut Client, opts: &ClientOpts, args: RefundArgs) -> Result<ExitCode, ClientError> {
    let pay_error = |e: crate::pay::PayError| ClientError::Usage(format!("refund: {e}"));
    let key = crate::pay::wallet_key(args.wallet_key_file.as_deref(), args.wallet_key.as_ref()).map_err(pay_error)?;
    let signer: alloy_signer_local::PrivateKeySigner =
        key.parse().map_err(|_| pay_error(crate::pay::PayError::BadKey))?;
    let url = format!("{}/v1/refund/{}", client.endpoint.trim_end_matches('/'), super::task::urlencode(&args.kind));
    // Asked with nothing, the route answers the kind's offer: the terms the
    // channel was opened on.
    let probe = ask(client, &url, None).await?;
    let challenge = probe.challenge().ok_or_else(|| probe.refused())?;
    let offer = channel::offer(&challenge).ok_or_else(|| {
        ClientError::Usage(format!("refund: {} is not priced by batch settlement: there is no channel", args.kind))
    })?;
    let mut channel = super::open_channel(opts, offer, &signer)?;
    // Unknown or out of date, the first ask is answered with the channel as
    // the server keeps it, and the second is signed from there.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let asked = channel.refund(&challenge, offer, &signer, args.amount).map_err(pay_error)?;
        let answer = ask(client, &url, Some(&asked)).await?;
        if answer.status.is_success() {
            let response = answer
                .headers
                .get(PAYMENT_RESPONSE_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(PaymentResponse::from_header)
                .ok_or_else(|| ClientError::Usage("refund: the answer had no PAYMENT-RESPONSE".into()))?;
            let refunded = channel.refunded(&response).map_err(pay_error)?;
            if opts.json {
                let mut shown = serde_json::to_value(&response).unwrap_or_default();
                shown["channel"] = json!(channel.id());
                shown["refundedAmount"] = json!(refunded.to_string());
                output::json(&shown);
            } else {
                println!("refunded {refunded} from channel {} (transaction {})", channel.id(), response.transaction);
                let (balance, charged) = channel.known().unwrap_or_default();
                eprintln!("the channel now holds {balance}, of which {charged} was charged");
            }
            return Ok(ExitCode::SUCCESS);
        }
        let Some(refusal) = answer.challenge() else { return Err(answer.refused()) };
        if attempts == 3 || !channel.resynchronise(&refusal).map_err(pay_error)? {
            return Err(answer.refused());
        }
    }
}
