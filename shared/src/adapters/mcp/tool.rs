//! What an MCP tool that is not a kind is: one [`FixedTool`] item that
//! declares everything MCP shows or checks of it (its name, description,
//! schemas, who may call it) beside its handler, as an HTTP route keeps its
//! documentation on its handler. Each tool is a file in [`super::tools`],
//! registered there by its `mod` line and its line in the list.
//!
//! This file names no tool and no list of them: the tools import it, the
//! registry imports the tools, and the server imports the registry, so the
//! arrows between the files run one way.

use std::future::Future;
use std::net::IpAddr;

use futures_util::future::BoxFuture;
use rmcp::model::{Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::schema::{Priced, object, output_schema};
use crate::domain::auth::{SessionToken, SpaceIndex};
use crate::domain::catalog::Catalog;
use crate::domain::login_limits::Action;

/// A tool that is not a kind, declared in one place. Its implementor is a
/// unit struct named like the tool (`Login` for `login`).
pub trait FixedTool {
    /// Its name in `tools/list` and `tools/call`.
    const NAME: &'static str;
    /// Its `readOnlyHint`: true for a tool that changes nothing.
    const READ_ONLY: bool;
    /// Who calls it, as its handler takes them; this decides whether the
    /// call needs a session: [`SpaceIndex`] (a session's Space; a call
    /// without a valid token is refused before its arguments are read) or
    /// [`Anyone`] (no token, only the address the call came from), or
    /// [`Session`] (the session itself, and the address).
    type Caller: Caller;
    /// Its arguments, read once they have passed [`FixedTool::input_schema`]
    /// ([`NoArguments`] for a tool that takes none).
    type Args: DeserializeOwned + Send;

    /// What `tools/list` says it does; from the catalog where the catalog
    /// decides something it says (the upload limits).
    fn description(catalog: &Catalog) -> String;

    /// Its `inputSchema`; a call whose arguments fail it is refused with
    /// `invalid_arguments` before the handler runs.
    fn input_schema() -> Value;

    /// The schema of what it answers; its `outputSchema` is this or a tool
    /// error ([`output_schema`]).
    fn output_schema() -> Value;

    /// Its handler: one call into the domain, as the REST route makes it.
    fn call(ctx: &McpContext, caller: Self::Caller, args: Self::Args)
    -> impl Future<Output = ToolResult<Value>> + Send;
}

/// The arguments of a tool that takes none (its schema refuses any).
#[derive(Deserialize)]
pub struct NoArguments {}

/// What the server found of who makes a call: the session, checked only
/// for a tool whose [`Caller`] needs one, and the client's address.
pub struct Identity {
    pub session: Option<SessionToken>,
    pub client: Option<IpAddr>,
}

/// Who calls a tool, made from what the server found.
pub trait Caller: Sized + Send {
    /// Whether the server must find the call's session (and refuse a call
    /// without one) before the tool runs.
    const NEEDS_SESSION: bool;

    fn of(identity: Identity) -> ToolResult<Self>;
}

/// A session's Space: the tools that act on a Space's tasks and files.
impl Caller for SpaceIndex {
    const NEEDS_SESSION: bool = true;

    fn of(identity: Identity) -> ToolResult<SpaceIndex> {
        Ok(Session::of(identity)?.token.space)
    }
}

/// A session itself and the address the call came from: a tool that acts
/// on the session or the Space's credential (`rotate_space`), which spends
/// the address's budget as REST's route does.
pub struct Session {
    pub token: SessionToken,
    pub client: Anyone,
}

impl Caller for Session {
    const NEEDS_SESSION: bool = true;

    fn of(identity: Identity) -> ToolResult<Session> {
        let token = identity.session.ok_or_else(|| ToolFailure::internal("a session tool without a session"))?;
        Ok(Session { token, client: Anyone { client: identity.client } })
    }
}

/// A caller without a session: the tools that give one (`create_space`,
/// `login`), known only by the address the call came from.
pub struct Anyone {
    /// `None`: an address nobody knows.
    pub client: Option<IpAddr>,
}

impl Caller for Anyone {
    const NEEDS_SESSION: bool = false;

    fn of(identity: Identity) -> ToolResult<Anyone> {
        Ok(Anyone { client: identity.client })
    }
}

impl Anyone {
    /// Spends one `action` of the caller's address (an unknown address is
    /// not limited): the budget `POST /v1/spaces` and `POST /v1/sessions`
    /// spend ([`crate::domain::login_limits`]), so a Space made over MCP
    /// brings the same fresh quota of free work. Over the budget:
    /// `rate_limited` with `retry_after_seconds`, what REST says with `429`
    /// and `Retry-After`.
    pub async fn spend(&self, ctx: &McpContext, action: Action) -> ToolResult<()> {
        let Some(client) = self.client else {
            return Ok(());
        };
        ctx.limits.spend(&ctx.db, client, action).await?.map_err(|limited| ToolFailure::refused(&limited))
    }
}

/// A [`FixedTool`] without its type, as the registry lists it
/// ([`registered`]) and the server calls it.
#[derive(Clone, Copy)]
pub struct Registered {
    pub name: &'static str,
    /// [`Caller::NEEDS_SESSION`] of its caller.
    pub needs_session: bool,
    /// The tool as `tools/list` shows it.
    pub listed: fn(&Catalog) -> Tool,
    /// Its arguments read (they have passed its input schema) and its
    /// handler run.
    pub call: for<'a> fn(&'a McpContext, Identity, Value) -> BoxFuture<'a, ToolResult<Value>>,
}

/// `T`'s line in the registry.
pub const fn registered<T: FixedTool>() -> Registered {
    Registered { name: T::NAME, needs_session: T::Caller::NEEDS_SESSION, listed: listed::<T>, call: call::<T> }
}

fn listed<T: FixedTool>(catalog: &Catalog) -> Tool {
    Tool::new(T::NAME, T::description(catalog), object(T::input_schema()))
        .with_raw_output_schema(object(output_schema(T::output_schema(), Priced::No)))
        .with_annotations(ToolAnnotations::new().read_only(T::READ_ONLY))
}

fn call<T: FixedTool>(ctx: &McpContext, identity: Identity, arguments: Value) -> BoxFuture<'_, ToolResult<Value>> {
    Box::pin(async move {
        let caller = T::Caller::of(identity)?;
        let args = serde_json::from_value(arguments)
            .map_err(|e| ToolFailure::new("invalid_arguments", format!("{} arguments: {e}", T::NAME)))?;
        T::call(ctx, caller, args).await
    })
}
