//! `rotate_space`: a new Space ID for the session's Space, as `POST
//! /v1/space/rotate` gives one.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::ToolResult;
use crate::adapters::mcp::rfc3339;
use crate::adapters::mcp::tool::{FixedTool, Session};
use crate::domain::catalog::Catalog;
use crate::domain::login_limits::Action;
use crate::domain::spaces;

pub struct RotateSpace;

#[derive(Deserialize)]
pub struct RotateArgs {
    space_id: String,
}

impl FixedTool for RotateSpace {
    const NAME: &'static str = "rotate_space";
    const READ_ONLY: bool = false;
    type Caller = Session;
    type Args = RotateArgs;

    fn description(_: &Catalog) -> String {
        "Replace the Space ID, for one that may have leaked: send the current space_id as a second factor. The \
         answer holds the new Space ID, shown this once (keep it: it is the only credential), and a new session \
         token. The old ID stops working and every earlier session ends at once; the Space's tasks, uploads, \
         payments and credits stay with it. Spends the same budget as create_space."
            .into()
    }

    fn input_schema() -> Value {
        crate::adapters::mcp::schema::space_id_input("The Space's current 20-digit Space ID.")
    }

    fn output_schema() -> Value {
        let string = json!({ "type": "string" });
        json!({
            "type": "object",
            "properties": { "space_id": string, "token": string, "token_type": string, "expires_at": string },
            "required": ["space_id", "token", "token_type", "expires_at"]
        })
    }

    async fn call(ctx: &McpContext, caller: Session, args: RotateArgs) -> ToolResult<Value> {
        caller.client.spend(ctx, Action::Space).await?;
        let rotated =
            spaces::rotate(&ctx.db, &ctx.pepper, &ctx.token_key, &ctx.argon2, &caller.token, &args.space_id).await?;
        tracing::info!(space = %caller.token.space.to_hex(), "space id rotated over MCP");
        Ok(json!({
            "space_id": rotated.space_id.as_str(),
            "token": rotated.session.token,
            "token_type": "Bearer",
            "expires_at": rfc3339(rotated.session.expires_at),
        }))
    }
}
