//! `create_space` and `login`: how an agent gets an identity and a session
//! without leaving MCP. Neither needs a token.

use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::context::McpContext;
use super::failure::ToolResult;
use super::rfc3339;
use crate::domain::{auth, spaces};

/// A fresh Space, and a session on it: the Space ID is shown this once.
/// The token is issued from the new Space's index directly, so creating a
/// Space costs one Argon2id run (its hash), not a second to verify it.
pub async fn create(ctx: &McpContext) -> ToolResult<Value> {
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

pub async fn login(ctx: &McpContext, args: Login) -> ToolResult<Value> {
    let session = spaces::open_session(&ctx.db, &ctx.pepper, &ctx.token_key, &ctx.argon2, &args.space_id).await?;
    Ok(json!({ "token": session.token, "token_type": "Bearer", "expires_at": rfc3339(session.expires_at) }))
}
