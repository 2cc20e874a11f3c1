//! The relay's own limits: how many streams a space and a client address may
//! hold open at once on this relay process, and a fair share of the Postgres
//! reads for every space.
//!
//! Spaces and sessions cost nothing, so without caps one client could open
//! streams until the relay's memory, sockets and Postgres reads were all its
//! own. A stream holds a [`StreamSlot`] from before its first read until it
//! is dropped (the client left or the task ended), so a cap lifts as soon as
//! a stream closes.
//!
//! Reads: the relay runs at most [`READS_IN_FLIGHT`] Postgres reads at a
//! time, and a space at most [`SPACE_READS_IN_FLIGHT`] of them. A space
//! first waits for a turn of its own, then for one of the process, so the
//! process's queue holds at most that many readers per space: a space
//! replaying thousands of events on many streams waits behind itself, and
//! every other space's next read is at most one turn per waiting space
//! away.
//!
//! The counts are per process: behind a load balancer each relay task counts
//! its own streams, so a space may hold up to (caps × tasks).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::domain::auth::SpaceIndex;

/// Postgres reads the relay runs at once (replays, opening checks and the
/// hub's quiet-task checks), well under the pool's eight connections so a
/// stream's opening check still finds one.
pub const READS_IN_FLIGHT: usize = 4;
/// Of those, what one space may hold: the rest stays for other spaces.
pub const SPACE_READS_IN_FLIGHT: usize = 2;
/// What a refused client is told to wait: streams end when their tasks do.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The caps of one relay process (`REEVE_RELAY_STREAMS_PER_SPACE`,
/// `REEVE_RELAY_STREAMS_PER_IP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCaps {
    /// Open streams of one space.
    pub per_space: usize,
    /// Open streams from one client address (an IPv4 address or an IPv6 /56).
    pub per_ip: usize,
}

impl StreamCaps {
    pub const DEFAULT_PER_SPACE: usize = 32;
    pub const DEFAULT_PER_IP: usize = 128;

    /// No cap at all: tests that open thousands of streams from one place.
    pub const NONE: StreamCaps = StreamCaps { per_space: usize::MAX, per_ip: usize::MAX };
}

impl Default for StreamCaps {
    fn default() -> Self {
        StreamCaps { per_space: Self::DEFAULT_PER_SPACE, per_ip: Self::DEFAULT_PER_IP }
    }
}

/// Which cap a stream would break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StreamRefused {
    #[error("this space already has {0} streams open")]
    Space(usize),
    #[error("this address already has {0} streams open")]
    Ip(usize),
}

impl StreamRefused {
    /// The reason as a metric label.
    pub fn label(self) -> &'static str {
        match self {
            StreamRefused::Space(_) => "space",
            StreamRefused::Ip(_) => "ip",
        }
    }
}

struct SpaceEntry {
    open: usize,
    /// The space's turns at reading Postgres; shared by its streams.
    reads: Arc<Semaphore>,
}

#[derive(Default)]
struct Counts {
    spaces: HashMap<SpaceIndex, SpaceEntry>,
    ips: HashMap<IpAddr, usize>,
}

/// Every open stream of the process, by space and by address, and the
/// process's read turns.
pub struct OpenStreams {
    counts: Mutex<Counts>,
    reads: Semaphore,
}

impl Default for OpenStreams {
    fn default() -> Self {
        OpenStreams { counts: Mutex::default(), reads: Semaphore::new(READS_IN_FLIGHT) }
    }
}

impl OpenStreams {
    /// A slot for one more stream of `space` from `ip` (`None`: the address
    /// is unknown, and only the space's cap applies), or the cap it would
    /// break. Refusals count nothing.
    pub fn open(
        self: &Arc<Self>,
        caps: StreamCaps,
        space: SpaceIndex,
        ip: Option<IpAddr>,
    ) -> Result<StreamSlot, StreamRefused> {
        let mut counts = self.counts.lock().expect("streams lock");
        let space_open = counts.spaces.get(&space).map_or(0, |entry| entry.open);
        if space_open >= caps.per_space {
            return Err(StreamRefused::Space(caps.per_space));
        }
        if let Some(ip) = ip
            && counts.ips.get(&ip).copied().unwrap_or(0) >= caps.per_ip
        {
            return Err(StreamRefused::Ip(caps.per_ip));
        }
        let entry = counts
            .spaces
            .entry(space)
            .or_insert_with(|| SpaceEntry { open: 0, reads: Arc::new(Semaphore::new(SPACE_READS_IN_FLIGHT)) });
        entry.open += 1;
        let reads = entry.reads.clone();
        if let Some(ip) = ip {
            *counts.ips.entry(ip).or_default() += 1;
        }
        // Every open stream is a watcher, a finished task's replay too (it
        // never subscribes to the hub).
        crate::infra::metrics::relay_watchers(1.0);
        Ok(StreamSlot { streams: self.clone(), space, ip, reads })
    }

    /// A turn at reading Postgres outside any stream (the hub's checks).
    pub async fn read_permit(&self) -> SemaphorePermit<'_> {
        self.reads.acquire().await.expect("the semaphore is never closed")
    }

    /// Streams open now for `space`.
    pub fn space_count(&self, space: &SpaceIndex) -> usize {
        self.counts.lock().expect("streams lock").spaces.get(space).map_or(0, |entry| entry.open)
    }
}

/// One open stream's place under the caps; dropping it frees the place.
pub struct StreamSlot {
    streams: Arc<OpenStreams>,
    space: SpaceIndex,
    ip: Option<IpAddr>,
    reads: Arc<Semaphore>,
}

/// A turn at reading Postgres: the space's and the process's, held together.
pub struct ReadTurn<'a> {
    _space: SemaphorePermit<'a>,
    _process: SemaphorePermit<'a>,
}

impl StreamSlot {
    /// Waits for this stream's space to have a turn free, then for the
    /// process to have one.
    pub async fn read_turn(&self) -> ReadTurn<'_> {
        let space = self.reads.acquire().await.expect("the semaphore is never closed");
        let process = self.streams.read_permit().await;
        ReadTurn { _space: space, _process: process }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        crate::infra::metrics::relay_watchers(-1.0);
        let mut counts = self.streams.counts.lock().expect("streams lock");
        if let Some(entry) = counts.spaces.get_mut(&self.space) {
            entry.open -= 1;
            if entry.open == 0 {
                counts.spaces.remove(&self.space);
            }
        }
        if let Some(ip) = self.ip
            && let Some(open) = counts.ips.get_mut(&ip)
        {
            *open -= 1;
            if *open == 0 {
                counts.ips.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SpaceIndex = SpaceIndex::from_array([1; 16]);
    const B: SpaceIndex = SpaceIndex::from_array([2; 16]);

    #[test]
    fn caps_count_open_slots_and_lift_when_one_is_dropped() {
        let streams = Arc::new(OpenStreams::default());
        let caps = StreamCaps { per_space: 2, per_ip: 3 };
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let a1 = streams.open(caps, A, Some(ip)).unwrap();
        let _a2 = streams.open(caps, A, Some(ip)).unwrap();
        assert_eq!(streams.open(caps, A, Some(ip)).err(), Some(StreamRefused::Space(2)));
        let _b1 = streams.open(caps, B, Some(ip)).unwrap();
        assert_eq!(streams.open(caps, B, Some(ip)).err(), Some(StreamRefused::Ip(3)));
        // Another address, or none known, is not this one.
        let _b2 = streams.open(caps, B, None).unwrap();
        drop(a1);
        let _a3 = streams.open(caps, A, Some(ip)).unwrap();
        assert_eq!(streams.space_count(&A), 2);
    }

    #[test]
    fn the_last_slot_of_a_space_leaves_nothing_behind() {
        let streams = Arc::new(OpenStreams::default());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        drop(streams.open(StreamCaps::default(), A, Some(ip)).unwrap());
        let counts = streams.counts.lock().unwrap();
        assert!(counts.spaces.is_empty() && counts.ips.is_empty());
    }
}
