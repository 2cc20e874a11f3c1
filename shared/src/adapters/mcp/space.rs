//! `create_space` and `login`: how an agent gets an identity and a session
//! without leaving MCP. Neither needs a token, so both spend the client
//! address's budget first, the one `POST /v1/spaces` and `POST /v1/sessions`
//! spend ([`crate::domain::login_limits`]): a Space made here brings the
//! same fresh quota of free work.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::rfc3339;
use crate::domain::login_limits::Action;
use crate::domain::{auth, spaces};

/// Spends one `action` of `client` (`None`: an address nobody knows, not
/// limited). Over the budget: `rate_limited` with `retry_after_seconds`,
/// what REST says with `429` and `Retry-After`.
async fn spend(ctx: &McpContext, client: Option<IpAddr>, action: Action) -> ToolResult<()> {
    let Some(client) = client else {
        return Ok(());
    };
    ctx.limits.spend(&ctx.db, client, action).await?.map_err(|limited| ToolFailure::refused(&limited))
}

/// A fresh Space, and a session on it: the Space ID is shown this once.
/// The token is issued from the new Space's index directly, so creating a
/// Space costs one Argon2id run (its hash), not a second to verify it.
pub async fn create(ctx: &McpContext, client: Option<IpAddr>) -> ToolResult<Value> {
    spend(ctx, client, Action::Space).await?;
    let space = spaces::create(&ctx.db, &ctx.pepper, &ctx.argon2).await?;
    let idx = auth::space_index(&ctx.pepper, &space.space_id);
    let (token, expires_at) = auth::issue_token(&ctx.token_key, &idx, OffsetDateTime::now_utc());
    tracing::info!("space created over MCP");
    Ok(json!({
        "space_id": space.space_id.as_str(),
        "token": token,
        "token_type": "Bearer",
        "expires_at": rfc3339(expires_at),
        "created_at": rfc3339(space.created_at),
    }))
}

#[derive(Deserialize)]
pub struct Login {
    space_id: String,
}

pub async fn login(ctx: &McpContext, client: Option<IpAddr>, args: Login) -> ToolResult<Value> {
    spend(ctx, client, Action::Session).await?;
    let session = spaces::open_session(&ctx.db, &ctx.pepper, &ctx.token_key, &ctx.argon2, &args.space_id).await?;
    Ok(json!({ "token": session.token, "token_type": "Bearer", "expires_at": rfc3339(session.expires_at) }))
}
