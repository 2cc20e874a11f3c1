//! How long a task waits between attempts after a retryable failure: a
//! delay that grows by 3 from attempt to attempt (5 s, 15 s, 45 s… by
//! default), capped, or what the failing service asked for (`Retry-After`)
//! when it said, under the same cap. The worker hides the task's message
//! for that long (SQS `ChangeMessageVisibility`), so the next attempt comes
//! within seconds instead of after the queue's visibility timeout.

use std::time::Duration;

/// The growth from one attempt's delay to the next.
const FACTOR: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// `REEVE_RETRY_BACKOFF_SECONDS` (default 5): the wait after the first
    /// attempt.
    pub first: Duration,
    /// `REEVE_RETRY_BACKOFF_MAX_SECONDS` (default 120): no wait is longer,
    /// whatever a `Retry-After` says.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { first: Duration::from_secs(5), max: Duration::from_secs(120) }
    }
}

impl Backoff {
    /// SQS hides a message for at most 12 hours.
    pub const LIMIT: Duration = Duration::from_secs(12 * 3600);

    /// The wait after run `attempt` (1 for the first) failed; `asked`, the
    /// service's own `Retry-After`, takes the place of the schedule.
    pub fn after(&self, attempt: i32, asked: Option<Duration>) -> Duration {
        let scheduled = || {
            let steps = u32::try_from(attempt.saturating_sub(1)).unwrap_or(0);
            FACTOR.checked_pow(steps).and_then(|n| self.first.checked_mul(n)).unwrap_or(Duration::MAX)
        };
        asked.unwrap_or_else(scheduled).min(self.max).min(Self::LIMIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_by_three_up_to_the_cap_and_a_server_may_name_its_own() {
        let backoff = Backoff::default();
        let waits: Vec<u64> = (1..=6).map(|n| backoff.after(n, None).as_secs()).collect();
        assert_eq!(waits, [5, 15, 45, 120, 120, 120]);
        assert_eq!(backoff.after(100, None), Duration::from_secs(120), "no overflow far out");
        assert_eq!(backoff.after(0, None), Duration::from_secs(5));
        let asked = |secs| Some(Duration::from_secs(secs));
        assert_eq!(backoff.after(1, asked(2)), Duration::from_secs(2), "honoured, even when shorter");
        assert_eq!(backoff.after(2, asked(3600)), Duration::from_secs(120), "capped");
        let uncapped = Backoff { max: Duration::MAX, ..backoff };
        assert_eq!(uncapped.after(40, None), Backoff::LIMIT, "never past what SQS allows");
    }
}
