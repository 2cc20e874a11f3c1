//! The Space's commands, as `reeve --help` groups them: `space` (create,
//! show, rotate), `login`, `logout` and `catalog`. Each turns its arguments into requests
//! through [`Client`] and prints the answer, as JSON with `--json`.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use super::output::{self, table};
use super::{Client, ClientError, ClientOpts};

#[derive(Subcommand, Debug)]
pub enum SpaceCommand {
    /// Create a Space; prints its ID once and keeps it in the credentials file.
    Create,
    /// The Space's payments, credits and free-task quotas (also what bare `reeve space` shows).
    Show,
    /// Give the Space a new ID (for one that may have leaked): prints it once
    /// and keeps it in the credentials file; the old ID and every session are
    /// ended at once, the tasks stay.
    Rotate,
    /// Make or rotate the Space's webhook signing secret; prints it once.
    WebhookSecret,
}

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// Log in to this Space (kept for next time); default: the profile's.
    #[arg(long, env = reeve_shared::settings::SPACE_ID, hide_env_values = true)]
    pub space_id: Option<String>,
}

/// `reeve space [create|show]`; `Err` is printed by [`super::report`].
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
        SpaceCommand::WebhookSecret => {
            let answer = client.authed(Method::POST, "/v1/space/webhook-secret", None, &[]).await?.body;
            if opts.json {
                output::json(&answer);
            } else {
                println!("{}", answer["secret"].as_str().unwrap_or_default());
                match answer["previous_expires_at"].as_str() {
                    Some(until) => eprintln!(
                        "Webhook secret rotated; shown only this once. The previous one keeps signing beside it \
                         until {until}."
                    ),
                    None => eprintln!("Webhook secret created; shown only this once. Verify deliveries with it."),
                }
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
        SpaceCommand::Rotate => rotate(client, opts).await,
    }
}

/// `reeve space rotate`: the profile's Space ID goes in the body, beside the
/// session, as the second factor the server asks for. The new ID and the
/// session the answer carries replace the old ones in the credentials file
/// before anything is printed; if the file cannot be written, the new ID is
/// printed all the same (to stderr), since the old one no longer opens the
/// Space.
async fn rotate(client: &mut Client, opts: &ClientOpts) -> Result<ExitCode, ClientError> {
    let Some(current) = client.profile().space_id else {
        return Err(ClientError::Usage(format!(
            "no Space ID for {}: run `reeve space create`, or `reeve login --space-id ID`",
            client.endpoint
        )));
    };
    let body = json!({ "space_id": current });
    let answer = client.authed(Method::POST, "/v1/space/rotate", Some(&body), &[]).await?.body;
    let space_id = answer["space_id"].as_str().unwrap_or_default().to_owned();
    let token = answer["token"].as_str().map(str::to_owned);
    let expires = answer["expires_at"]
        .as_str()
        .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok());
    let saved = client.update_profile(|p| {
        p.space_id = Some(space_id.clone());
        p.token = token;
        p.token_expires_at = expires;
    });
    if let Err(e) = saved {
        eprintln!("The Space's new ID is {space_id}: the old one no longer opens it. Keep it: {e}");
        return Err(e);
    }
    if opts.json {
        output::json(&json!({
            "space_id": space_id,
            "expires_at": answer["expires_at"],
            "profile": client.profile_name,
            "credentials": client.credentials_path(),
        }));
    } else {
        println!("{space_id}");
        eprintln!(
            "Space ID rotated. The new ID is shown only this once; it is saved in {} (profile {:?}).\n\
             The old ID opens nothing any more, and every other session of the Space has ended.",
            client.credentials_path().display(),
            client.profile_name
        );
    }
    Ok(ExitCode::SUCCESS)
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

/// `reeve logout`: ends the cached session on the server at once, not at its
/// expiry, and forgets its token. The Space ID stays: `reeve login` opens a
/// new session.
pub async fn logout(client: &mut Client, opts: &ClientOpts) -> Result<ExitCode, ClientError> {
    let ended = client.logout().await?;
    if opts.json {
        output::json(&json!({ "ended": ended, "profile": client.profile_name }));
    } else if ended {
        eprintln!("Logged out of {}: the session is ended.", client.endpoint);
    } else {
        eprintln!("No open session for {}; nothing to end.", client.endpoint);
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
