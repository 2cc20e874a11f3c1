//! `login`: a session on a Space the caller names by its Space ID, as
//! `POST /v1/sessions` opens it.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::ToolResult;
use crate::adapters::mcp::rfc3339;
use crate::adapters::mcp::tool::{Anyone, FixedTool};
use crate::domain::catalog::Catalog;
use crate::domain::login_limits::Action;
use crate::domain::spaces;

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
        "Open a session on a Space: trade its space_id for a session token (valid 15 minutes), sent as \
         `Authorization: Bearer <token>`. Call it again when a tool says the token expired."
            .into()
    }

    fn input_schema() -> Value {
        crate::adapters::mcp::schema::space_id_input("The 20-digit Space ID from create_space.")
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
        caller.spend(ctx, Action::Session).await?;
        let session = spaces::open_session(&ctx.db, &ctx.pepper, &ctx.token_key, &ctx.argon2, &args.space_id).await?;
        Ok(json!({ "token": session.token, "token_type": "Bearer", "expires_at": rfc3339(session.expires_at) }))
    }
}
