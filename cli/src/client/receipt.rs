//! `reeve receipt get ID` and `reeve receipt verify FILE`: a paid task's
//! signed receipt (x402 `offer-receipt`), fetched, and checked offline
//! against the seller's published address and the files it delivered.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use reeve_shared::payments::offer_receipt::{self, Signed, VerifyError};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Digest;

use super::{Client, ClientError, ClientOpts, output};

#[derive(Subcommand)]
pub enum ReceiptCommand {
    /// Fetch a paid task's signed receipt: its JSON on stdout, or into `--out`.
    Get {
        /// The task id.
        id: String,
        /// Write the receipt to this file instead.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Check a receipt offline: its signature, that the seller's published
    /// key made it, and the files you downloaded against what it says was
    /// delivered. Exits 0 when every check holds, 3 when one does not.
    Verify {
        /// The receipt: `reeve receipt get`'s JSON, or a settlement response
        /// (`PAYMENT-RESPONSE` decoded, MCP's `x402/payment-response`).
        file: PathBuf,
        /// The seller's address (the catalog's `receipts.signer`); without
        /// it, it is read from `GET /v1/catalog` of `--endpoint`.
        #[arg(long, value_name = "ADDRESS")]
        signer: Option<String>,
        /// A downloaded output file: its SHA-256 must be one the receipt
        /// lists. Repeat for each file.
        #[arg(long = "output", value_name = "FILE")]
        outputs: Vec<PathBuf>,
        /// The task's result (or the task as `reeve task get --json` shows
        /// it): it must hash to the receipt's `resultSha256`.
        #[arg(long, value_name = "FILE")]
        result: Option<PathBuf>,
        /// The input you sent (JSON): it must hash to `inputSha256`.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
}

pub async fn receipt(client: &mut Client, opts: &ClientOpts, command: ReceiptCommand) -> Result<ExitCode, ClientError> {
    match command {
        ReceiptCommand::Get { id, out } => {
            let answer = client.authed(Method::GET, &format!("/v1/tasks/{id}/receipt"), None, &[]).await?;
            match out {
                Some(path) => {
                    let text = serde_json::to_string_pretty(&answer.body).expect("JSON values serialise");
                    std::fs::write(&path, format!("{text}\n"))
                        .map_err(|e| ClientError::Usage(format!("cannot write {}: {e}", path.display())))?;
                    if !opts.json {
                        println!("receipt written to {}", path.display());
                    }
                }
                None => output::json(&answer.body),
            }
            Ok(ExitCode::SUCCESS)
        }
        ReceiptCommand::Verify { file, signer, outputs, result, input } => {
            let signed = read_receipt(&file)?;
            let expected = match signer {
                Some(text) => address(&text)?,
                None => published_signer(client).await?,
            };
            let verified = offer_receipt::verify(&signed, Some(expected)).map_err(refused)?;
            let payload = verified.payload;
            let mut matched = Vec::new();
            let delivered = payload.pointer("/delivery/outputs").and_then(Value::as_array);
            for path in &outputs {
                let Some(delivered) = delivered else {
                    return Err(mismatch(
                        "the receipt was signed before the task ended and proves no delivery; fetch it again",
                    ));
                };
                let bytes = std::fs::read(path)
                    .map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", path.display())))?;
                let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
                let Some(name) = delivered
                    .iter()
                    .find(|f| f["sha256"].as_str() == Some(sha256.as_str()))
                    .and_then(|f| f["name"].as_str())
                else {
                    return Err(mismatch(&format!(
                        "{} (SHA-256 {sha256}) is not a file the receipt says was delivered",
                        path.display()
                    )));
                };
                matched.push(json!({ "file": path.display().to_string(), "name": name, "sha256": sha256 }));
            }
            if let Some(path) = &result {
                let mut value = read_json(path)?;
                // A task as `reeve task get --json` prints it: its result.
                if value.get("id").is_some() && value.get("result").is_some() {
                    value = value["result"].take();
                }
                let sha256 = offer_receipt::result_sha256(&value);
                if payload.pointer("/delivery/resultSha256").and_then(Value::as_str) != Some(sha256.as_str()) {
                    return Err(mismatch(&format!("{}: the result is not the one the receipt signs", path.display())));
                }
            }
            if let Some(path) = &input {
                let sha256 = offer_receipt::sha256_json(&read_json(path)?);
                if payload["inputSha256"].as_str() != Some(sha256.as_str()) {
                    return Err(mismatch(&format!("{}: not the input the receipt signs", path.display())));
                }
            }
            if opts.json {
                output::json(&json!({
                    "verified": true,
                    "signer": verified.signer.to_checksum(None),
                    "receipt": payload,
                    "outputs": matched,
                }));
            } else {
                print_verified(&verified.signer.to_checksum(None), &payload, &matched);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_verified(signer: &str, payload: &Value, matched: &[Value]) {
    let text = |pointer: &str| payload.pointer(pointer).and_then(Value::as_str).unwrap_or("-").to_owned();
    println!("receipt verified: signed by {signer}, the published signer");
    println!("  task      {} ({})", text("/task"), text("/kind"));
    println!("  input     sha256 {}", text("/inputSha256"));
    println!("  paid      {} atomic units of {} on {}", text("/amount"), text("/asset"), text("/network"));
    if let Some(metered) = payload.get("metered") {
        let used = metered["used"].as_u64().map_or("-".to_owned(), |u| u.to_string());
        println!("  metered   {used} used, at {} per {}", text("/metered/rate"), text("/metered/unit"));
    }
    if payload.get("credit").is_some() {
        let source = payload.pointer("/credit/sourceTask").and_then(Value::as_str).unwrap_or("a charge without a task");
        println!(
            "  credit    {} (owed for {source}: {}); the payment below paid for that",
            text("/credit/id"),
            text("/credit/reason")
        );
    }
    println!("  payer     {}", text("/payer"));
    println!("  tx        {}", text("/transaction"));
    match payload.get("delivery") {
        Some(_) => {
            println!("  delivered {} (result sha256 {})", text("/delivery/status"), text("/delivery/resultSha256"));
            for file in payload.pointer("/delivery/outputs").and_then(Value::as_array).into_iter().flatten() {
                let name = file["name"].as_str().unwrap_or_default();
                let checked = matched.iter().find(|m| m["name"].as_str() == Some(name));
                let mark = checked.map_or(String::new(), |m| format!("  = {}", m["file"].as_str().unwrap_or_default()));
                println!("    {name}  sha256 {}{mark}", file["sha256"].as_str().unwrap_or_default());
            }
        }
        None => println!("  (signed before the task ended: no proof of delivery yet)"),
    }
}

/// The receipt in `path`: a signed receipt, or a settlement response that
/// carries one.
fn read_receipt(path: &Path) -> Result<Signed, ClientError> {
    let value = read_json(path)?;
    if let Some(signed) = offer_receipt::receipt_in(&value) {
        return Ok(signed);
    }
    serde_json::from_value(value)
        .map_err(|_| ClientError::Usage(format!("{} holds no receipt ({{\"format\", \"signature\"}})", path.display())))
}

fn read_json(path: &Path) -> Result<Value, ClientError> {
    let text = std::fs::read(path).map_err(|e| ClientError::Usage(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&text).map_err(|e| ClientError::Usage(format!("{} is not JSON: {e}", path.display())))
}

fn address(text: &str) -> Result<alloy_primitives::Address, ClientError> {
    text.trim().parse().map_err(|_| ClientError::Usage(format!("{text:?} is not an address (0x and 40 hex digits)")))
}

/// The signer the deployment's catalog publishes.
async fn published_signer(client: &Client) -> Result<alloy_primitives::Address, ClientError> {
    let catalog = client.public(Method::GET, "/v1/catalog", None).await?;
    match catalog.body.pointer("/receipts/signer").and_then(Value::as_str) {
        Some(signer) => address(signer),
        None => Err(ClientError::Usage(format!(
            "{} publishes no receipt signer; pass the seller's address with --signer",
            client.url("/v1/catalog")
        ))),
    }
}

fn refused(e: VerifyError) -> ClientError {
    mismatch(&e.to_string())
}

fn mismatch(message: &str) -> ClientError {
    ClientError::Refused { status: 0, code: "receipt_refused".into(), message: message.to_owned() }
}
