//! `create_space`: an identity and a session without leaving MCP, as
//! `POST /v1/spaces` gives them.

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::ToolResult;
use crate::adapters::mcp::rfc3339;
use crate::adapters::mcp::tool::{Anyone, FixedTool, NoArguments};
use crate::domain::catalog::Catalog;
use crate::domain::login_limits::Action;
use crate::domain::{auth, spaces};

pub struct CreateSpace;

impl FixedTool for CreateSpace {
    const NAME: &'static str = "create_space";
    const READ_ONLY: bool = false;
    type Caller = Anyone;
    type Args = NoArguments;

    fn description(_: &Catalog) -> String {
        "Create a Space: the account-free identity your tasks, uploads and payments belong to. Answers a fresh \
         20-digit space_id, shown once (keep it: it is the only way back in), and a session token for it. Send the \
         token as `Authorization: Bearer <token>` on every other call."
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

    /// A fresh Space, and a session on it: the Space ID is shown this once.
    /// The token is issued from the new Space's index directly, so creating
    /// a Space costs one Argon2id run (its hash), not a second to verify it.
    async fn call(ctx: &McpContext, caller: Anyone, _: NoArguments) -> ToolResult<Value> {
        caller.spend(ctx, Action::Space).await?;
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
