//! The SSE relay: one Redis Pub/Sub connection per process ([`hub`]), fanned
//! out in-process to every client, each of which gets a gap-free,
//! duplicate-free stream of domain events replayed from Postgres
//! ([`stream`]), within the caps and read turns of [`streams`]. Postgres is
//! the truth; Redis is only the doorbell. The HTTP layer (`http::stream`)
//! turns the events into SSE frames, so this module knows nothing of HTTP:
//! the relay service is that route running over it.

pub(crate) mod hub;
pub(crate) mod stream;
pub(crate) mod streams;

pub use hub::{Hub, Signal, Subscription};
pub use stream::{Delivery, REPLAY_PAGE, TaskPosition, events, is_terminal, resume_after};
pub use streams::{READS_IN_FLIGHT, RETRY_AFTER, SPACE_READS_IN_FLIGHT, StreamCaps, StreamRefused, StreamSlot};

use crate::domain::ids::Id;
pub use crate::domain::tasks::events::channel;

/// The task a channel name belongs to, if it is one of ours.
pub fn task_of_channel(channel: &str) -> Option<Id> {
    channel.strip_prefix("task:")?.strip_suffix(":events")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_round_trip() {
        let id = Id::new();
        assert_eq!(channel(id), format!("task:{id}:events"));
        assert_eq!(task_of_channel(&channel(id)), Some(id));
        assert_eq!(task_of_channel("task:nope:events"), None);
        assert_eq!(task_of_channel(&format!("other:{id}:events")), None);
    }
}
