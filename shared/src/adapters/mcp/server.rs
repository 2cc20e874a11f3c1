//! [`ReeveMcp`]: rmcp's `ServerHandler`, one per request (the endpoint is
//! stateless), each a clone of the one made with the endpoint, which holds
//! the tool list. It finds the tool in the registry ([`super::tools`]), the
//! caller's Space (from `Authorization: Bearer`), the payment (from
//! `_meta`), and hands each call to its tool: a fixed tool's own handler, or
//! a kind's [`kind::run`].
//!
//! Tasks extension (`io.modelcontextprotocol/tasks`): a client that declares
//! it gets a task handle from a kind's tool instead of waiting, and
//! `tasks/get` and `tasks/cancel` read and stop the task. The handle's id is
//! Reeve's task id and every answer comes from the task's row, so any
//! instance answers for any task, whoever created it.

use std::sync::Arc;

use axum::http::{header, request::Parts};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult, DetailedTask,
    ErrorData, GetTaskParams, GetTaskResult, Implementation, JsonObject, ListToolsResult, MetaObject,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Task as McpTask, TaskPayload, TaskStatus as McpStatus,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use tracing::Instrument;

use super::context::McpContext;
use super::elicit::{self, Before};
use super::failure::{ToolFailure, ToolResult};
use super::kind::{self, Answer, KindCall};
use super::task::{self, TaskRef};
use super::tool::{FixedTool, Identity};
use super::tools::{CancelTask, Fixed, Named, Tools};
use super::wait::Progress;
use super::{payment, rfc3339};
use crate::domain::auth::{SessionToken, SpaceIndex};
use crate::domain::error::{TaskRefusal, TokenRefusal};
use crate::domain::payments::{self, offer_receipt};
use crate::domain::sessions::{self, SessionRefused};
use crate::domain::tasks::{self, Task, TaskStatus};

/// How often a client holding a task handle should poll `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1000;

#[derive(Clone)]
pub struct ReeveMcp {
    ctx: Arc<McpContext>,
    tools: Arc<Tools>,
}

impl ReeveMcp {
    /// The server of one endpoint, its tool list built from the catalog
    /// here, once; every request is served by a clone.
    pub fn new(ctx: Arc<McpContext>) -> ReeveMcp {
        let tools = Arc::new(Tools::new(&ctx.catalog));
        ReeveMcp { ctx, tools }
    }

    /// The Space of the request's session token. A missing, expired or
    /// ended token (logout, a rotation of the Space ID) is a tool error that
    /// says which tool gives one, not a transport failure: the model reads
    /// it and calls `login`.
    async fn session(&self, context: &RequestContext<RoleServer>) -> ToolResult<SessionToken> {
        let headers = context.extensions.get::<Parts>().map(|parts| &parts.headers);
        let Some(value) = headers.and_then(|h| h.get(header::AUTHORIZATION)) else {
            return Err(ToolFailure::refused_saying(
                &TokenRefusal::Missing,
                "this tool needs a session: call create_space (a new Space) or login (with your Space ID) for a \
                 token, and send it as the header `Authorization: Bearer <token>`",
                None,
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.trim_start().split_once(' '))
            .filter(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
            .map(|(_, token)| token.trim());
        let invalid = || {
            ToolFailure::refused_saying(
                &TokenRefusal::Invalid,
                "the session token is invalid, has expired (a token lasts 15 minutes) or was ended: call login \
                 with your Space ID for a new one, and send it as `Authorization: Bearer <token>`",
                None,
            )
        };
        let token = token.ok_or_else(invalid)?;
        match sessions::check_session(&self.ctx.db, &self.ctx.token_key, token, OffsetDateTime::now_utc()).await {
            Ok(session) => Ok(session),
            Err(SessionRefused::Db(e)) => Err(e.into()),
            Err(_) => Err(invalid()),
        }
    }

    /// A fixed tool's call: the session first where the tool needs one (a
    /// call without it is refused before its arguments are read), then its
    /// arguments against its schema, then its handler.
    async fn fixed(
        &self,
        tool: &Fixed,
        arguments: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> ToolResult<Value> {
        let session = if tool.needs_session() { Some(self.session(context).await?) } else { None };
        let arguments = Value::Object(arguments);
        tool.check(&arguments)?;
        tool.call(&self.ctx, Identity { session, client: client_of(&self.ctx, context) }, arguments).await
    }

    /// A kind's tool. A call without a payment from a client that pays by
    /// link (or that sends a pay link's `requestState` back) meets its pay
    /// link first ([`elicit`]): a paid one answers its task, under its key;
    /// an unpaid one is asked again; none, and a payment is required, makes
    /// one. Every other call is [`kind::run`] as it is.
    async fn kind(
        &self,
        (listed, kind): (&Tool, &str),
        arguments: Map<String, Value>,
        (request_meta, named_id): (Option<&Value>, Option<&Value>),
        request_state: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, Refused> {
        let space = self.session(context).await?.space;
        let payment = payment::from_meta(request_meta)?;
        let mut key = payment::identifier_key(payment.as_deref(), named_id)?;
        let by_link = payment.is_none()
            && key.is_none()
            && (request_state.is_some() || elicit::declared(&self.ctx, context).pays_by_link());
        let spec = self.ctx.catalog.task(kind).ok_or_else(|| ToolFailure::internal("a tool names no kind"))?;
        let input = by_link.then(|| kind::task_input(spec, &arguments));
        if let Some(input) = &input {
            match elicit::before_call(&self.ctx, &space, kind, input, request_state).await? {
                Before::Paid(link) => key = Some(link.key),
                Before::Unpaid(link) => {
                    return elicit::ask(&self.ctx, context, listed, &link).map_err(Refused::Protocol);
                }
                Before::Nothing => {}
            }
        }
        let as_task = context.client_capabilities().is_some_and(|caps| caps.supports_tasks());
        let answer = if as_task {
            // A task handle answers at once; the client polls tasks/get.
            Answer::Handle
        } else {
            let token = context.meta.get_progress_token().filter(|_| self.ctx.settings.progress);
            Answer::Wait(token.map(|token| Progress { peer: context.peer.clone(), token }))
        };
        let invocation =
            context.extensions.get::<Parts>().and_then(|parts| parts.extensions.get::<lambda_http::Context>());
        let deadline = invocation.map(crate::domain::tasks::deadline_of);
        let call = KindCall { listed, kind, arguments, key };
        let created = match kind::run(&self.ctx, &space, call, payment.as_deref(), deadline, answer).await {
            Ok(created) => created,
            // Unpaid and no credit: a link to pay it, instead of the
            // requirements this client cannot sign.
            Err(ToolFailure::Payment { code: PAYMENT_REQUIRED_CODE, challenge }) if input.is_some() => {
                let input = input.as_ref().expect("checked");
                let link = elicit::issue(&self.ctx, &space, kind, input, &challenge).await?;
                return elicit::ask(&self.ctx, context, listed, &link).map_err(Refused::Protocol);
            }
            Err(failure) => return Err(failure.into()),
        };
        let mut settlement = created.settlement;
        // A call that waited for the end answers the final receipt, with its
        // proof of delivery, as `tasks/get` does; not only the create's.
        if !as_task
            && created.task.status.is_terminal()
            && let Some(meta) = settlement.take()
        {
            settlement = Some(self.with_final_receipt(meta, &space, &created.task).await?);
        }
        let meta = settlement.map(meta_object);
        if as_task {
            let mut handle = CreateTaskResult::new(mcp_task(&created.task));
            if let Some(meta) = meta {
                handle = handle.with_meta(meta);
            }
            return Ok(CallToolResponse::Task(handle));
        }
        Ok(CallToolResponse::Complete(task_result(created.task).with_meta(meta)))
    }
}

/// The code of a call that must be paid and was sent no payment.
const PAYMENT_REQUIRED_CODE: &str = "payment_required";

/// How a kind's call ends without a result: a tool error (the model reads
/// it), or a JSON-RPC error (the `-32042` that asks for a pay link).
enum Refused {
    Tool(ToolFailure),
    Protocol(ErrorData),
}

impl From<ToolFailure> for Refused {
    fn from(failure: ToolFailure) -> Refused {
        Refused::Tool(failure)
    }
}

/// The address the call came from: the HTTP request's transport, or behind
/// the CloudFront edge the viewer it vouches for, as on REST.
fn client_of(ctx: &McpContext, context: &RequestContext<RoleServer>) -> Option<std::net::IpAddr> {
    let parts = context.extensions.get::<Parts>()?;
    crate::infra::client_addr::client_behind(ctx.limits.edge.as_ref(), &parts.headers, &parts.extensions)
}

fn meta_object(value: Value) -> MetaObject {
    match value {
        Value::Object(map) => MetaObject(map),
        _ => MetaObject::new(),
    }
}

/// A task as a tool result: an error when it ended without doing its work.
fn task_result(task: Task) -> CallToolResult {
    let failed = matches!(task.status, TaskStatus::Failed | TaskStatus::Canceled);
    let view = task::view(task);
    if failed {
        CallToolResult::structured_error(view)
    } else {
        task::with_file_links(CallToolResult::structured(view))
    }
}

/// Reeve's task as the tasks extension's `Task`.
fn mcp_task(task: &Task) -> McpTask {
    let status = match task.status {
        TaskStatus::Queued | TaskStatus::Running => McpStatus::Working,
        // A task that failed is a tool call that answered isError: `completed`
        // in the extension's terms; its result says what went wrong.
        TaskStatus::Completed | TaskStatus::Failed => McpStatus::Completed,
        TaskStatus::Canceled => McpStatus::Cancelled,
    };
    let mut handle = McpTask::new(task.id.to_string(), status, rfc3339(task.created_at), rfc3339(task.updated_at))
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    // A task its Space's limit holds back says why, as its view does.
    let waiting = task.waiting.as_ref().and_then(|w| w["message"].as_str());
    handle.status_message = Some(match waiting {
        Some(why) if task.status == TaskStatus::Queued => format!("queued: {why}"),
        _ => format!("{} ({:.0}%)", task.status.as_str(), task.progress * 100.0),
    });
    handle
}

impl ReeveMcp {
    /// A paid task's settlement `_meta` with its final signed receipt (the
    /// one `GET /v1/tasks/{id}/receipt` answers, with its proof of delivery:
    /// the result's and each output file's SHA-256) in its `offer-receipt`
    /// extension, where a paid call's first receipt was; as it is where the
    /// deployment signs no receipts.
    async fn with_final_receipt(&self, mut meta: Value, space: &SpaceIndex, task: &Task) -> ToolResult<Value> {
        let Some(key) = self.ctx.seller.as_deref() else { return Ok(meta) };
        // The receipt names the resource the payment was recorded with; a
        // payment recorded before Reeve kept it names the tool (`task_<kind>`
        // where a fixed tool has the kind's name).
        let tool = match self.tools.find(&task.kind) {
            Some(Named::Kind { .. }) => task.kind.clone(),
            _ => format!("task_{}", task.kind),
        };
        let signed =
            match tasks::signed_receipt(&self.ctx.db, Some(key), space, task.id, &|_| payment::resource_url(&tool))
                .await
            {
                Ok(signed) => signed,
                Err(tasks::ReceiptError::Db(e)) => return Err(e.into()),
                // The task's own answer goes out without its receipt, which
                // `GET /v1/tasks/{id}/receipt` answers once KMS signs again.
                Err(e) => {
                    tracing::warn!(task_id = %task.id, error = %e, "the final receipt could not be signed");
                    None
                }
            };
        if let Some(Ok(receipt)) = signed
            && let Some(settlement) = meta.get_mut(payment::PAYMENT_RESPONSE_META).and_then(Value::as_object_mut)
        {
            let extensions = settlement.entry("extensions").or_insert_with(|| json!({}));
            extensions[offer_receipt::OFFER_RECEIPT] = offer_receipt::receipt_extension(&receipt);
        }
        Ok(meta)
    }
}

/// Reeve's task as `tasks/get` answers it: once it has ended, its final
/// result is the tool result the call would have answered had it waited,
/// with the receipt of the payment that bought it (`None`: free, paid with
/// a credit, or metered and not charged) as `_meta`, as on the handle.
fn detailed(task: Task, receipt: Option<Value>) -> DetailedTask {
    let handle = mcp_task(&task);
    let payload = match handle.status {
        McpStatus::Completed => {
            let meta = receipt.map(meta_object);
            let result = serde_json::to_value(task_result(task).with_meta(meta)).expect("results serialise");
            TaskPayload::Completed { result: as_object(result) }
        }
        McpStatus::Cancelled => TaskPayload::Cancelled,
        _ => TaskPayload::Working,
    };
    DetailedTask::new(handle, payload)
}

fn as_object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// A `tasks/*` failure: the extension's methods answer JSON-RPC errors, with
/// the tool failure's code in `data`.
fn task_method_error(failure: ToolFailure) -> McpError {
    let message = match &failure {
        ToolFailure::Refused { message, .. } => message.clone(),
        ToolFailure::Payment { .. } => "payment required".to_owned(),
    };
    ErrorData::invalid_params(message, Some(json!({ "code": failure.code() })))
}

impl ServerHandler for ReeveMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("reeve", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Reeve runs jobs and sells them per task, with no account. Call create_space once (keep the \
                 space_id), then send its token as `Authorization: Bearer <token>`; login renews it. Upload files \
                 with create_upload, then call a task's tool. Priced tools are paid with x402: an unpaid call \
                 answers the payment requirements, and the call is repeated with the payment in \
                 _meta[\"x402/payment\"]. A client without x402 that declares URL elicitation is given a pay link \
                 for a person to pay in a browser wallet; calling again answers the task paid there.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.list().to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        // The one call that is not a tool result: there is no tool to answer.
        let Some(named) = self.tools.find(name) else {
            return Err(ErrorData::invalid_params(
                format!("no tool named {name:?}; tools/list lists them"),
                Some(json!({ "code": "unknown_tool" })),
            ));
        };
        let arguments = request.arguments.clone().unwrap_or_default();
        let answer = async {
            match named {
                Named::Fixed(tool) => {
                    let answer = self.fixed(tool, arguments, &context).await;
                    answer.map(|v| task::with_file_links(CallToolResult::structured(v)).into()).map_err(Refused::Tool)
                }
                Named::Kind { kind, listed } => {
                    // rmcp hands the request's `_meta` over in the context.
                    let meta =
                        |key: &str| context.meta.get(key).or_else(|| request.meta.as_ref().and_then(|m| m.get(key)));
                    let paid = (meta(payment::PAYMENT_META), meta(payment::IDENTIFIER_META));
                    let state = request.request_state.as_deref();
                    self.kind((listed, kind), arguments, paid, state, &context).await
                }
            }
        }
        .instrument(tracing::info_span!("mcp_tool", tool = %name))
        .await;
        match answer {
            Ok(answer) => Ok(answer),
            Err(Refused::Protocol(error)) => {
                tracing::info!(tool = %name, code = error.code.0, "tool answered with a pay link");
                Err(error)
            }
            Err(Refused::Tool(failure)) => {
                tracing::info!(tool = %name, code = failure.code(), "tool refused");
                Ok(failure.into_result().into())
            }
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let space = self.session(&context).await.map_err(task_method_error)?.space;
        let not_found = || task_method_error(ToolFailure::from(TaskRefusal::NotFound));
        let id = request.task_id.parse().map_err(|_| not_found())?;
        let task = tasks::find_for_space(&self.ctx.db, &space, id)
            .await
            .map_err(|e| task_method_error(ToolFailure::from(e)))?
            .ok_or_else(not_found)?;
        let task = self.ctx.links().present(&space, task).await;
        // Read from the same store as the task, so a final result never
        // misses the receipt its call was answered with.
        let receipt = match mcp_task(&task).status {
            // A metered task's own record has the amount it was charged.
            McpStatus::Completed => match task.payment.as_ref().and_then(payment::metered_response_meta) {
                Some(charged) => Some(charged),
                None => payments::receipt(&self.ctx.db, task.id)
                    .await
                    .map_err(|e| task_method_error(ToolFailure::from(e)))?
                    .map(|receipt| payment::response_meta(&receipt)),
            },
            _ => None,
        };
        let receipt = match receipt {
            Some(meta) => Some(self.with_final_receipt(meta, &space, &task).await.map_err(task_method_error)?),
            None => None,
        };
        Ok(GetTaskResult::new(detailed(task, receipt)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let space = self.session(&context).await.map_err(task_method_error)?.space;
        // `cancel_task`'s own handler, so both ways to cancel answer alike.
        match CancelTask::call(&self.ctx, space, TaskRef { task_id: request.task_id }).await {
            // Cooperative: a finished task has nothing left to cancel.
            Ok(_) => Ok(()),
            Err(failure) if failure.code() == TaskRefusal::FINISHED => Ok(()),
            Err(failure) => Err(task_method_error(failure)),
        }
    }
}
