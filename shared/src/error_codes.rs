//! The one vocabulary of refusals (`domain/error.rs`), checked across both
//! transports: every variant of every domain error a client can meet gives
//! the same code over HTTP and over MCP, and each code is documented for
//! clients in the OpenAPI document and in the README's table of error
//! codes. It lives at the crate root, as `layers.rs` does, because it looks
//! at both adapters at once, which no adapter may.
//!
//! A variant added to one of these enums fails to compile in its
//! `every_*` below until it is listed there; a code added without its
//! documentation fails the test, and so does a row of the README's table
//! whose code nothing answers: neither a refusal here nor a code an adapter
//! names itself (`invalid_json`, `not_found`, the tools' own, …).

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::adapters::http::error::ApiError;
use crate::adapters::mcp::failure::ToolFailure;
use crate::domain::auth::AuthError;
use crate::domain::error::{TaskRefusal, TokenRefusal};
use crate::domain::executors::service::ReportRefusal;
use crate::domain::login_limits::{Action, Limited};
use crate::domain::pay_links::PayLinkRefusal;
use crate::domain::payments::challenge::Resource;
use crate::domain::payments::{PayError, PaymentRequired, PaymentResponse, UptoRefusal, batch};
use crate::domain::spaces::SpaceError;
use crate::domain::tasks::{Limit, QuotaExceeded, SubmitError, UploadProblem};
use crate::domain::uploads::CreateError;
use crate::domain::webhooks::WebhookRefusal;

fn challenge(error: &str) -> Box<PaymentRequired> {
    Box::new(PaymentRequired {
        x402_version: 2,
        error: error.to_owned(),
        resource: Resource { url: "/v1/tasks/fetch".into(), description: "fetch".into(), mime_type: "json".into() },
        accepts: Vec::new(),
        extensions: Default::default(),
    })
}

fn every_pay_error() -> Vec<PayError> {
    let settlement = PaymentResponse {
        success: false,
        error_reason: Some("insufficient_balance".into()),
        transaction: String::new(),
        network: "eip155:84532".into(),
        payer: String::new(),
        extensions: None,
        extra: None,
    };
    let mut all = vec![
        PayError::Required(challenge("PAYMENT-SIGNATURE header is required")),
        PayError::Malformed("not base64".into()),
        PayError::Mismatch(challenge("payment_mismatch")),
        PayError::Replayed(challenge("payment_replayed")),
        PayError::Invalid { challenge: challenge("payment_invalid"), reason: "expired".into() },
        PayError::Failed {
            challenge: challenge("payment_failed"),
            reason: "insufficient_balance".into(),
            settlement: Box::new(settlement),
        },
        PayError::NotSettled(challenge("payment_not_settled")),
        PayError::Pending { retry_after: Duration::from_secs(5) },
        PayError::InProgress,
        PayError::RequestInProgress,
        PayError::IdentifierConflict,
        PayError::IdempotencyConflict,
        PayError::FacilitatorUnavailable,
        PayError::ChainUnavailable,
        PayError::Db(sqlx::Error::PoolTimedOut),
        PayError::Db(sqlx::Error::RowNotFound),
    ];
    for refusal in UptoRefusal::ALL {
        all.push(PayError::Refused { challenge: challenge(refusal.code()), refusal, detail: "3 s left".into() });
    }
    for refusal in every_voucher_refusal() {
        all.push(PayError::Voucher { challenge: challenge(refusal.code()), refusal: Box::new(refusal) });
    }
    for e in &all {
        // No `_`: a new variant stops here until it is listed above.
        match e {
            PayError::Required(_)
            | PayError::Malformed(_)
            | PayError::Mismatch(_)
            | PayError::Replayed(_)
            | PayError::Invalid { .. }
            | PayError::Refused { .. }
            | PayError::Failed { .. }
            | PayError::NotSettled(_)
            | PayError::Pending { .. }
            | PayError::InProgress
            | PayError::RequestInProgress
            | PayError::IdentifierConflict
            | PayError::IdempotencyConflict
            | PayError::Voucher { .. }
            | PayError::FacilitatorUnavailable
            | PayError::ChainUnavailable
            | PayError::Db(_) => {}
        }
    }
    all
}

/// Every refusal of a batch-settlement voucher a client can be answered
/// (`Unread` never is: the escrow is read, or `chain_unavailable`).
fn every_voucher_refusal() -> Vec<batch::Refusal> {
    let state = batch::ChannelState {
        channel_id: format!("0x{}", "ab".repeat(32)),
        charged: 2_000,
        on_chain: batch::OnChain { balance: 4_000, total_claimed: 0, withdraw_requested_at: 0, refund_nonce: 0 },
    };
    let mut all: Vec<batch::Refusal> = ["receiver", "receiverAuthorizer", "token", "withdrawDelay", "channelId"]
        .into_iter()
        .map(batch::Refusal::WrongChannel)
        .collect();
    all.extend([
        batch::Refusal::Signature(batch::SignatureError::Malformed),
        batch::Refusal::NotNext { got: 1_000, expected: 3_000, state: state.clone() },
        batch::Refusal::AboveBalance { ceiling: 5_000, balance: 4_000, state: state.clone() },
        batch::Refusal::Withdrawing { at: 1_700_000_000, state },
    ]);
    for refusal in &all {
        match refusal {
            batch::Refusal::WrongChannel(_)
            | batch::Refusal::Signature(_)
            | batch::Refusal::NotNext { .. }
            | batch::Refusal::AboveBalance { .. }
            | batch::Refusal::Withdrawing { .. } => {}
            batch::Refusal::Unread => unreachable!("never answered"),
        }
    }
    all
}

fn every_submit_error() -> Vec<SubmitError> {
    let mut all = vec![
        SubmitError::UnknownTask("nope".into()),
        SubmitError::InputNotObject,
        SubmitError::InputNul("/name".into()),
        SubmitError::InvalidInput("/url: not a string".into()),
        SubmitError::IdempotencyConflict,
        SubmitError::StorageUnavailable,
        SubmitError::QueueUnavailable,
        SubmitError::QuotaExceeded(QuotaExceeded {
            kind: "digest".into(),
            limit: Limit::AtOnce(2),
            retry_after: Duration::from_secs(5),
        }),
        SubmitError::Db(sqlx::Error::PoolTimedOut),
        SubmitError::Internal("a fault".into()),
    ];
    for problem in [UploadProblem::Unknown, UploadProblem::NotReady, UploadProblem::Missing, UploadProblem::Rejected] {
        all.push(SubmitError::Upload { problem, message: "upload 01J at /upload_id".into() });
    }
    all.extend(every_pay_error().into_iter().map(SubmitError::Payment));
    for e in &all {
        match e {
            SubmitError::UnknownTask(_)
            | SubmitError::InputNotObject
            | SubmitError::InputNul(_)
            | SubmitError::InvalidInput(_)
            | SubmitError::IdempotencyConflict
            | SubmitError::Upload { .. }
            | SubmitError::StorageUnavailable
            | SubmitError::Payment(_)
            | SubmitError::QueueUnavailable
            | SubmitError::QuotaExceeded(_)
            | SubmitError::Db(_)
            | SubmitError::Internal(_) => {}
        }
    }
    all
}

fn every_upload_error() -> Vec<CreateError> {
    let all = vec![
        CreateError::InvalidFilename("filename is empty"),
        CreateError::InvalidSize,
        CreateError::TooLarge { size: 11, max_bytes: 10 },
        CreateError::UnsupportedContentType { allowed: vec!["image/png".into()] },
        CreateError::Storage("no credentials".into()),
        CreateError::Db(sqlx::Error::PoolClosed),
    ];
    for e in &all {
        match e {
            CreateError::InvalidFilename(_)
            | CreateError::InvalidSize
            | CreateError::TooLarge { .. }
            | CreateError::UnsupportedContentType { .. }
            | CreateError::Storage(_)
            | CreateError::Db(_) => {}
        }
    }
    all
}

fn every_space_error() -> Vec<SpaceError> {
    let all = vec![
        SpaceError::InvalidSpace,
        SpaceError::WrongSpaceId,
        SpaceError::Db(sqlx::Error::PoolTimedOut),
        SpaceError::Auth(AuthError::MalformedSpaceId),
    ];
    for e in &all {
        match e {
            SpaceError::InvalidSpace | SpaceError::WrongSpaceId | SpaceError::Db(_) | SpaceError::Auth(_) => {}
        }
    }
    all
}

fn every_login_limit() -> Vec<Limited> {
    let wait = Duration::from_secs(30);
    vec![Limited { action: Action::Space, retry_after: wait }, Limited { action: Action::Session, retry_after: wait }]
}

fn every_task_refusal() -> Vec<TaskRefusal> {
    let all = vec![TaskRefusal::NotFound, TaskRefusal::Finished("completed"), TaskRefusal::NoReceipt("why")];
    for e in &all {
        match e {
            TaskRefusal::NotFound | TaskRefusal::Finished(_) | TaskRefusal::NoReceipt(_) => {}
        }
    }
    all
}

fn every_webhook_refusal() -> Vec<WebhookRefusal> {
    let all = vec![
        WebhookRefusal::Invalid("the webhook URL must be https://".into()),
        WebhookRefusal::SecretRequired,
        WebhookRefusal::Db(sqlx::Error::PoolTimedOut),
    ];
    for e in &all {
        match e {
            WebhookRefusal::Invalid(_) | WebhookRefusal::SecretRequired | WebhookRefusal::Db(_) => {}
        }
    }
    all
}

fn every_pay_link_refusal() -> Vec<PayLinkRefusal> {
    let all = vec![
        PayLinkRefusal::Invalid,
        PayLinkRefusal::RequestState,
        PayLinkRefusal::Expired,
        PayLinkRefusal::Used,
        PayLinkRefusal::OtherSpace,
        PayLinkRefusal::InputChanged,
        PayLinkRefusal::PriceChanged,
        PayLinkRefusal::Db(sqlx::Error::PoolTimedOut),
    ];
    for e in &all {
        match e {
            PayLinkRefusal::Invalid
            | PayLinkRefusal::RequestState
            | PayLinkRefusal::Expired
            | PayLinkRefusal::Used
            | PayLinkRefusal::OtherSpace
            | PayLinkRefusal::InputChanged
            | PayLinkRefusal::PriceChanged
            | PayLinkRefusal::Db(_) => {}
        }
    }
    all
}

fn every_token_refusal() -> Vec<TokenRefusal> {
    let all = vec![
        TokenRefusal::Missing,
        TokenRefusal::Invalid,
        TokenRefusal::InUrl,
        TokenRefusal::Ticket,
        TokenRefusal::Share,
    ];
    for e in &all {
        match e {
            TokenRefusal::Missing
            | TokenRefusal::Invalid
            | TokenRefusal::InUrl
            | TokenRefusal::Ticket
            | TokenRefusal::Share => {}
        }
    }
    all
}

/// What each transport answers for one refusal.
struct Answer {
    shown: String,
    http: ApiError,
    mcp: ToolFailure,
}

/// Every refusal through both transports, each the way its handlers turn
/// it into an answer. The errors are not `Clone`, so each list is made
/// twice, one for each transport.
fn answers() -> Vec<Answer> {
    fn both<E: std::fmt::Debug>(make: fn() -> Vec<E>, http: impl Fn(E) -> ApiError) -> Vec<Answer>
    where
        ToolFailure: From<E>,
    {
        let shown = make().iter().map(|e| format!("{e:?}")).collect::<Vec<_>>();
        let answers = make().into_iter().map(http).zip(make().into_iter().map(ToolFailure::from));
        shown.into_iter().zip(answers).map(|(shown, (http, mcp))| Answer { shown, http, mcp }).collect()
    }
    let submitted = |e: SubmitError| {
        let response = crate::adapters::http::tasks::SubmitFailure::from(e).into_response();
        response.extensions().get::<ApiError>().expect("an error response").clone()
    };
    let mut all = both(every_submit_error, submitted);
    all.extend(both(every_upload_error, |e| ApiError::refused(&e)));
    all.extend(both(every_space_error, |e| ApiError::refused(&e)));
    all.extend(both(every_login_limit, |e| ApiError::refused(&e)));
    all.extend(both(every_task_refusal, |e| ApiError::refused(&e)));
    all.extend(both(every_token_refusal, |e| ApiError::refused(&e)));
    all.extend(both(every_pay_link_refusal, |e| ApiError::refused(&e)));
    // Not an MCP tool's yet: its answer there is the one vocabulary's all the same.
    all.extend(every_webhook_refusal().into_iter().map(|e| Answer {
        shown: format!("{e:?}"),
        http: ApiError::refused(&e),
        mcp: ToolFailure::refused(&e),
    }));
    all
}

/// Every `"snake_case"` string literal in the adapters' sources: where the
/// codes a transport answers by itself are named (`invalid_json`,
/// `not_found`, `task_not_finished`, …). A code no refusal has and no
/// adapter names is answered by nothing.
fn adapter_literals() -> BTreeSet<String> {
    fn walk(dir: &std::path::Path, found: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for literal in text.split('"').skip(1).step_by(2) {
                    let snake = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
                    if literal.starts_with(|c: char| c.is_ascii_lowercase()) && literal.chars().all(snake) {
                        found.insert(literal.to_owned());
                    }
                }
            }
        }
    }
    let mut found = BTreeSet::new();
    walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/adapters"), &mut found);
    found
}

/// The README's table of error codes: the first cell of each row under
/// its heading.
fn readme_codes() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let table = readme.split("### Error codes").nth(1).expect("README.md has a section `### Error codes`");
    let rows = table.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'));
    rows.filter_map(|row| row.split('|').nth(1)?.trim().strip_prefix('`')?.strip_suffix('`').map(str::to_owned))
        .collect()
}

#[test]
fn every_refusal_has_one_code_on_both_transports_and_is_documented() {
    let openapi = include_str!("adapters/http/openapi.json");
    let readme = readme_codes();
    let mut wrong = Vec::new();
    for Answer { shown, http, mcp } in answers() {
        let code = http.code;
        match &mcp {
            // x402's tool-result binding: the challenge is the answer, as
            // HTTP's `402` is (a refused payment's envelope says why).
            ToolFailure::Payment { .. } => {
                if http.status != StatusCode::PAYMENT_REQUIRED {
                    wrong.push(format!("{shown}: a challenge over MCP, {} over HTTP", http.status));
                }
            }
            ToolFailure::Refused { .. } => {}
        }
        if mcp.code() != code {
            wrong.push(format!("{shown}: `{code}` over HTTP, `{}` over MCP", mcp.code()));
        }
        if !openapi.contains(&format!("`{code}`")) {
            wrong.push(format!("{shown}: `{code}` is in no description of openapi.json"));
        }
        if !readme.iter().any(|c| c == code) {
            wrong.push(format!("{shown}: `{code}` is not in the README's table of error codes"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// An executor's report refusals: HTTP only (a service reports over
/// `POST /v1/executor/reports`, never over MCP), each documented in both places.
fn every_report_refusal() -> Vec<ReportRefusal> {
    let all = vec![
        ReportRefusal::Invalid("id is missing".into()),
        ReportRefusal::Token,
        ReportRefusal::Superseded,
        ReportRefusal::Canceled,
        ReportRefusal::Ended,
        ReportRefusal::TooLarge,
        ReportRefusal::OutputTooLarge { max: 1 },
    ];
    for e in &all {
        match e {
            ReportRefusal::Invalid(_)
            | ReportRefusal::Token
            | ReportRefusal::Superseded
            | ReportRefusal::Canceled
            | ReportRefusal::Ended
            | ReportRefusal::TooLarge
            | ReportRefusal::OutputTooLarge { .. } => {}
        }
    }
    all
}

/// A batch-settlement refund's refusals: HTTP only (`GET
/// /v1/refund/{kind}`, where x402's clients ask it; no MCP tool refunds),
/// each documented in both places.
fn every_refund_error() -> Vec<batch::refund::RefundError> {
    use batch::refund::RefundError;
    let mut all = vec![
        RefundError::Malformed("not base64".into()),
        RefundError::UnknownChannel(challenge(RefundError::UNKNOWN_CHANNEL)),
        RefundError::NothingToRefund(challenge(RefundError::NOTHING_TO_REFUND)),
        RefundError::Failed {
            challenge: challenge(RefundError::FAILED),
            reason: "invalid_batch_settlement_evm_refund_simulation_failed".into(),
            settlement: Box::new(PaymentResponse::refused("reverted", "eip155:84532", "0x")),
        },
        RefundError::NotOffered,
        RefundError::FacilitatorUnavailable,
        RefundError::ChainUnavailable,
        RefundError::Db(sqlx::Error::PoolTimedOut),
    ];
    for refusal in every_voucher_refusal() {
        all.push(RefundError::Voucher { challenge: challenge(refusal.code()), refusal: Box::new(refusal) });
    }
    for e in &all {
        match e {
            RefundError::Malformed(_)
            | RefundError::Voucher { .. }
            | RefundError::UnknownChannel(_)
            | RefundError::NothingToRefund(_)
            | RefundError::Failed { .. }
            | RefundError::NotOffered
            | RefundError::FacilitatorUnavailable
            | RefundError::ChainUnavailable
            | RefundError::Db(_) => {}
        }
    }
    all
}

#[test]
fn every_refund_refusal_is_documented_and_a_payment_refusal_carries_its_challenge() {
    use crate::domain::error::Refusal;
    let openapi = include_str!("adapters/http/openapi.json");
    let readme = readme_codes();
    for refusal in every_refund_error() {
        let answer = ApiError::refused(&refusal);
        let code = answer.code;
        assert!(openapi.contains(&format!("`{code}`")), "{refusal:?}: `{code}` is in no description of openapi.json");
        assert!(readme.iter().any(|c| c == code), "{refusal:?}: `{code}` is not in the README's table of error codes");
        if answer.status == StatusCode::PAYMENT_REQUIRED {
            let challenge = refusal.challenge().unwrap_or_else(|| panic!("{refusal:?}: a 402 without its challenge"));
            assert_eq!(challenge.error, code, "{refusal:?}");
        }
        assert!(!answer.message.contains("PoolTimedOut"), "{refusal:?}: no internals: {}", answer.message);
    }
}

#[test]
fn every_report_refusal_is_documented() {
    let openapi = include_str!("adapters/http/openapi.json");
    let readme = readme_codes();
    for refusal in every_report_refusal() {
        let code = ApiError::refused(&refusal).code;
        assert!(openapi.contains(&format!("`{code}`")), "{refusal:?}: `{code}` is in no description of openapi.json");
        assert!(readme.iter().any(|c| c == code), "{refusal:?}: `{code}` is not in the README's table of error codes");
    }
}

#[test]
fn every_code_in_the_readme_is_answered_by_something() {
    let answers = answers();
    let reports: Vec<&'static str> = every_report_refusal()
        .iter()
        .map(|r| ApiError::refused(r).code)
        .chain(every_refund_error().iter().map(|r| ApiError::refused(r).code))
        .collect();
    let refused: BTreeSet<&str> =
        answers.iter().flat_map(|a| [a.http.code, a.mcp.code()]).chain(reports.iter().copied()).collect();
    let named = adapter_literals();
    let unanswered: Vec<String> =
        readme_codes().into_iter().filter(|code| !refused.contains(code.as_str()) && !named.contains(code)).collect();
    assert!(unanswered.is_empty(), "rows of the README's table of error codes that nothing answers: {unanswered:?}");
}
