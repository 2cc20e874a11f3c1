//! `reeve task`: create (paying with `--pay` where the catalog sets a
//! price, uploading `--file` inputs first), list, get, cancel, watch and
//! fetch a result, each printed as JSON with `--json`; `watch` and
//! `create --watch` exit with the task's outcome.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use reeve_shared::ids::Id;
use reeve_shared::tasks::TaskStatus;
use reqwest::Method;
use serde_json::{Map, Value, json};

use super::output::{self, bar, table};
use super::upload::upload_file;
use super::{Client, ClientError, ClientOpts, EXIT_TASK_CANCELED, EXIT_TASK_FAILED};
use crate::follow::FollowError;

#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// Create a task: `reeve task create digest --file upload_id=report.pdf --watch`.
    Create(Box<CreateArgs>),
    /// The Space's tasks, newest first.
    List {
        /// queued, running, completed, failed or canceled.
        #[arg(long, value_parser = parse_status)]
        status: Option<TaskStatus>,
        #[arg(long)]
        kind: Option<String>,
        /// 1 to 100.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
        limit: Option<u32>,
        /// The `next` of the previous page.
        #[arg(long)]
        after: Option<Id>,
    },
    /// One task as it is now.
    Get { id: Id },
    /// Cancel a task: at once if queued; a running one stops within a second.
    /// With filters (or several ids, or --dry-run), cancel every task of the
    /// Space they match: `reeve task cancel --kind fetch --status queued`.
    Cancel(CancelArgs),
    /// A task's completion webhook: each attempt, its answer and the next try.
    Webhooks { id: Id },
    /// A finished task's result; saves its files where the result links
    /// them (a `fetch` result's object, a service kind's output files).
    Result {
        id: Id,
        /// Where to save a downloadable result (default: its name, here).
        #[arg(long)]
        output: Option<PathBuf>,
        /// The directory for the result's output files (default: here),
        /// each saved under its own name.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Follow a task's events with a progress bar; exits 0 when it
    /// completes, 1 when it fails, 2 when it is canceled.
    Watch {
        id: Id,
        /// A session token to use instead of the profile's.
        #[arg(long, env = reeve_shared::settings::SESSION_TOKEN, hide_env_values = true)]
        token: Option<String>,
    },
}

#[derive(Args, Debug)]
pub struct CancelArgs {
    /// The task to cancel; with filters, or several, only among these.
    pub ids: Vec<Id>,
    /// Only tasks of this kind.
    #[arg(long)]
    pub kind: Option<String>,
    /// Only tasks in this status (queued, running, ...). Repeatable.
    #[arg(long = "status", value_parser = parse_status)]
    pub statuses: Vec<TaskStatus>,
    /// Only tasks created at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub created_after: Option<String>,
    /// Only tasks created before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub created_before: Option<String>,
    /// Say what would be canceled; cancel nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl CancelArgs {
    /// One task by its id, as before filters existed.
    fn single(&self) -> Option<Id> {
        let filtered = self.kind.is_some()
            || !self.statuses.is_empty()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.dry_run;
        match self.ids.as_slice() {
            [id] if !filtered => Some(*id),
            _ => None,
        }
    }

    /// The body of `POST /v1/tasks/cancel`.
    fn filter(&self) -> Value {
        let mut body = json!({ "dry_run": self.dry_run });
        if !self.ids.is_empty() {
            body["ids"] = json!(self.ids);
        }
        if let Some(kind) = &self.kind {
            body["kind"] = json!(kind);
        }
        if !self.statuses.is_empty() {
            body["status"] = json!(self.statuses);
        }
        if let Some(after) = &self.created_after {
            body["created_after"] = json!(after);
        }
        if let Some(before) = &self.created_before {
            body["created_before"] = json!(before);
        }
        body
    }
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The task kind, from `reeve catalog`.
    pub kind: String,
    /// An input field: `key=text`, or `key:=JSON` for numbers, booleans,
    /// arrays and objects. Repeatable.
    #[arg(long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// The input as a JSON object, or `@FILE` to read it from a file;
    /// `--input` and `--file` fields are added to it.
    #[arg(long, value_name = "JSON|@FILE")]
    pub input_json: Option<String>,
    /// Upload a file and put its upload id in FIELD (a field named `…_ids`
    /// collects a list). Repeatable.
    #[arg(long = "file", value_name = "FIELD=PATH")]
    pub files: Vec<String>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// POST the task's view to this URL when it ends, signed with the
    /// Space's webhook secret (`reeve space webhook-secret` first).
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Only these events: the ends (completed, failed, canceled) and progress
    /// while it runs; default every end. Repeatable.
    #[arg(long = "webhook-event", value_name = "EVENT", requires = "webhook")]
    pub webhook_events: Vec<String>,
    /// Follow the task to its end, like `reeve task watch`.
    #[arg(long)]
    pub watch: bool,
    /// Follow the task to its end (as --watch), then save its output files
    /// in DIR (default: here), each under its own name.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = ".")]
    pub download: Option<PathBuf>,
    /// Pay a priced task's 402 with x402, with the key in REEVE_WALLET_KEY
    /// (or --wallet-key-file), never an argument: an EIP-3009 authorization
    /// of an `exact` price, or for a metered (`upto`) one a Permit2
    /// authorization of its ceiling, of which only what the task uses is
    /// charged.
    #[arg(long)]
    pub pay: bool,
    /// With --pay: pay over a batch-settlement channel where the 402 offers
    /// one. The first payment deposits into x402's escrow (the seller's
    /// minimum: some tasks' worth), which the seller's facilitator sends;
    /// every later task is a signed voucher, with no transaction to wait
    /// for. What was not charged stays the payer's: the escrow lets it
    /// withdraw the rest after the channel's withdraw delay. The channel's
    /// state is kept under the credentials directory (reeve/channels/).
    #[arg(long, requires = "pay")]
    pub channel: bool,
    /// With --channel: how much a deposit puts into the channel, in the
    /// asset's atomic units (default: the offer's minimum, some tasks'
    /// worth; never less than the task needs). More tasks per deposit are
    /// fewer transactions.
    #[arg(long, value_name = "AMOUNT", requires = "channel")]
    pub deposit: Option<u128>,
    /// The payment network's JSON-RPC endpoint, for --pay of a metered
    /// price: a URL, or `eip155:<chain id>=URL` pairs separated by commas.
    /// There reeve reads whether the payer approved Permit2, to sign the
    /// token's permit instead when the server offers gas sponsoring.
    #[arg(long, value_name = "URL|NETWORK=URL,…", env = reeve_shared::settings::CHAIN_RPC_URLS, hide_env_values = true)]
    pub chain_rpc: Option<String>,
    /// A file holding the paying wallet's private key (hex), for --pay.
    #[arg(long, value_name = "PATH", requires = "pay")]
    pub wallet_key_file: Option<PathBuf>,
    /// The paying wallet's private key, from REEVE_WALLET_KEY only: hidden,
    /// and refused as an argument (see `pay::WalletKeyParser`).
    #[arg(long, env = reeve_shared::settings::WALLET_KEY, hide = true, hide_env_values = true, value_parser = crate::pay::WalletKeyParser)]
    pub wallet_key: Option<crate::pay::WalletKey>,
}

/// `key=text` or `key:=JSON`.
fn parse_field(arg: &str) -> Result<(String, Value), ClientError> {
    let bad = || ClientError::Usage(format!("--input {arg:?}: expected KEY=VALUE or KEY:=JSON"));
    let (key, value) = arg.split_once('=').ok_or_else(bad)?;
    if let Some(key) = key.strip_suffix(':') {
        let value = serde_json::from_str(value)
            .map_err(|e| ClientError::Usage(format!("--input {arg:?}: the value is not JSON: {e}")))?;
        return (!key.is_empty()).then(|| (key.to_owned(), value)).ok_or_else(bad);
    }
    (!key.is_empty()).then(|| (key.to_owned(), Value::String(value.to_owned()))).ok_or_else(bad)
}

fn base_input(input_json: Option<&str>) -> Result<Map<String, Value>, ClientError> {
    let Some(text) = input_json else {
        return Ok(Map::new());
    };
    let text = match text.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| ClientError::Usage(format!("--input-json @{file}: cannot read it: {e}")))?,
        None => text.to_owned(),
    };
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ClientError::Usage("--input-json must be a JSON object".into())),
        Err(e) => Err(ClientError::Usage(format!("--input-json is not JSON: {e}"))),
    }
}

pub async fn task(client: &mut Client, opts: &ClientOpts, command: TaskCommand) -> Result<ExitCode, ClientError> {
    match command {
        TaskCommand::Create(args) => create(client, opts, *args).await,
        TaskCommand::List { status, kind, limit, after } => {
            let mut query = Vec::new();
            if let Some(status) = status {
                query.push(format!("status={}", status.as_str()));
            }
            if let Some(kind) = kind {
                query.push(format!("kind={}", urlencode(&kind)));
            }
            if let Some(limit) = limit {
                query.push(format!("limit={limit}"));
            }
            if let Some(after) = after {
                query.push(format!("after={after}"));
            }
            let path = if query.is_empty() { "/v1/tasks".to_owned() } else { format!("/v1/tasks?{}", query.join("&")) };
            let page = client.authed(Method::GET, &path, None, &[]).await?.body;
            if opts.json {
                output::json(&page);
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = page["tasks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    vec![
                        t["id"].as_str().unwrap_or_default().to_owned(),
                        t["kind"].as_str().unwrap_or_default().to_owned(),
                        t["status"].as_str().unwrap_or_default().to_owned(),
                        format!("{:.0}%", t["progress"].as_f64().unwrap_or(0.0) * 100.0),
                        t["created_at"].as_str().unwrap_or_default().to_owned(),
                    ]
                })
                .collect();
            println!("{}", table(&["ID", "KIND", "STATUS", "PROGRESS", "CREATED"], &rows));
            if let Some(next) = page["next"].as_str() {
                eprintln!("more: reeve task list --after {next}");
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Get { id } => {
            let task = client.authed(Method::GET, &format!("/v1/tasks/{id}"), None, &[]).await?.body;
            if opts.json {
                output::json(&task);
            } else {
                print_task(&task);
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Cancel(args) => {
            let Some(id) = args.single() else {
                return cancel_matching(client, opts, &args).await;
            };
            let answer = client.authed(Method::POST, &format!("/v1/tasks/{id}/cancel"), None, &[]).await?;
            if opts.json {
                output::json(&answer.body);
            } else if answer.status == reqwest::StatusCode::ACCEPTED {
                eprintln!("task {id} is running: asked it to stop; it ends canceled within a second");
            } else {
                eprintln!("task {id} canceled");
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Webhooks { id } => {
            let answer = client.authed(Method::GET, &format!("/v1/tasks/{id}/webhooks"), None, &[]).await?.body;
            if opts.json {
                output::json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let deliveries = answer["deliveries"].as_array().cloned().unwrap_or_default();
            if deliveries.is_empty() {
                eprintln!("task {id} has no webhook delivery (it has not ended, or no endpoint asked for its end)");
            }
            let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            for delivery in deliveries {
                // Each run's end has its own delivery: say which re-run's it is.
                let run = match delivery["rerun"].as_i64() {
                    Some(n) if n > 0 => format!(" (re-run {n})"),
                    _ => String::new(),
                };
                println!(
                    "{} {}{run} {}: {}",
                    text(&delivery["id"]),
                    text(&delivery["event"]),
                    text(&delivery["url"]),
                    text(&delivery["status"])
                );
                let rows: Vec<Vec<String>> = delivery["attempts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        let code = a["status_code"].as_i64().map_or("-".to_owned(), |c| c.to_string());
                        let error = a["error"].as_str().unwrap_or("").to_owned();
                        let next = a["next_attempt_at"].as_str().unwrap_or("").to_owned();
                        vec![text(&a["n"]), text(&a["at"]), code, error, next]
                    })
                    .collect();
                if !rows.is_empty() {
                    print!("{}", table(&["#", "at", "status", "error", "next"], &rows));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TaskCommand::Result { id, output: path, dir } => result(client, opts, id, path, dir).await,
        TaskCommand::Watch { id, token } => {
            let token = match token {
                Some(token) => token,
                None => client.token().await?,
            };
            watch_to_end(client, opts, id, &token, None).await
        }
    }
}

/// The most requests one bulk cancel sends (1000 tasks each).
const MAX_ROUNDS: usize = 100;

/// `reeve task cancel` with filters: `POST /v1/tasks/cancel` again while
/// the answer says `more` (never on a dry run), then the totals.
async fn cancel_matching(client: &mut Client, opts: &ClientOpts, args: &CancelArgs) -> Result<ExitCode, ClientError> {
    let body = args.filter();
    let mut total = client.authed(Method::POST, "/v1/tasks/cancel", Some(&body), &[]).await?.body;
    let mut rounds = 1;
    while total["more"] == json!(true) && !args.dry_run && rounds < MAX_ROUNDS {
        let next = client.authed(Method::POST, "/v1/tasks/cancel", Some(&body), &[]).await?.body;
        for field in ["canceled", "requested"] {
            total[field] = json!(total[field].as_u64().unwrap_or(0) + next[field].as_u64().unwrap_or(0));
        }
        if let (Some(ids), Some(more)) = (total["task_ids"].as_array_mut(), next["task_ids"].as_array()) {
            ids.extend(more.iter().cloned());
        }
        total["more"] = next["more"].clone();
        rounds += 1;
    }
    if opts.json {
        output::json(&total);
        return Ok(ExitCode::SUCCESS);
    }
    let n = |field: &str| total[field].as_u64().unwrap_or(0);
    if args.dry_run {
        let ids = total["task_ids"].as_array().map_or(0, Vec::len);
        println!(
            "dry run: {} matched; would cancel {ids}; {} already ended (left as they are)",
            n("matched"),
            n("skipped")
        );
        for id in total["task_ids"].as_array().into_iter().flatten().take(20) {
            println!("  {}", id.as_str().unwrap_or_default());
        }
        if total["more"] == json!(true) {
            println!("  … and more: each request cancels at most 1000");
        }
    } else {
        println!(
            "{} matched: {} canceled, {} running asked to stop, {} already ended (left as they are)",
            n("matched"),
            n("canceled"),
            n("requested"),
            n("skipped")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_status(s: &str) -> Result<TaskStatus, String> {
    TaskStatus::parse(s).ok_or_else(|| "expected queued, running, completed, failed or canceled".to_owned())
}

/// Everything but RFC 3986's unreserved characters is escaped, so a value
/// can sit in a path segment or a query value alike.
const COMPONENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

pub(crate) fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, COMPONENT).to_string()
}

fn print_task(task: &Value) {
    for key in ["id", "kind", "status"] {
        println!("{key:<9} {}", task[key].as_str().unwrap_or_default());
    }
    println!("{:<9} {:.0}%", "progress", task["progress"].as_f64().unwrap_or(0.0) * 100.0);
    println!("{:<9} {}", "attempts", task["attempts"]);
    if let Some(at) = task["cancel_requested_at"].as_str() {
        println!("{:<9} {at} (the worker stops it within a second)", "cancel");
    }
    println!("{:<9} {}", "created", task["created_at"].as_str().unwrap_or_default());
    println!("{:<9} {}", "updated", task["updated_at"].as_str().unwrap_or_default());
    if !task["result"].is_null() {
        println!("{:<9} {}", "result", task["result"]);
    }
    if !task["error"].is_null() {
        println!(
            "{:<9} {} ({})",
            "error",
            task["error"]["message"].as_str().unwrap_or_default(),
            task["error"]["code"].as_str().unwrap_or_default()
        );
    }
}

async fn create(client: &mut Client, opts: &ClientOpts, args: CreateArgs) -> Result<ExitCode, ClientError> {
    let mut input = base_input(args.input_json.as_deref())?;
    for arg in &args.inputs {
        let (key, value) = parse_field(arg)?;
        input.insert(key, value);
    }
    let mut files = Vec::new();
    for arg in &args.files {
        let Some((field, path)) = arg.split_once('=').filter(|(f, p)| !f.is_empty() && !p.is_empty()) else {
            return Err(ClientError::Usage(format!("--file {arg:?}: expected FIELD=PATH")));
        };
        files.push((field.to_owned(), PathBuf::from(path)));
    }
    // Every argument is checked before the first byte is uploaded.
    if let Some(dir) = args.download.as_deref().filter(|dir| !dir.is_dir()) {
        return Err(ClientError::Usage(format!("--download: {} is not a directory", dir.display())));
    }
    for (_, path) in &files {
        if !path.is_file() {
            return Err(ClientError::Usage(format!("--file: {} is not a readable file", path.display())));
        }
    }
    for (field, path) in files {
        let uploaded = upload_file(client, &path, None, opts.json).await?;
        let id = uploaded["upload_id"].clone();
        if field.ends_with("_ids") {
            match input.entry(field).or_insert_with(|| Value::Array(Vec::new())) {
                Value::Array(ids) => ids.push(id),
                other => *other = Value::Array(vec![id]),
            }
        } else {
            input.insert(field, id);
        }
    }
    let headers: Vec<(&str, String)> = args.idempotency_key.iter().map(|k| ("idempotency-key", k.clone())).collect();
    let mut body = json!({ "input": Value::Object(input) });
    match (&args.webhook, args.webhook_events.is_empty()) {
        (Some(url), true) => body["webhook"] = json!(url),
        (Some(url), false) => body["webhook"] = json!({ "url": url, "events": args.webhook_events }),
        (None, _) => {}
    }
    let path = format!("/v1/tasks/{}", urlencode(&args.kind));
    let accepted = match client.authed(Method::POST, &path, Some(&body), &headers).await {
        Err(ClientError::PaymentRequired(challenge)) if args.channel => {
            pay_over_channel(client, opts, &args, &path, &body, &headers, challenge).await?
        }
        // Priced, and the user asked to pay: sign the challenge, send again.
        Err(ClientError::PaymentRequired(challenge)) if args.pay => {
            let pay_error = |e: crate::pay::PayError| ClientError::Usage(format!("--pay: {e}"));
            let key =
                crate::pay::wallet_key(args.wallet_key_file.as_deref(), args.wallet_key.as_ref()).map_err(pay_error)?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let challenge: reeve_shared::payments::PaymentRequired = serde_json::from_value(challenge)
                .map_err(|e| ClientError::Usage(format!("--pay: the server's 402 is not an x402 v2 challenge: {e}")))?;
            let signed = crate::pay::payment_header(&challenge, &key, now, args.chain_rpc.as_deref())
                .await
                .map_err(pay_error)?;
            // On stderr even with --json: stdout stays the one JSON document.
            if let Some(note) = &signed.note {
                eprintln!("--pay: {note}");
            }
            let timeout = crate::pay::choose(&challenge).map_or(300, |r| u64::from(r.max_timeout_seconds));
            let mut paid = headers.clone();
            paid.push(("payment-signature", signed.header));
            let answer = pay_until_settled(client, &path, &body, &paid, timeout).await?.checked()?;
            let mut accepted = answer.body;
            // The settlement receipt is the user's proof of what was paid.
            if let Some(receipt) = settlement(&answer.headers) {
                if !opts.json {
                    eprintln!(
                        "paid: transaction {} on {} from {}",
                        receipt["transaction"].as_str().unwrap_or("?"),
                        receipt["network"].as_str().unwrap_or("?"),
                        receipt["payer"].as_str().unwrap_or("?"),
                    );
                }
                accepted["payment"] = receipt;
            } else if accepted["payment"]["status"] == "authorized" && !opts.json {
                // Metered: nothing is charged until the task ends.
                eprintln!(
                    "authorized: up to {} of {} on {} from {}; charged for what the task uses when it ends",
                    accepted["payment"]["authorized"].as_str().unwrap_or("?"),
                    accepted["payment"]["asset"].as_str().unwrap_or("?"),
                    accepted["payment"]["network"].as_str().unwrap_or("?"),
                    accepted["payment"]["payer"].as_str().unwrap_or("?"),
                );
            }
            accepted
        }
        other => other?.body,
    };
    let id: Id = accepted["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ClientError::Usage("the server's answer carried no task id".into()))?;
    if !args.watch && args.download.is_none() {
        if opts.json {
            output::json(&accepted);
        } else {
            println!("{id}");
            eprintln!("task {id} queued; follow it with: reeve task watch {id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !opts.json {
        eprintln!("task {id} queued");
    }
    let token = client.token().await?;
    watch_to_end(client, opts, id, &token, args.download.as_deref()).await
}

/// `--pay --channel`: pays `challenge` over the payer's batch-settlement
/// channel (see `pay::channel`), and after a `402` that tells the channel as
/// the seller keeps it, once more from there. Answers the accepted task,
/// with the payment's `PAYMENT-RESPONSE` as its `payment`.
async fn pay_over_channel(
    client: &mut Client,
    opts: &ClientOpts,
    args: &CreateArgs,
    path: &str,
    body: &Value,
    headers: &[(&str, String)],
    challenge: Value,
) -> Result<Value, ClientError> {
    use crate::pay::channel;
    let pay_error = |e: crate::pay::PayError| ClientError::Usage(format!("--pay --channel: {e}"));
    let key = crate::pay::wallet_key(args.wallet_key_file.as_deref(), args.wallet_key.as_ref()).map_err(pay_error)?;
    let signer: alloy_signer_local::PrivateKeySigner =
        key.parse().map_err(|_| pay_error(crate::pay::PayError::BadKey))?;
    let parse = |challenge: Value| -> Result<reeve_shared::payments::PaymentRequired, ClientError> {
        serde_json::from_value(challenge)
            .map_err(|e| ClientError::Usage(format!("--pay: the server's 402 is not an x402 v2 challenge: {e}")))
    };
    let challenge = parse(challenge)?;
    let offer = channel::offer(&challenge).ok_or_else(|| {
        ClientError::Usage(
            "--pay --channel: this task's 402 offers no batch-settlement payment; pay it with --pay alone".into(),
        )
    })?;
    let mut channel = super::open_channel(opts, offer, &signer)?;
    // The first payment, and up to two more after a 402 that told the
    // channel's state: a voucher sent blind, then perhaps a deposit.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let payment = channel.pay(&challenge, offer, &signer, now, args.deposit).map_err(pay_error)?;
        let mut paid = headers.to_vec();
        paid.push(("payment-signature", payment.header));
        let answer = pay_until_settled(client, path, body, &paid, u64::from(offer.max_timeout_seconds)).await?;
        // A refused voucher's 402 is an error envelope, its challenge (with
        // the channel as the seller keeps it) in PAYMENT-REQUIRED.
        let refused = (answer.status == reqwest::StatusCode::PAYMENT_REQUIRED)
            .then(|| answer.headers.get(reeve_shared::payments::PAYMENT_REQUIRED_HEADER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(reeve_shared::payments::PaymentRequired::from_header_value);
        let (refusal, error) = match (refused, answer.checked()) {
            (Some(refusal), Err(e)) if attempts < 3 => (refusal, e),
            (_, Err(e)) => return Err(e),
            (_, Ok(answer)) => {
                let response = answer
                    .headers
                    .get(reeve_shared::payments::PAYMENT_RESPONSE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(reeve_shared::payments::PaymentResponse::from_header)
                    .ok_or_else(|| {
                        ClientError::Usage("--pay --channel: the paid answer had no PAYMENT-RESPONSE".into())
                    })?;
                let charged = channel.paid(&response).map_err(pay_error)?;
                if !opts.json {
                    let (balance, total) = channel.known().unwrap_or_default();
                    match payment.deposit {
                        Some(amount) => eprintln!(
                            "paid: deposited {amount} into channel {} (transaction {}) and charged {charged} by voucher; \
                             charged {total} of {balance} held",
                            channel.id(),
                            response.transaction,
                        ),
                        None => eprintln!(
                            "paid: charged {charged} by voucher on channel {}; charged {total} of {balance} held",
                            channel.id()
                        ),
                    }
                }
                let mut accepted = answer.body;
                accepted["payment"] = serde_json::to_value(&response).unwrap_or_default();
                accepted["payment"]["channel"] = json!(channel.id());
                return Ok(accepted);
            }
        };
        // Refused for something resynchronising cannot mend: as refused.
        if !channel.resynchronise(&refusal).map_err(pay_error)? {
            return Err(error);
        }
    }
}

/// Sends the paid create, and while the server says the payment is
/// pending (`409 payment_pending`, or another request holds it), waits its
/// `Retry-After` and sends the very same signature again: a new one could
/// be charged too. The server resolves the payment from the chain, so this
/// ends in its one task or `payment_not_settled`, by the time the
/// authorization expires (`max_timeout` seconds) plus a little; past that
/// it stops waiting and says where the outcome will show. Any other
/// answer is the caller's to check.
async fn pay_until_settled(
    client: &mut Client,
    path: &str,
    body: &Value,
    paid: &[(&str, String)],
    max_timeout: u64,
) -> Result<crate::client::Answer, ClientError> {
    const PENDING: &[&str] = &["payment_pending", "payment_in_progress", "request_in_progress"];
    let give_up = std::time::Instant::now() + Duration::from_secs(max_timeout + 120);
    loop {
        let answer = client.authed_raw(Method::POST, path, Some(body), paid).await?;
        let pending =
            answer.status == reqwest::StatusCode::CONFLICT && answer.code().is_some_and(|c| PENDING.contains(&c));
        if !pending {
            return Ok(answer);
        }
        let wait = answer
            .headers
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(5)
            .clamp(1, 60);
        if std::time::Instant::now() + Duration::from_secs(wait) > give_up {
            return Err(ClientError::Refused {
                status: 409,
                code: "payment_pending".into(),
                message: "the payment's outcome is still not known; it may yet be charged, and if it is, its task \
                          appears in `reeve task list` (and the payment in `reeve space`). Do not pay again for it"
                    .into(),
            });
        }
        // On stderr even with --json: stdout stays the one JSON document.
        eprintln!("payment pending: sending the same signature again in {wait}s (never a new one)");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

/// The decoded `PAYMENT-RESPONSE` (base64 JSON: success, transaction,
/// network, payer) of a paid create, when the server sent one.
fn settlement(headers: &reqwest::header::HeaderMap) -> Option<Value> {
    let raw = headers.get(reeve_shared::payments::PAYMENT_RESPONSE_HEADER)?.to_str().ok()?;
    let response = reeve_shared::payments::PaymentResponse::from_header(raw)?;
    serde_json::to_value(response).ok()
}

/// Follows the task to its end. With `--json`, prints the final task; the
/// exit code is its outcome either way. With `download`, a completed task's
/// output files are saved there; one that cannot be is an error (exit 3, 4
/// or 5), though the task completed.
async fn watch_to_end(
    client: &mut Client,
    opts: &ClientOpts,
    id: Id,
    token: &str,
    download: Option<&Path>,
) -> Result<ExitCode, ClientError> {
    let relay = opts.relay.clone().unwrap_or_else(|| client.endpoint.clone());
    let watched = crate::watch::watch(&client.http, &relay, token, id, opts.json).await.map_err(|e| match e {
        FollowError::Refused { status, code, message } => ClientError::Refused { status, code, message },
        FollowError::GaveUp(n) => ClientError::Unreachable {
            endpoint: relay.clone(),
            cause: format!("lost the event stream {n} times in a row"),
        },
    })?;
    let status = watched.status;
    if !opts.json && status != TaskStatus::Completed {
        if download.is_some() {
            eprintln!("task {id} {}: nothing to download", status.as_str());
        }
        return Ok(outcome_code(status));
    }
    if !opts.json && download.is_none() && !watched.files {
        return Ok(outcome_code(status));
    }
    // The stream carries a result's files without links (a link is signed
    // when the task is read, so it is fresh): read it once more for them,
    // with the token the stream was followed with (`task watch --token`
    // has no profile to log in with).
    let read = client.http.get(client.url(&format!("/v1/tasks/{id}"))).bearer_auth(token);
    let mut task = client.send_raw(read).await?.checked()?.body;
    if !opts.json {
        // The links first: they stay usable if a save below fails.
        for file in task["result"]["outputs"].as_array().into_iter().flatten() {
            let text = |key: &str| file[key].as_str().unwrap_or("-").to_owned();
            println!("output {}: {} (valid until {})", text("name"), text("url"), text("url_expires_at"));
        }
    }
    let saved = match download {
        Some(dir) if status == TaskStatus::Completed => save_outputs(client, &task["result"], dir, opts.json).await?,
        _ => Vec::new(),
    };
    if opts.json {
        if download.is_some() {
            task["saved_to"] = json!(saved);
        }
        output::json(&task);
    } else {
        for path in &saved {
            eprintln!("saved to {}", path.display());
        }
    }
    Ok(outcome_code(status))
}

/// Saves each of `result`'s output files (a service kind's `outputs`) in
/// `dir` under its own name, from the link the task's read just signed;
/// the paths written, in order. A name that is not a plain file name is
/// refused rather than written outside `dir`.
async fn save_outputs(client: &Client, result: &Value, dir: &Path, quiet: bool) -> Result<Vec<PathBuf>, ClientError> {
    let files = result["outputs"].as_array().cloned().unwrap_or_default();
    let mut saved = Vec::with_capacity(files.len());
    for file in &files {
        let name = file["name"].as_str().unwrap_or_default();
        if !reeve_shared::tasks::output::valid_file_name(name) {
            return Err(ClientError::Refused {
                status: 502,
                code: "download_failed".into(),
                message: format!("the result names an output file {name:?}, which is no plain file name"),
            });
        }
        let Some(url) = file["url"].as_str() else {
            return Err(ClientError::Refused {
                status: 410,
                code: "download_failed".into(),
                message: format!(
                    "output file {name} has no download link (the bucket may have deleted it); read the task again"
                ),
            });
        };
        let target = dir.join(name);
        download(client, url, &target, quiet).await?;
        saved.push(target);
    }
    Ok(saved)
}

pub fn outcome_code(status: TaskStatus) -> ExitCode {
    match status {
        TaskStatus::Completed => ExitCode::SUCCESS,
        TaskStatus::Canceled => ExitCode::from(EXIT_TASK_CANCELED),
        _ => ExitCode::from(EXIT_TASK_FAILED),
    }
}

async fn result(
    client: &mut Client,
    opts: &ClientOpts,
    id: Id,
    path: Option<PathBuf>,
    dir: Option<PathBuf>,
) -> Result<ExitCode, ClientError> {
    let dir = dir.unwrap_or_else(|| PathBuf::from("."));
    if !dir.is_dir() {
        return Err(ClientError::Usage(format!("--dir: {} is not a directory", dir.display())));
    }
    let task = client.authed(Method::GET, &format!("/v1/tasks/{id}"), None, &[]).await?.body;
    let status = task["status"].as_str().and_then(TaskStatus::parse);
    match status {
        Some(TaskStatus::Completed) => {}
        Some(status @ (TaskStatus::Failed | TaskStatus::Canceled)) => {
            if opts.json {
                output::json(&task);
            } else {
                let error = &task["error"];
                match error["code"].as_str() {
                    Some(code) => eprintln!(
                        "task {id} {}: {} ({code})",
                        status.as_str(),
                        error["message"].as_str().unwrap_or_default()
                    ),
                    None => eprintln!("task {id} {}: it has no result", status.as_str()),
                }
            }
            return Ok(outcome_code(status));
        }
        _ => {
            return Err(ClientError::Refused {
                status: 409,
                code: "task_not_finished".into(),
                message: format!(
                    "task {id} is {}: it has no result yet; `reeve task watch {id}` follows it",
                    task["status"].as_str().unwrap_or("unknown")
                ),
            });
        }
    }
    let result = task["result"].clone();
    // Past the bucket's retention there is nothing left to download.
    if let Some(message) = result["expired"]["message"].as_str() {
        return Err(ClientError::Refused { status: 410, code: "output_expired".into(), message: message.into() });
    }
    let mut saved = None;
    if let Some(url) = result["url"].as_str() {
        let default = result["key"]
            .as_str()
            .and_then(|k| k.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .map_or_else(|| format!("{id}.out"), str::to_owned);
        let target = path.unwrap_or_else(|| PathBuf::from(default));
        download(client, url, &target, opts.json).await?;
        saved = Some(target);
    }
    let files = save_outputs(client, &result, &dir, opts.json).await?;
    if opts.json {
        let mut answer = json!({ "id": id, "result": result, "saved_to": saved });
        if !files.is_empty() {
            answer["files_saved_to"] = json!(files);
        }
        output::json(&answer);
    } else {
        println!("{}", serde_json::to_string_pretty(&result).expect("JSON values serialise"));
        for saved in saved.iter().chain(&files) {
            eprintln!("saved to {}", saved.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn download(client: &Client, url: &str, target: &Path, quiet: bool) -> Result<(), ClientError> {
    use futures_util::StreamExt;
    use std::io::Write;
    let host = url.split('?').next().unwrap_or_default().to_owned();
    let unreachable = |e: reqwest::Error| ClientError::Unreachable { endpoint: host.clone(), cause: e.to_string() };
    let response = client.http.get(url).timeout(Duration::from_secs(3600)).send().await.map_err(unreachable)?;
    if !response.status().is_success() {
        return Err(ClientError::Refused {
            status: response.status().as_u16(),
            code: "download_failed".into(),
            message: format!(
                "the download link of {} did not answer the file (it may have expired)",
                target.file_name().unwrap_or_default().to_string_lossy()
            ),
        });
    }
    let progress = bar(response.content_length().unwrap_or(0), quiet);
    progress.set_message(target.display().to_string());
    let local = |e: std::io::Error| ClientError::Usage(format!("cannot write {}: {e}", target.display()));
    // Written beside the target and renamed when whole: a broken download
    // leaves no truncated file under the real name.
    let mut partial = target.as_os_str().to_owned();
    partial.push(".part");
    let partial = PathBuf::from(partial);
    let mut file = std::fs::File::create(&partial).map_err(local)?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let written = match chunk {
            Ok(chunk) => file.write_all(&chunk).map(|()| chunk.len()).map_err(local),
            Err(e) => Err(unreachable(e)),
        };
        match written {
            Ok(n) => progress.inc(n as u64),
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        }
    }
    drop(file);
    if let Err(e) = std::fs::rename(&partial, target) {
        let _ = std::fs::remove_file(&partial);
        return Err(local(e));
    }
    progress.finish_and_clear();
    Ok(())
}
