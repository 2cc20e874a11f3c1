//! One Pub/Sub connection per relay process, shared by every client.
//!
//! Clients [`Hub::subscribe`] to a task; the first client of a task makes the
//! connection SUBSCRIBE to its channel and the last one to leave makes it
//! UNSUBSCRIBE. Messages fan out through a bounded broadcast channel per task,
//! so a slow client can fall behind (it then sees `Lagged` and resynchronises
//! from Postgres) but can never make the relay hold unbounded memory.
//!
//! Redis is only the doorbell, so the hub also watches Postgres: a task that
//! has heard nothing for [`QUIET`] is checked (one batched query for every
//! quiet task of the process), and its clients are told [`Signal::Behind`]
//! when Postgres has events Redis never delivered — a failed or skipped
//! PUBLISH cannot leave a stream waiting for ever. After a reconnect every
//! task is checked the same way at once, so only the clients that really
//! missed something read Postgres, within the read turns of
//! [`super::streams`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sqlx::PgPool;
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::time::timeout;

use super::streams::{OpenStreams, StreamCaps, StreamRefused, StreamSlot};
use super::{channel, task_of_channel};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::tasks::Event;

/// Events a slow client may be behind before it must resynchronise.
const PER_TASK_BUFFER: usize = 256;
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Connecting to Redis (TCP and handshake) may take this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One SUBSCRIBE, UNSUBSCRIBE or PING may take this long; longer means the
/// connection is broken even if the socket looks open.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// A client waits at most this long for Redis to confirm its subscription;
/// after that it goes on, and the Postgres check covers what it may miss.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(3);
/// An idle connection is PINGed this often, so a half-open one is noticed.
const PING_EVERY: Duration = Duration::from_secs(10);
/// A task that heard nothing for this long is checked against Postgres.
pub const QUIET: Duration = Duration::from_secs(2);
/// How often the hub looks for quiet tasks.
const CHECK_TICK: Duration = Duration::from_millis(500);
/// Tasks per batched check query.
const CHECK_BATCH: usize = 1000;

#[derive(Debug, Clone)]
pub enum Signal {
    Event(Arc<Event>),
    /// Postgres holds events up to this seq: a client behind it replays.
    Behind(i64),
    /// Live delivery may have missed events and the hub could not tell
    /// which: read Postgres again.
    Resync,
}

struct Entry {
    sender: broadcast::Sender<Signal>,
    clients: usize,
    /// Set once Redis confirmed the SUBSCRIBE (or while it is unreachable).
    ready: watch::Sender<bool>,
    /// A seq every client of this task has, or will get from its receiver:
    /// the highest one Redis delivered (to all of them), or one the only
    /// client read itself. Postgres ahead of it is a [`Signal::Behind`].
    known: i64,
    /// When the task last heard from Redis or was checked.
    heard: Instant,
    /// Check at the next tick, quiet or not (after a reconnect).
    check_now: bool,
}

enum Command {
    Subscribe(Id),
    Unsubscribe(Id),
}

struct Shared {
    tasks: Mutex<HashMap<Id, Entry>>,
    commands: mpsc::UnboundedSender<Command>,
    connected: AtomicBool,
    /// Every stream's slot under the caps, and the read turns.
    streams: Arc<OpenStreams>,
    /// The Postgres watch, started by the first stream (it brings the pool).
    watching: OnceLock<()>,
    wake_checker: Arc<Notify>,
}

#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

/// One client's view of one task; leaving (drop) unsubscribes the last one.
pub struct Subscription {
    pub receiver: broadcast::Receiver<Signal>,
    task: Id,
    shared: Arc<Shared>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut tasks = self.shared.tasks.lock().expect("hub lock");
        if let Some(entry) = tasks.get_mut(&self.task) {
            entry.clients -= 1;
            if entry.clients == 0 {
                tasks.remove(&self.task);
                let _ = self.shared.commands.send(Command::Unsubscribe(self.task));
            }
        }
        crate::infra::metrics::relay_subscribed_tasks(tasks.len());
    }
}

impl Subscription {
    /// The client has everything up to `seq` (read from Postgres), so the hub
    /// need not tell this task about events up to it, if it is the task's
    /// only client. A read of one client's does not reach the others: were
    /// it to count, a client that connected late and read the terminal
    /// status would keep an earlier client, still behind, from ever being
    /// told (while Redis is down, nothing else would tell it).
    pub fn observe(&self, seq: i64) {
        if let Some(entry) = self.shared.tasks.lock().expect("hub lock").get_mut(&self.task)
            && entry.clients == 1
        {
            entry.known = entry.known.max(seq);
        }
    }
}

impl Hub {
    /// Starts the hub's connection task on the current runtime.
    pub fn start(client: redis::Client) -> Hub {
        let (commands, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            tasks: Mutex::new(HashMap::new()),
            commands,
            connected: AtomicBool::new(false),
            streams: Arc::default(),
            watching: OnceLock::new(),
            wake_checker: Arc::new(Notify::new()),
        });
        crate::infra::metrics::relay_redis_connected(false);
        // From the start, so the series exists before the first live stream
        // (a finished task's stream never subscribes).
        crate::infra::metrics::relay_subscribed_tasks(0);
        tokio::spawn(run(client, Arc::downgrade(&shared), receiver));
        Hub { shared }
    }

    /// Starts checking quiet tasks against `db` (once per hub; later calls
    /// do nothing). Every stream calls it, so a hub that serves streams
    /// always watches Postgres.
    pub fn watch_postgres(&self, db: &PgPool) {
        if self.shared.watching.set(()).is_ok() {
            tokio::spawn(check_quiet_tasks(db.clone(), Arc::downgrade(&self.shared), self.shared.wake_checker.clone()));
        }
    }

    /// Subscribes to a task's events. Returns once Redis delivers them, so a
    /// replay from Postgres started afterwards cannot miss one in between.
    ///
    /// Cancel-safe: the client is counted by the returned [`Subscription`],
    /// which exists before the first await, so a caller dropped while waiting
    /// for the acknowledgement leaves nothing behind.
    pub async fn subscribe(&self, task: Id) -> Subscription {
        let (receiver, mut ready, first) = {
            let mut tasks = self.shared.tasks.lock().expect("hub lock");
            let first = !tasks.contains_key(&task);
            let entry = tasks.entry(task).or_insert_with(|| Entry {
                sender: broadcast::channel(PER_TASK_BUFFER).0,
                clients: 0,
                ready: watch::channel(false).0,
                known: 0,
                heard: Instant::now(),
                check_now: false,
            });
            entry.clients += 1;
            let handles = (entry.sender.subscribe(), entry.ready.subscribe(), first);
            crate::infra::metrics::relay_subscribed_tasks(tasks.len());
            handles
        };
        let subscription = Subscription { receiver, task, shared: self.shared.clone() };
        if first {
            let _ = self.shared.commands.send(Command::Subscribe(task));
        }
        let _ = timeout(SUBSCRIBE_WAIT, ready.wait_for(|ready| *ready)).await;
        subscription
    }

    /// A place for one more stream of `space` from `ip` under `caps`; the
    /// stream keeps it until it is dropped, and reads Postgres with its
    /// [`StreamSlot::read_turn`].
    pub fn open_stream(
        &self,
        caps: StreamCaps,
        space: SpaceIndex,
        ip: Option<IpAddr>,
    ) -> Result<StreamSlot, StreamRefused> {
        self.shared.streams.open(caps, space, ip)
    }

    /// Streams open now for `space` on this process.
    pub fn stream_count(&self, space: &SpaceIndex) -> usize {
        self.shared.streams.space_count(space)
    }

    /// Tasks with at least one client.
    pub fn task_count(&self) -> usize {
        self.shared.tasks.lock().expect("hub lock").len()
    }

    /// Whether the Pub/Sub connection is up: without it clients only hear
    /// of events through the slower Postgres check.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn channels(&self) -> Vec<String> {
        self.tasks.lock().expect("hub lock").keys().map(|t| channel(*t)).collect()
    }

    fn set_ready(&self, task: Option<Id>) {
        let tasks = self.tasks.lock().expect("hub lock");
        match task {
            Some(task) => {
                if let Some(entry) = tasks.get(&task) {
                    entry.ready.send_replace(true);
                }
            }
            None => tasks.values().for_each(|entry| {
                entry.ready.send_replace(true);
            }),
        }
    }

    /// After a reconnect: whatever was published meanwhile is in Postgres.
    fn after_reconnect(&self) {
        let mut tasks = self.tasks.lock().expect("hub lock");
        if self.watching.get().is_some() {
            tasks.values_mut().for_each(|entry| entry.check_now = true);
            drop(tasks);
            self.wake_checker.notify_one();
        } else {
            for entry in tasks.values() {
                let _ = entry.sender.send(Signal::Resync);
            }
        }
    }

    fn deliver(&self, message: &redis::Msg) {
        let Some(task) = task_of_channel(message.get_channel_name()) else { return };
        let event: Event = match serde_json::from_slice(message.get_payload_bytes()) {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(%task, error = %e, "ignoring a malformed event message");
                return;
            }
        };
        if let Some(entry) = self.tasks.lock().expect("hub lock").get_mut(&task) {
            entry.known = entry.known.max(event.seq);
            entry.heard = Instant::now();
            let _ = entry.sender.send(Signal::Event(Arc::new(event)));
        }
    }
}

/// The connection task: lives as long as the hub does.
async fn run(client: redis::Client, shared: Weak<Shared>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok(Ok(pubsub)) = timeout(CONNECT_TIMEOUT, client.get_async_pubsub()).await {
            let (mut sink, mut messages) = pubsub.split();
            let Some(hub) = shared.upgrade() else { return };
            let channels = hub.channels();
            let resubscribed =
                channels.is_empty() || matches!(timeout(COMMAND_TIMEOUT, sink.subscribe(&channels)).await, Ok(Ok(())));
            if resubscribed {
                tracing::info!(channels = channels.len(), "relay subscribed to redis");
                hub.connected.store(true, Ordering::Relaxed);
                crate::infra::metrics::relay_redis_connected(true);
                hub.set_ready(None);
                hub.after_reconnect();
                backoff = Duration::from_millis(100);
                drop(hub);
                let ping = tokio::time::sleep(PING_EVERY);
                tokio::pin!(ping);
                loop {
                    tokio::select! {
                        command = commands.recv() => {
                            let (name, subscribe, task) = match command {
                                None => return,
                                Some(Command::Subscribe(task)) => (channel(task), true, task),
                                Some(Command::Unsubscribe(task)) => (channel(task), false, task),
                            };
                            let done = if subscribe {
                                timeout(COMMAND_TIMEOUT, sink.subscribe(&name)).await
                            } else {
                                timeout(COMMAND_TIMEOUT, sink.unsubscribe(&name)).await
                            };
                            if !matches!(done, Ok(Ok(()))) { break; }
                            if subscribe {
                                let Some(hub) = shared.upgrade() else { return };
                                hub.set_ready(Some(task));
                            }
                        }
                        message = messages.next() => match message {
                            Some(message) => match shared.upgrade() {
                                Some(hub) => hub.deliver(&message),
                                None => return,
                            },
                            None => break,
                        },
                        _ = &mut ping => {
                            if !matches!(timeout(COMMAND_TIMEOUT, sink.ping::<redis::Value>()).await, Ok(Ok(_))) { break; }
                            ping.as_mut().reset(tokio::time::Instant::now() + PING_EVERY);
                        }
                    }
                }
            }
            tracing::warn!("relay lost its redis connection; reconnecting");
            crate::infra::metrics::relay_redis_reconnect();
        }
        let Some(hub) = shared.upgrade() else { return };
        hub.connected.store(false, Ordering::Relaxed);
        crate::infra::metrics::relay_redis_connected(false);
        // While disconnected, subscribers go on at once: the check after
        // reconnecting covers whatever they miss until then.
        hub.set_ready(None);
        drop(hub);
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(task)) => match shared.upgrade() {
                        Some(hub) => hub.set_ready(Some(task)),
                        None => return,
                    },
                    Some(Command::Unsubscribe(_)) => {}
                },
            }
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The Postgres watch: every [`CHECK_TICK`], the tasks that heard nothing
/// for [`QUIET`] (or were flagged by a reconnect) are looked up together,
/// and those whose `last_seq` is ahead of what their clients know are told
/// so. One cheap indexed query per batch, shared by every client of a task.
async fn check_quiet_tasks(db: PgPool, shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let _ = timeout(CHECK_TICK, wake.notified()).await;
        let Some(hub) = shared.upgrade() else { return };
        let due: Vec<(Id, i64)> = {
            let now = Instant::now();
            let mut tasks = hub.tasks.lock().expect("hub lock");
            tasks
                .iter_mut()
                .filter(|(_, e)| e.check_now || now.duration_since(e.heard) >= QUIET)
                .map(|(id, e)| {
                    e.check_now = false;
                    e.heard = now;
                    (*id, e.known)
                })
                .collect()
        };
        for batch in due.chunks(CHECK_BATCH) {
            let ids: Vec<Vec<u8>> = batch.iter().map(|(id, _)| id.to_bytes().to_vec()).collect();
            let rows = {
                let _permit = hub.streams.read_permit().await;
                sqlx::query_as::<_, (Id, i64)>("SELECT id, last_seq FROM tasks WHERE id = ANY($1)")
                    .bind(ids)
                    .fetch_all(&db)
                    .await
            };
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    // Try again next tick; the streams stay open meanwhile.
                    tracing::warn!(error = %e, tasks = batch.len(), "relay could not check tasks in postgres");
                    let mut tasks = hub.tasks.lock().expect("hub lock");
                    for (id, _) in batch {
                        if let Some(entry) = tasks.get_mut(id) {
                            entry.check_now = true;
                        }
                    }
                    continue;
                }
            };
            let known: HashMap<Id, i64> = batch.iter().copied().collect();
            let tasks = hub.tasks.lock().expect("hub lock");
            for (id, last_seq) in rows {
                if last_seq > known.get(&id).copied().unwrap_or(0)
                    && let Some(entry) = tasks.get(&id)
                {
                    let _ = entry.sender.send(Signal::Behind(last_seq));
                }
            }
        }
    }
}
