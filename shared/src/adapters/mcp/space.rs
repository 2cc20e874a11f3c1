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
use super::server::Anyone;
use super::tools::{FixedTool, NoArguments};
use crate::domain::catalog::Catalog;
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
pub struct CreateSpace;

impl FixedTool for CreateSpace {
    const NAME: &'static str = "create_space";
    const READ_ONLY: bool = false;
    type Caller = Anyone;
    type Args = NoArguments;

    fn description(_: &Catalog) -> String {
        "Create a Space: the account-free identity your tasks, uploads and payments belong \
         to. Answers a fresh 20-digit space_id, shown once (keep it: it is the only way back in), and a \
         session token for it. Send the token as `Authorization: Bearer <token>` on every other call."
            .into()
    }

    fn input_schema() -> Value {
        json!({ "type": "object", "properties": {}, "additionalProperties": false })
    }

    fn output_schema() -> Value {
        let string = json!({ "type": "string" });
        json!({
            "type": "object",
            "properties": { "space_id": string, "token": string, "token_type": string,
                "expires_at": string, "created_at": string },
            "required": ["space_id", "token", "token_type", "expires_at", "created_at"]
        })
    }

    async fn call(ctx: &McpContext, caller: Anyone, _: NoArguments) -> ToolResult<Value> {
        spend(ctx, caller.client, Action::Space).await?;
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
}

/// A session on a Space the caller names by its Space ID.
pub struct Login;

#[derive(Deserialize)]
pub struct LoginArgs {
    space_id: String,
}

impl FixedTool for Login {
    const NAME: &'static str = "login";
    const READ_ONLY: bool = false;
    type Caller = Anyone;
    type Args = LoginArgs;

    fn description(_: &Catalog) -> String {
        "Open a session on a Space: trade its space_id for a session token (valid 15 minutes), \
         sent as `Authorization: Bearer <token>`. Call it again when a tool says the token expired."
            .into()
    }

    fn input_schema() -> Value {
        json!({
            "type": "object",
            "properties": { "space_id": { "type": "string", "pattern": "^[0-9]{20}$",
                "description": "The 20-digit Space ID from create_space." } },
            "required": ["space_id"],
            "additionalProperties": false
        })
    }

    fn output_schema() -> Value {
        let string = json!({ "type": "string" });
        json!({
            "type": "object",
            "properties": { "token": string, "token_type": string, "expires_at": string },
            "required": ["token", "token_type", "expires_at"]
        })
    }

    async fn call(ctx: &McpContext, caller: Anyone, args: LoginArgs) -> ToolResult<Value> {
        spend(ctx, caller.client, Action::Session).await?;
        let session = spaces::open_session(&ctx.db, &ctx.pepper, &ctx.token_key, &ctx.argon2, &args.space_id).await?;
        Ok(json!({ "token": session.token, "token_type": "Bearer", "expires_at": rfc3339(session.expires_at) }))
    }
}
