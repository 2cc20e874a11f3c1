//! Pay links: how an agent whose client cannot pay (no x402) buys a task,
//! with a person paying in a browser wallet (issue 40). An MCP client that
//! declares URL elicitation calls a priced tool without a payment; Reeve
//! makes a link (here) and hands its URL to the client, which shows it to
//! its user. The URL opens the console's pay page, which shows this one
//! offer and pays it with the console's own wallet flow
//! (`GET`/`POST /v1/pay-link`). The agent's retried call then answers the
//! task the page bought.
//!
//! A link is one offer: this Space, this kind, this input (and its SHA-256),
//! at these prices, for [`PAY_LINK_TTL`]. It holds no credential: its token
//! is the link's id and an HMAC of it under the token key
//! (`<id>.<mac>`), good only for reading that offer and paying it, so a
//! token that was forged or altered names no link. Nothing of the Space
//! (its ID, a session token) is in it.
//!
//! Paying creates the task under the link's own idempotency key
//! ([`PayLink::key`]), through the one create path
//! ([`crate::domain::tasks::submit`]): the page's payment, a payment sent
//! again, and the agent's retried call all meet that one task, with one
//! charge. A task under the key is what makes a link used: it cannot be
//! paid twice.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use sqlx::PgPool;
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use crate::domain::auth::{Secret, SpaceIndex, hmac_sha256};
use crate::domain::error::{ErrorKind, Refusal, Wording};
use crate::domain::ids::Id;
use crate::domain::payments::PaymentRequired;

/// The `Authorization` scheme the pay page sends a link's token with
/// (`Authorization: PayLink <token>`), on `/v1/pay-link` only.
pub const PAY_LINK_SCHEME: &str = "PayLink";

/// How long a link may be paid: long enough for a person to read the offer
/// and sign in their wallet, short enough that a link left in a chat's
/// history buys nothing later.
pub const PAY_LINK_TTL: Duration = Duration::minutes(15);

/// How long after it was made a link answers the same call (the same
/// Space, kind and input, with no `requestState`): a paid link's task, or
/// the same unpaid link again. A client that lost its retry's answer gets
/// the task it paid for, not a second link.
pub const ANSWERS_FOR: Duration = Duration::hours(1);

/// What prefixes a link's idempotency key: never a key a REST client or an
/// MCP `payment-identifier` chooses (those have prefixes of their own or
/// none).
pub const KEY_PREFIX: &str = "pay-link:";

const DOMAIN: &[u8] = b"reeve pay link\0";
/// The MAC's bytes in a token: 128 bits.
const MAC_LEN: usize = 16;

/// One offer, as stored.
#[derive(Debug, Clone)]
pub struct PayLink {
    pub id: Id,
    pub space: SpaceIndex,
    pub kind: String,
    pub input: Value,
    pub input_sha256: String,
    /// The `accepts` offered when it was made ([`prices_of`]).
    pub prices: Value,
    /// Its task's idempotency key: `pay-link:<id>`.
    pub key: String,
    pub expires_at: OffsetDateTime,
    /// The task it bought, once paid.
    pub task: Option<Id>,
}

/// A link's row, its ids as stored.
#[derive(sqlx::FromRow)]
struct Row {
    id: Vec<u8>,
    space: Vec<u8>,
    kind: String,
    input: Value,
    input_sha256: String,
    prices: Value,
    key: String,
    expires_at: OffsetDateTime,
    task: Option<Vec<u8>>,
}

impl TryFrom<Row> for PayLink {
    type Error = sqlx::Error;
    fn try_from(row: Row) -> Result<PayLink, sqlx::Error> {
        let id = |bytes: &[u8]| Id::from_bytes(bytes).map_err(|_| sqlx::Error::Decode("a pay link's id".into()));
        let space: [u8; 16] =
            row.space.as_slice().try_into().map_err(|_| sqlx::Error::Decode("a pay link's space".into()))?;
        Ok(PayLink {
            id: id(&row.id)?,
            space: SpaceIndex::from_array(space),
            kind: row.kind,
            input: row.input,
            input_sha256: row.input_sha256,
            prices: row.prices,
            key: row.key,
            expires_at: row.expires_at,
            task: row.task.as_deref().map(id).transpose()?,
        })
    }
}

impl PayLink {
    /// Its token: `<id>.<mac>`, the MAC base64url.
    pub fn token(&self, key: &Secret) -> String {
        token_of(key, self.id)
    }

    /// The task it bought, if paid.
    pub fn paid_task(&self) -> Option<Id> {
        self.task
    }

    pub fn expired_at(&self, now: OffsetDateTime) -> bool {
        now >= self.expires_at
    }
}

fn token_of(key: &Secret, id: Id) -> String {
    let mac = hmac_sha256(key.as_bytes(), &[DOMAIN, &id.to_bytes()]);
    format!("{id}.{}", URL_SAFE_NO_PAD.encode(&mac[..MAC_LEN]))
}

/// The link id a token names, if `key` made it.
pub fn verify_token(key: &Secret, token: &str) -> Option<Id> {
    let (id, mac) = token.trim().split_once('.')?;
    let id: Id = id.parse().ok()?;
    let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
    let expected = hmac_sha256(key.as_bytes(), &[DOMAIN, &id.to_bytes()]);
    (mac.len() == MAC_LEN && bool::from(expected[..MAC_LEN].ct_eq(&mac))).then_some(id)
}

/// Why a link (or a retried call's `requestState`) was refused. Each has
/// a stable code; none charges anything.
#[derive(Debug, thiserror::Error)]
pub enum PayLinkRefusal {
    /// A token that is malformed, altered, or names no link.
    #[error("no such pay link")]
    Invalid,
    /// A retried call's `requestState` that Reeve did not make.
    #[error("the requestState is not Reeve's")]
    RequestState,
    #[error("the pay link has expired")]
    Expired,
    #[error("the pay link has been paid")]
    Used,
    /// A `requestState` of another Space's link.
    #[error("the pay link is another Space's")]
    OtherSpace,
    /// A retried call whose input is not the link's.
    #[error("the input differs from the pay link's")]
    InputChanged,
    /// The kind's prices changed since the link was made.
    #[error("the kind's prices changed since the pay link was made")]
    PriceChanged,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl Refusal for PayLinkRefusal {
    fn code(&self) -> &'static str {
        match self {
            PayLinkRefusal::Invalid => "pay_link_invalid",
            PayLinkRefusal::RequestState => "invalid_request_state",
            PayLinkRefusal::Expired => "pay_link_expired",
            PayLinkRefusal::Used => "pay_link_used",
            PayLinkRefusal::OtherSpace => "pay_link_other_space",
            PayLinkRefusal::InputChanged => "pay_link_input_changed",
            PayLinkRefusal::PriceChanged => "pay_link_price_changed",
            PayLinkRefusal::Db(e) => Refusal::code(e),
        }
    }

    fn kind(&self) -> ErrorKind {
        match self {
            PayLinkRefusal::Invalid => ErrorKind::NotFound,
            PayLinkRefusal::RequestState => ErrorKind::Input,
            PayLinkRefusal::OtherSpace => ErrorKind::Forbidden,
            PayLinkRefusal::Expired
            | PayLinkRefusal::Used
            | PayLinkRefusal::InputChanged
            | PayLinkRefusal::PriceChanged => ErrorKind::Conflict,
            PayLinkRefusal::Db(e) => Refusal::kind(e),
        }
    }

    fn message(&self, words: &Wording) -> String {
        match self {
            PayLinkRefusal::Invalid => "no such pay link: it was altered, or is not Reeve's; ask the agent for the \
                link again"
                .into(),
            PayLinkRefusal::RequestState => "the requestState is not one Reeve made (it was altered, or is \
                another server's); call the tool again without it for a new pay link"
                .into(),
            PayLinkRefusal::Expired => format!(
                "the pay link has expired (a link can be paid for {} minutes); nothing was charged: call the tool \
                 again for a new link",
                PAY_LINK_TTL.whole_minutes()
            ),
            PayLinkRefusal::Used => "the pay link has been paid already, and its task created: the agent's next \
                call of the tool answers that task; nothing more was charged"
                .into(),
            PayLinkRefusal::OtherSpace => "the requestState names another Space's pay link; call the tool again \
                without it for a link of this Space"
                .into(),
            PayLinkRefusal::InputChanged => format!(
                "{} differ from what the pay link was made for; the link pays only for that input. Call the tool \
                 again with the same input, or without the requestState for a new link",
                words.input
            ),
            PayLinkRefusal::PriceChanged => "the task's prices changed since the pay link was made; nothing was \
                charged: call the tool again for a link at the new price"
                .into(),
            PayLinkRefusal::Db(e) => e.message(words),
        }
    }
}

/// What a challenge's `accepts` offer, as a link keeps them: scheme,
/// network, asset, amount and payee of each, in order. The EIP-712 domain
/// and the timeouts are left out: they are not the price.
pub fn prices_of(challenge: &PaymentRequired) -> Value {
    challenge
        .accepts
        .iter()
        .map(|a| {
            json!({ "scheme": a.scheme, "network": a.network, "asset": a.asset, "amount": a.amount,
                    "payTo": a.pay_to })
        })
        .collect()
}

/// A link's columns, and its task if one was created under its key.
macro_rules! link_from {
    () => {
        "SELECT l.id, l.space_idx AS space, l.kind, l.input, l.input_sha256, l.prices, l.key, \
         l.expires_at, t.id AS task \
         FROM pay_links l LEFT JOIN tasks t ON t.space_idx = l.space_idx AND t.idempotency_key = l.key "
    };
}

/// The link a token names; [`PayLinkRefusal::Invalid`] for one `key` did
/// not make or that names no link.
pub async fn find(db: &PgPool, key: &Secret, token: &str) -> Result<PayLink, PayLinkRefusal> {
    let id = verify_token(key, token).ok_or(PayLinkRefusal::Invalid)?;
    let sql = concat!(link_from!(), "WHERE l.id = $1");
    let row = sqlx::query_as::<_, Row>(sql).bind(id.to_bytes().as_slice()).fetch_optional(db).await?;
    row.ok_or(PayLinkRefusal::Invalid)?.try_into().map_err(PayLinkRefusal::Db)
}

/// The link a call without a `requestState` meets: the Space's latest for
/// this kind and input made within [`ANSWERS_FOR`], a paid one first.
pub async fn latest(
    db: &PgPool,
    space: &SpaceIndex,
    kind: &str,
    input_sha256: &str,
    now: OffsetDateTime,
) -> Result<Option<PayLink>, sqlx::Error> {
    let sql = concat!(
        link_from!(),
        "WHERE l.space_idx = $1 AND l.kind = $2 AND l.input_sha256 = $3 AND l.created_at > $4 \
         ORDER BY (t.id IS NOT NULL) DESC, l.created_at DESC LIMIT 1"
    );
    let row = sqlx::query_as::<_, Row>(sql)
        .bind(space.as_bytes().as_slice())
        .bind(kind)
        .bind(input_sha256)
        .bind(now - ANSWERS_FOR)
        .fetch_optional(db)
        .await?;
    row.map(PayLink::try_from).transpose()
}

/// How many forgotten links one sweep deletes at most: a sweep stays short
/// whatever piled up, and the next one takes the rest.
pub const FORGET_BATCH: i64 = 1_000;

/// Every Space's links older than [`ANSWERS_FOR`], at most [`FORGET_BATCH`]
/// of them; how many went. [`issue`] forgets a Space's own old links, but a
/// Space that never calls a priced tool again would keep its last ones, and
/// their inputs, for good: the sweeper calls this on each sweep.
pub async fn forget_old(db: &PgPool, now: OffsetDateTime) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM pay_links WHERE id IN (\
           SELECT id FROM pay_links WHERE created_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind(now - ANSWERS_FOR)
    .bind(FORGET_BATCH)
    .execute(db)
    .await?
    .rows_affected())
}

/// A new link for this offer, payable until [`PAY_LINK_TTL`] from `now`.
/// The Space's links older than [`ANSWERS_FOR`] go first: no call meets
/// them any more, and a task bought with one keeps its key, so a Space
/// holds only the last hour's links.
#[cfg(feature = "api-tasks")]
pub async fn issue(
    db: &PgPool,
    space: &SpaceIndex,
    kind: &str,
    input: &Value,
    prices: Value,
    now: OffsetDateTime,
) -> Result<PayLink, sqlx::Error> {
    let id = Id::new();
    let key = format!("{KEY_PREFIX}{id}");
    let input_sha256 = crate::domain::payments::offer_receipt::sha256_json(input);
    let expires_at = now + PAY_LINK_TTL;
    sqlx::query("DELETE FROM pay_links WHERE space_idx = $1 AND created_at < $2")
        .bind(space.as_bytes().as_slice())
        .bind(now - ANSWERS_FOR)
        .execute(db)
        .await?;
    sqlx::query(
        "INSERT INTO pay_links (id, space_idx, kind, input, input_sha256, prices, key, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id.to_bytes().as_slice())
    .bind(space.as_bytes().as_slice())
    .bind(kind)
    .bind(input)
    .bind(&input_sha256)
    .bind(&prices)
    .bind(&key)
    .bind(now)
    .bind(expires_at)
    .execute(db)
    .await?;
    Ok(PayLink {
        id,
        space: *space,
        kind: kind.to_owned(),
        input: input.clone(),
        input_sha256,
        prices,
        key,
        expires_at,
        task: None,
    })
}

/// Whether `link` may be paid at `now` for `challenge` (the kind's
/// challenge as it is now): not paid, not expired, at the same prices.
pub fn payable(link: &PayLink, challenge: &PaymentRequired, now: OffsetDateTime) -> Result<(), PayLinkRefusal> {
    if link.paid_task().is_some() {
        return Err(PayLinkRefusal::Used);
    }
    if link.expired_at(now) {
        return Err(PayLinkRefusal::Expired);
    }
    if prices_of(challenge) != link.prices {
        return Err(PayLinkRefusal::PriceChanged);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![byte; 32]).unwrap()
    }

    /// A token opens its own link under its own key, and nothing else: one
    /// changed character, another key, or a bare id names no link.
    #[test]
    fn a_token_names_its_link_only_under_its_key_and_unaltered() {
        let id = Id::new();
        let token = token_of(&key(1), id);
        assert_eq!(verify_token(&key(1), &token), Some(id));
        assert_eq!(verify_token(&key(2), &token), None);
        assert_eq!(verify_token(&key(1), &id.to_string()), None);
        let mut altered = token.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(verify_token(&key(1), std::str::from_utf8(&altered).unwrap()), None);
        let other = Id::new();
        let (_, mac) = token.split_once('.').unwrap();
        assert_eq!(verify_token(&key(1), &format!("{other}.{mac}")), None, "a MAC moved to another id");
        assert!(!token.contains('/') && !token.contains('+') && !token.contains('='), "URL-safe: {token}");
    }
}
