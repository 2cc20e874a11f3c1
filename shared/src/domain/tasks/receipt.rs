//! A paid task's signed receipt (x402 `offer-receipt`): what its buyer paid
//! and, once it has ended, what it delivered, signed with the seller's key
//! ([`SellerKey`]).
//!
//! No receipt is stored: one is made from the task's row and its payment
//! (which keeps the resource it paid for), or the credit that paid for it,
//! each time it is asked for (`GET /v1/tasks/{id}/receipt`, a paid
//! create's `PAYMENT-RESPONSE`, MCP's `_meta`). `issuedAt` is a stored
//! time (when it was paid; once the task has ended, when it ended), so the
//! same task answers the same payload until it ends, and then one final
//! payload for good; a key in this process signs it the same each time, a
//! key in KMS differently (each signature valid).

use serde_json::Value;
use sqlx::PgPool;
use time::OffsetDateTime;

use super::{TaskStatus, output_key};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::payments::MeteredPayment;
use crate::domain::payments::offer_receipt::{
    CreditSpent, DeliveredFile, Delivery, MeteredCharge, PAYLOAD_VERSION, ReceiptPayload, SellerKey, SignError, Signed,
    VoucherSpent, result_sha256, sha256_json,
};

/// Why a task of this Space has no receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReceipt {
    /// This deployment signs no receipts (no `receipt_signer`).
    Unsigned,
    /// Free: no payment, no voucher, no credit.
    NotPaid,
    /// A metered task not charged (yet, or ever: it used nothing, failed,
    /// or was canceled).
    NotCharged,
}

impl NoReceipt {
    pub fn message(self) -> &'static str {
        match self {
            NoReceipt::Unsigned => "this deployment signs no receipts (its catalog publishes no receipt_signer)",
            NoReceipt::NotPaid => "the task was free: neither a payment, a voucher nor a credit paid for it",
            NoReceipt::NotCharged => "the metered task has not been charged: its receipt comes once a charge is proven",
        }
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    kind: String,
    input: sqlx::types::Json<Value>,
    #[sqlx(try_from = "String")]
    status: TaskStatus,
    result: Option<sqlx::types::Json<Value>>,
    payment: Option<sqlx::types::Json<MeteredPayment>>,
    updated_at: OffsetDateTime,
    network: Option<String>,
    payer: Option<String>,
    amount: Option<String>,
    asset: Option<String>,
    transaction: Option<String>,
    pay_to: Option<String>,
    paid_at: Option<OffsetDateTime>,
    resource: Option<String>,
}

/// Why a receipt could not be made now.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// The key is in KMS, which did not sign.
    #[error(transparent)]
    Sign(#[from] SignError),
}

/// `task`'s receipt, signed with `key`, naming the resource its payment
/// paid for (recorded with the payment), whichever interface asks: an MCP
/// tool's task read through REST still names its tool. `resource_url(kind)`
/// names it only for a payment recorded before Reeve kept it.
/// `Ok(None)`: no such task in `space`.
pub async fn signed_receipt(
    db: &PgPool,
    key: Option<&SellerKey>,
    space: &SpaceIndex,
    task: Id,
    resource_url: &(dyn Fn(&str) -> String + Sync),
) -> Result<Option<Result<Signed, NoReceipt>>, ReceiptError> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT t.kind, t.input, t.status, t.result, t.payment, t.updated_at,
                p.network, p.payer, p.amount, p.asset, p.transaction, p.pay_to, p.created_at AS paid_at,
                p.resource
           FROM tasks t LEFT JOIN payments p ON p.task_id = t.id
          WHERE t.id = $1 AND t.space_idx = $2",
    )
    .bind(task)
    .bind(space.as_bytes())
    .fetch_optional(db)
    .await?;
    let Some(mut row) = row else { return Ok(None) };
    let Some(key) = key else { return Ok(Some(Err(NoReceipt::Unsigned))) };
    let (mut credit, mut voucher) = (None, None);
    if row.network.is_none() && row.payment.is_none() {
        voucher = voucher_paid(db, task).await?;
        if let Some(paid) = &voucher {
            row.paid_by(&paid.paid);
        }
    }
    if row.network.is_none() && row.payment.is_none() {
        credit = credit_paid(db, task).await?;
        if let Some(paid) = &credit {
            row.paid_by(&paid.paid);
        }
    }
    let credit = credit.map(|paid| CreditSpent {
        id: paid.credit.to_string(),
        source_task: paid.source_task.map(|task| task.to_string()),
        reason: paid.reason,
    });
    let voucher = voucher.map(|paid| VoucherSpent { channel_id: paid.channel_id, cumulative_amount: paid.ceiling });
    match payload(row, (credit, voucher), space, task, resource_url) {
        Ok(payload) => Ok(Some(Ok(key.sign(&payload).await?))),
        Err(why) => Ok(Some(Err(why))),
    }
}

/// The money that paid for a task when no payment row did: a voucher's or
/// a credit's.
#[derive(sqlx::FromRow)]
struct Paid {
    network: String,
    payer: String,
    amount: String,
    asset: String,
    transaction: Option<String>,
    pay_to: Option<String>,
    paid_at: OffsetDateTime,
}

impl Row {
    fn paid_by(&mut self, paid: &Paid) {
        self.network = Some(paid.network.clone());
        self.payer = Some(paid.payer.clone());
        self.amount = Some(paid.amount.clone());
        self.asset = Some(paid.asset.clone());
        self.transaction = paid.transaction.clone();
        self.pay_to = paid.pay_to.clone();
        self.paid_at = Some(paid.paid_at);
    }
}

/// The batch-settlement voucher that bought a task, and its channel.
#[derive(sqlx::FromRow)]
struct VoucherPaid {
    #[sqlx(flatten)]
    paid: Paid,
    channel_id: String,
    ceiling: String,
}

async fn voucher_paid(db: &PgPool, task: Id) -> Result<Option<VoucherPaid>, sqlx::Error> {
    sqlx::query_as(
        "SELECT c.network, c.payer, v.price::TEXT AS amount, v.asset, NULL::TEXT AS transaction,
                c.config->>'receiver' AS pay_to, v.created_at AS paid_at, v.channel_id, v.ceiling::TEXT AS ceiling
           FROM batch_vouchers v JOIN batch_channels c USING (channel_id)
          WHERE v.task_id = $1",
    )
    .bind(task)
    .fetch_optional(db)
    .await
}

/// The credit that paid for a task, and the payment that money came from.
#[derive(sqlx::FromRow)]
struct CreditPaid {
    #[sqlx(flatten)]
    paid: Paid,
    credit: Id,
    source_task: Option<Id>,
    reason: String,
}

/// The credit `task` spent (not one it spent on its own re-run: then its
/// own payment paid), with the payer, transaction and recipient of the
/// payment (or voucher) it was owed for. A credit owed for a task that a credit paid in
/// turn is followed back to the payment at the start of that chain.
async fn credit_paid(db: &PgPool, task: Id) -> Result<Option<CreditPaid>, sqlx::Error> {
    sqlx::query_as(
        "WITH RECURSIVE chain (first, source_task, source_attempt, depth) AS (
             SELECT c.id, c.source_task, c.source_attempt, 1
               FROM credits c WHERE c.spent_by = $1 AND c.source_task IS DISTINCT FROM $1
             UNION ALL
             SELECT chain.first, c.source_task, c.source_attempt, chain.depth + 1
               FROM chain JOIN credits c ON c.spent_by = chain.source_task AND c.source_task IS DISTINCT FROM c.spent_by
              WHERE chain.depth < 64)
         SELECT f.id AS credit, f.source_task, f.reason, f.network, f.asset, f.amount, f.spent_at AS paid_at,
                coalesce(p.payer, a.payer, bc.payer) AS payer,
                coalesce(p.transaction, a.transaction) AS transaction,
                coalesce(p.pay_to, a.pay_to, bc.config->>'receiver') AS pay_to
           FROM chain
           JOIN credits f ON f.id = chain.first
           LEFT JOIN payments p ON p.task_id = chain.source_task
           LEFT JOIN payment_attempts a ON a.id = chain.source_attempt
           LEFT JOIN batch_vouchers bv ON bv.task_id = chain.source_task
           LEFT JOIN batch_channels bc ON bc.channel_id = bv.channel_id
          WHERE (p.task_id IS NOT NULL OR a.id IS NOT NULL OR bc.channel_id IS NOT NULL) AND f.spent_at IS NOT NULL
          ORDER BY chain.depth
          LIMIT 1",
    )
    .bind(task)
    .fetch_optional(db)
    .await
}

fn payload(
    row: Row,
    (credit, voucher): (Option<CreditSpent>, Option<VoucherSpent>),
    space: &SpaceIndex,
    task: Id,
    resource_url: &(dyn Fn(&str) -> String + Sync),
) -> Result<ReceiptPayload, NoReceipt> {
    let metered = row.payment.map(|json| json.0);
    let (Some(network), Some(payer), Some(amount), Some(asset), Some(paid_at)) =
        (row.network, row.payer, row.amount, row.asset, row.paid_at)
    else {
        return Err(if metered.is_some() { NoReceipt::NotCharged } else { NoReceipt::NotPaid });
    };
    let ended = row.status.is_terminal();
    let delivery = ended.then(|| Delivery {
        status: row.status.as_str().to_owned(),
        result_sha256: row.result.as_ref().map(|result| result_sha256(&result.0)),
        outputs: row.result.as_ref().map(|result| delivered_files(&result.0, space, task)).unwrap_or_default(),
    });
    let issued = if ended { row.updated_at } else { paid_at };
    Ok(ReceiptPayload {
        version: PAYLOAD_VERSION,
        network,
        resource_url: row.resource.unwrap_or_else(|| resource_url(&row.kind)),
        payer,
        issued_at: u64::try_from(issued.unix_timestamp()).unwrap_or_default(),
        transaction: row.transaction.unwrap_or_default(),
        task: task.to_string(),
        kind: row.kind,
        input_sha256: sha256_json(&row.input.0),
        scheme: match (&credit, &voucher, &metered) {
            (Some(_), _, _) => "credit",
            (None, Some(_), _) => "batch-settlement",
            (None, None, Some(_)) => "upto",
            (None, None, None) => "exact",
        }
        .to_owned(),
        asset,
        pay_to: row.pay_to.unwrap_or_default(),
        amount,
        metered: metered.map(|m| MeteredCharge { unit: m.unit, rate: m.rate, used: m.used, authorized: m.authorized }),
        credit,
        voucher,
        delivery,
    })
}

/// The files a result delivered, each with its SHA-256: a `fetch` task's
/// stored download (`body`, under this task's own key), and a protocol
/// kind's `outputs` that carry one.
fn delivered_files(result: &Value, space: &SpaceIndex, task: Id) -> Vec<DeliveredFile> {
    let file = |name: &str, entry: &Value| {
        Some(DeliveredFile {
            name: name.to_owned(),
            size: entry.get("size")?.as_u64()?,
            sha256: entry.get("sha256")?.as_str()?.to_owned(),
        })
    };
    let mut files = Vec::new();
    if result.get("key").and_then(Value::as_str) == Some(output_key(space, task).as_str())
        && let Some(body) = file("body", result)
    {
        files.push(body);
    }
    for output in result.get("outputs").and_then(Value::as_array).into_iter().flatten() {
        if let Some(name) = output.get("name").and_then(Value::as_str)
            && let Some(delivered) = file(name, output)
        {
            files.push(delivered);
        }
    }
    files
}
