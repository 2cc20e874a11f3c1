//! How many Spaces and sessions one client (an IPv4 address, an IPv6 /56)
//! may make, on every path
//! that makes them: `POST /v1/spaces` and `POST /v1/sessions`, and MCP's
//! `create_space` and `login`, on Lambda and on `reeve serve` alike.
//!
//! Both run Argon2id, and every Space brings its own quota of free work
//! (`tasks::quota`), so Spaces are what bounds the free work one address can
//! have done. The budget is kept in Postgres (`login_limits`), one row per
//! address and action: a limit held in one process was none across Lambda
//! instances, and REST and MCP must spend the same budget.
//!
//! A budget is a burst, then one more each period (GCRA, as the in-process
//! limiter of `reeve serve` counted before): the row holds the time at
//! which the address's budget is whole again (`tat`). A request is let
//! through when, with its own period added, that time is at most a burst
//! ahead of now; a refused request spends nothing, and is told how long
//! until one more fits (`Retry-After`). One `INSERT ... ON CONFLICT DO
//! UPDATE` decides and spends under the row's lock, so two requests at
//! once never both take the last slot.
//!
//! A row whose `tat` has passed means the same as no row. Each spend
//! deletes up to [`PRUNE`] such rows of other addresses, so the table holds
//! about the addresses seen within the longest period, not every address
//! ever seen.

use std::net::IpAddr;
use std::time::Duration;

use sqlx::PgPool;

use crate::infra::client_addr::{ClientPrefixes, EdgeSecret};

/// What is being limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A new Space ID: a new Space (one Argon2id hash, a fresh quota of
    /// free work), or a Space's ID rotated (`POST /v1/space/rotate`, two
    /// Argon2id runs), which spends the same budget.
    Space,
    /// A session opened on a Space ID (one Argon2id verify).
    Session,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Space => "space",
            Action::Session => "session",
        }
    }
}

/// One action's budget per client address: `burst` at once, then one more
/// each `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub burst: u32,
    pub every: Duration,
}

/// The default per client (`REEVE_SPACES_BURST`, `REEVE_SPACES_INTERVAL_MS`
/// move it): a burst of 10 new Spaces, then one a minute (70 in a first
/// hour).
pub const SPACES: Budget = Budget { burst: 10, every: Duration::from_secs(60) };
/// The default per client (`REEVE_SESSIONS_BURST`,
/// `REEVE_SESSIONS_INTERVAL_MS` move it): a burst of 10 sessions, then two a
/// second.
pub const SESSIONS: Budget = Budget { burst: 10, every: Duration::from_millis(500) };

/// Stale rows (of addresses idle past their period) each spend deletes.
pub const PRUNE: i64 = 16;

/// The budgets of both actions, how wide a network counts as one client,
/// and who the client is behind the optional CloudFront edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginLimits {
    pub spaces: Budget,
    pub sessions: Budget,
    pub prefixes: ClientPrefixes,
    /// The edge's origin secret (`REEVE_EDGE_SECRET`), when the API is
    /// served through CloudFront: a request carrying it is counted by the
    /// viewer address CloudFront forwards
    /// ([`crate::infra::client_addr::client_behind`]). `None`: by the
    /// address the transport saw, as ever.
    pub edge: Option<EdgeSecret>,
}

impl Default for LoginLimits {
    fn default() -> Self {
        LoginLimits { spaces: SPACES, sessions: SESSIONS, prefixes: ClientPrefixes::DEFAULT, edge: None }
    }
}

/// Over the budget: try again after `retry_after`. Its code, message and
/// wait, on REST and MCP alike, are in the one vocabulary
/// (`domain/error.rs`): `rate_limited`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{action:?} over the per-address budget for {retry_after:?}")]
pub struct Limited {
    pub action: Action,
    pub retry_after: Duration,
}

impl Limited {
    /// Whole seconds, rounded up, at least 1 (`Retry-After`).
    pub fn seconds(&self) -> u64 {
        (self.retry_after.as_secs() + u64::from(self.retry_after.subsec_nanos() > 0)).max(1)
    }
}

impl LoginLimits {
    fn budget(&self, action: Action) -> Budget {
        match action {
            Action::Space => self.spaces,
            Action::Session => self.sessions,
        }
    }

    /// Spends one `action` of the client `address` belongs to (its network
    /// by [`LoginLimits::prefixes`]), by the database's clock. `Err(Limited)`
    /// when it is over the budget: nothing was spent, and the caller must
    /// not do the work.
    pub async fn spend(
        &self,
        db: &PgPool,
        address: IpAddr,
        action: Action,
    ) -> Result<Result<(), Limited>, sqlx::Error> {
        let budget = self.budget(action);
        let every = budget.every.as_secs_f64();
        let burst = every * f64::from(budget.burst.max(1));
        let client = self.prefixes.network(address).to_string();
        // The old row's values on the right of SET; the new ones in RETURNING.
        // `wait`: how long until one more fits, for a refused request.
        let (allowed, wait): (bool, f64) = sqlx::query_as(
            "INSERT INTO login_limits AS l (client, action, tat, allowed) \
             VALUES ($1, $2, now() + make_interval(secs => $3), true) \
             ON CONFLICT (client, action) DO UPDATE SET \
               allowed = greatest(l.tat, now()) + make_interval(secs => $3) <= now() + make_interval(secs => $4), \
               tat = CASE WHEN greatest(l.tat, now()) + make_interval(secs => $3) <= now() + make_interval(secs => $4) \
                          THEN greatest(l.tat, now()) + make_interval(secs => $3) ELSE l.tat END \
             RETURNING allowed, \
               extract(epoch FROM l.tat + make_interval(secs => $3) - make_interval(secs => $4) - now())::float8",
        )
        .bind(&client)
        .bind(action.as_str())
        .bind(every)
        .bind(burst)
        .fetch_one(db)
        .await?;
        // Rows of addresses idle past their period: the same as no row. A
        // row another request holds is skipped, never waited for.
        // Best effort: the spend above stands either way.
        let pruned = sqlx::query(
            "DELETE FROM login_limits WHERE ctid IN (\
               SELECT ctid FROM login_limits WHERE tat < now() AND NOT (client = $1 AND action = $2) \
               LIMIT $3 FOR UPDATE SKIP LOCKED)",
        )
        .bind(&client)
        .bind(action.as_str())
        .bind(PRUNE)
        .execute(db)
        .await;
        if let Err(e) = pruned {
            tracing::warn!(error = %e, "pruning idle login limits failed");
        }
        if allowed {
            return Ok(Ok(()));
        }
        Ok(Err(Limited { action, retry_after: Duration::from_secs_f64(wait.clamp(0.0, 86_400.0)) }))
    }
}
