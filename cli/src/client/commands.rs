//! The client commands but `task` ([`super::task`]): each turns its
//! arguments into requests through [`Client`] and prints the answer, as JSON
//! with `--json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use super::output::{self, bar, table};
use super::payment_required;
use super::{Client, ClientError, ClientOpts};

#[derive(Subcommand, Debug)]
pub enum SpaceCommand {
    /// Create a Space; prints its ID once and keeps it in the credentials file.
    Create,
    /// The Space's payments, credits and free-task quotas (also what bare `reeve space` shows).
    Show,
}

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// Log in to this Space (kept for next time); default: the profile's.
    #[arg(long, env = reeve_shared::settings::SPACE_ID, hide_env_values = true)]
    pub space_id: Option<String>,
}

#[derive(Args, Debug)]
pub struct UploadArgs {
    /// The file to upload.
    pub file: PathBuf,
    /// Its content type (default: guessed from the extension).
    #[arg(long)]
    pub content_type: Option<String>,
}

/// Runs a client command; `Err` is printed by [`report`].
pub async fn space(client: &mut Client, opts: &ClientOpts, command: SpaceCommand) -> Result<ExitCode, ClientError> {
    match command {
        SpaceCommand::Show => {
            let space = client.authed(Method::GET, "/v1/space", None, &[]).await?.body;
            if opts.json {
                output::json(&space);
            } else {
                print!("{}", crate::space_view::render(&space));
            }
            Ok(ExitCode::SUCCESS)
        }
        SpaceCommand::Create => {
            let answer = client.public(Method::POST, "/v1/spaces", None).await?;
            let space_id = answer.body["space_id"].as_str().unwrap_or_default().to_owned();
            // A new Space: the old one's session no longer applies.
            client.update_profile(|p| {
                p.space_id = Some(space_id.clone());
                p.token = None;
                p.token_expires_at = None;
            })?;
            if opts.json {
                output::json(&json!({
                    "space_id": space_id,
                    "created_at": answer.body["created_at"],
                    "profile": client.profile_name,
                    "credentials": client.credentials_path(),
                }));
            } else {
                println!("{space_id}");
                eprintln!(
                    "Space created. Its ID is shown only this once; it is saved in {} (profile {:?}).\n\
                     Next: reeve login",
                    client.credentials_path().display(),
                    client.profile_name
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub async fn login(client: &mut Client, opts: &ClientOpts, args: LoginArgs) -> Result<ExitCode, ClientError> {
    if let Some(space_id) = args.space_id {
        client.update_profile(|p| {
            if p.space_id.as_deref() != Some(space_id.as_str()) {
                p.token = None;
                p.token_expires_at = None;
            }
            p.space_id = Some(space_id);
        })?;
    }
    let answer = client.login().await?;
    if opts.json {
        output::json(&json!({
            "token": answer.body["token"],
            "expires_at": answer.body["expires_at"],
            "profile": client.profile_name,
        }));
    } else {
        eprintln!(
            "Logged in to {}; the session lasts until {} and renews by itself.",
            client.endpoint,
            answer.body["expires_at"].as_str().unwrap_or("?")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn catalog(client: &mut Client, opts: &ClientOpts) -> Result<ExitCode, ClientError> {
    let answer = client.public(Method::GET, "/v1/catalog", None).await?;
    if opts.json {
        output::json(&answer.body);
        return Ok(ExitCode::SUCCESS);
    }
    let assets = answer.body["assets"].as_array().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    for task in answer.body["tasks"].as_array().cloned().unwrap_or_default() {
        let kind = task["kind"].as_str().unwrap_or_default().to_owned();
        let title = task["title"].as_str().unwrap_or_default().to_owned();
        let prices = task["prices"].as_array().cloned().unwrap_or_default();
        if prices.is_empty() {
            rows.push(vec![kind, title, "free".into(), "-".into(), "-".into(), "free".into()]);
            continue;
        }
        for price in prices {
            let asset_id = price["asset"].as_str().unwrap_or_default();
            let decimals = assets
                .iter()
                .find(|a| a["id"].as_str() == Some(asset_id))
                .and_then(|a| a["decimals"].as_u64())
                .unwrap_or(0) as u32;
            let atomic = price["amount"].as_str().unwrap_or_default();
            rows.push(vec![
                kind.clone(),
                title.clone(),
                output::human_amount(atomic, decimals),
                atomic.to_owned(),
                asset_id.to_owned(),
                "priced".into(),
            ]);
        }
    }
    println!("{}", table(&["KIND", "TITLE", "PRICE", "ATOMIC", "ASSET", "FREE/PRICED"], &rows));
    Ok(ExitCode::SUCCESS)
}

/// The content type a file is uploaded as, from its extension.
fn guess_content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("txt" | "md" | "csv" | "log") => "text/plain",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        _ => "application/octet-stream",
    }
}

/// Presigns, PUTs the file with a progress bar, and answers its upload id.
pub(super) async fn upload_file(
    client: &mut Client,
    path: &Path,
    content_type: Option<&str>,
    quiet: bool,
) -> Result<Value, ClientError> {
    let local = |e: std::io::Error| ClientError::Usage(format!("cannot read {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(local)?;
    if !meta.is_file() {
        return Err(ClientError::Usage(format!("{} is not a file", path.display())));
    }
    let size = meta.len();
    let filename = path.file_name().and_then(|n| n.to_str()).unwrap_or("upload").to_owned();
    let content_type = content_type.unwrap_or_else(|| guess_content_type(path)).to_owned();
    let body = json!({ "filename": filename, "content_type": content_type, "size": size });
    let presigned = client.authed(Method::POST, "/v1/uploads", Some(&body), &[]).await?.body;
    let url = presigned["url"].as_str().unwrap_or_default().to_owned();

    let file = std::fs::File::open(path).map_err(local)?;
    let progress = bar(size, quiet);
    progress.set_message(filename.clone());
    let chunks = futures_util::stream::unfold((file, progress.clone()), |(mut file, progress)| async move {
        use std::io::Read;
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                progress.inc(n as u64);
                Some((Ok::<_, std::io::Error>(buf), (file, progress)))
            }
            Err(e) => Some((Err(e), (file, progress))),
        }
    });
    // The URL is signed for these exact headers, the length included.
    let mut put = client.http.put(&url).header("content-length", size).body(reqwest::Body::wrap_stream(chunks));
    for (name, value) in presigned["headers"].as_object().cloned().unwrap_or_default() {
        if !name.eq_ignore_ascii_case("content-length") {
            put = put.header(name, value.as_str().unwrap_or_default());
        }
    }
    let response = put.send().await.map_err(|e| ClientError::Unreachable {
        endpoint: url.split('?').next().unwrap_or_default().to_owned(),
        cause: e.to_string(),
    })?;
    if !response.status().is_success() {
        progress.abandon();
        let status = response.status().as_u16();
        let text: String = response.text().await.unwrap_or_default().chars().take(300).collect();
        return Err(ClientError::Refused { status, code: "upload_failed".into(), message: text });
    }
    progress.finish_and_clear();
    Ok(json!({
        "upload_id": presigned["upload_id"],
        "filename": filename,
        "content_type": content_type,
        "size": size,
    }))
}

pub async fn upload(client: &mut Client, opts: &ClientOpts, args: UploadArgs) -> Result<ExitCode, ClientError> {
    let uploaded = upload_file(client, &args.file, args.content_type.as_deref(), opts.json).await?;
    if opts.json {
        output::json(&uploaded);
    } else {
        println!("{}", uploaded["upload_id"].as_str().unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a failed command's error: the server's code and message, the
/// payment requirements for a `402`, or the local problem. With `--json`,
/// the same as one JSON document on stdout.
pub async fn report(client: Option<&Client>, opts: &ClientOpts, error: &ClientError) {
    if opts.json {
        output::json(&error.to_json());
        return;
    }
    match error {
        ClientError::PaymentRequired(challenge) => {
            let catalog = match client {
                Some(client) => {
                    client.public(Method::GET, "/v1/catalog", None).await.map(|a| a.body).unwrap_or(Value::Null)
                }
                None => Value::Null,
            };
            eprintln!("{}", payment_required::describe(challenge, &catalog));
        }
        ClientError::Refused { code, message, .. } => eprintln!("error: {message} ({code})"),
        other => eprintln!("error: {other}"),
    }
}
