//! One Pub/Sub connection per relay process, shared by every client.
//!
//! Clients [`Hub::subscribe`] to a task; the first client of a task makes the
//! connection SUBSCRIBE to its channel and the last one to leave makes it
//! UNSUBSCRIBE. Messages fan out through a bounded broadcast channel per task,
//! so a slow client can fall behind (it then sees `Lagged` and resynchronises
//! from Postgres) but can never make the relay hold unbounded memory.
//!
//! When the connection is lost the hub reconnects with backoff, subscribes to
//! every channel that still has clients, and then tells every client to
//! [`Signal::Resync`]: whatever was published meanwhile is in Postgres.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{channel, task_of_channel};
use crate::ids::Id;
use crate::tasks::Event;

/// Events a slow client may be behind before it must resynchronise.
const PER_TASK_BUFFER: usize = 256;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub enum Signal {
    Event(Arc<Event>),
    /// Live delivery may have missed events: read Postgres again.
    Resync,
}

struct Entry {
    sender: broadcast::Sender<Signal>,
    clients: usize,
}

enum Command {
    /// Answered once Redis confirmed the subscription (or at once while the
    /// connection is down: the client will get a `Resync` on reconnect).
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

struct Shared {
    tasks: Mutex<HashMap<Id, Entry>>,
    commands: mpsc::UnboundedSender<Command>,
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
                let _ = self.shared.commands.send(Command::Unsubscribe(channel(self.task)));
            }
        }
        crate::metrics::relay_watchers(-1.0);
        crate::metrics::relay_subscribed_tasks(tasks.len());
    }
}

impl Hub {
    /// Starts the hub's connection task on the current runtime.
    pub fn start(client: redis::Client) -> Hub {
        let (commands, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared { tasks: Mutex::new(HashMap::new()), commands });
        tokio::spawn(run(client, Arc::downgrade(&shared), receiver));
        Hub { shared }
    }

    /// Subscribes to a task's events. Returns once Redis delivers them, so a
    /// replay from Postgres started afterwards cannot miss one in between.
    pub async fn subscribe(&self, task: Id) -> Subscription {
        let receiver = {
            let mut tasks = self.shared.tasks.lock().expect("hub lock");
            let entry = tasks.entry(task).or_insert_with(|| Entry {
                sender: broadcast::channel(PER_TASK_BUFFER).0,
                clients: 0,
            });
            entry.clients += 1;
            let receiver = entry.sender.subscribe();
            crate::metrics::relay_watchers(1.0);
            crate::metrics::relay_subscribed_tasks(tasks.len());
            receiver
        };
        let (ack, acked) = oneshot::channel();
        if self.shared.commands.send(Command::Subscribe(channel(task), ack)).is_ok() {
            let _ = acked.await;
        }
        Subscription { receiver, task, shared: self.shared.clone() }
    }

    /// Tasks with at least one client.
    pub fn task_count(&self) -> usize {
        self.shared.tasks.lock().expect("hub lock").len()
    }
}

impl Shared {
    fn channels(&self) -> Vec<String> {
        self.tasks.lock().expect("hub lock").keys().map(|t| channel(*t)).collect()
    }

    fn resync_all(&self) {
        for entry in self.tasks.lock().expect("hub lock").values() {
            let _ = entry.sender.send(Signal::Resync);
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
        if let Some(entry) = self.tasks.lock().expect("hub lock").get(&task) {
            let _ = entry.sender.send(Signal::Event(Arc::new(event)));
        }
    }
}

/// The connection task: lives as long as the hub does.
async fn run(client: redis::Client, shared: std::sync::Weak<Shared>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok(pubsub) = client.get_async_pubsub().await {
            let (mut sink, mut messages) = pubsub.split();
            let Some(hub) = shared.upgrade() else { return };
            let channels = hub.channels();
            let resubscribed = channels.is_empty() || sink.subscribe(&channels).await.is_ok();
            if resubscribed {
                tracing::info!(channels = channels.len(), "relay subscribed to redis");
                hub.resync_all();
                backoff = Duration::from_millis(100);
                drop(hub);
                loop {
                    tokio::select! {
                        command = commands.recv() => match command {
                            None => return,
                            Some(Command::Subscribe(name, ack)) => {
                                let ok = sink.subscribe(&name).await.is_ok();
                                let _ = ack.send(());
                                if !ok { break; }
                            }
                            Some(Command::Unsubscribe(name)) => {
                                if sink.unsubscribe(&name).await.is_err() { break; }
                            }
                        },
                        message = messages.next() => match message {
                            Some(message) => match shared.upgrade() {
                                Some(hub) => hub.deliver(&message),
                                None => return,
                            },
                            None => break,
                        },
                    }
                }
            }
            tracing::warn!("relay lost its redis connection; reconnecting");
            crate::metrics::relay_redis_reconnect();
        }
        // While disconnected, subscribers are answered at once: the resync
        // after reconnecting covers whatever they miss until then.
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Subscribe(_, ack)) => { let _ = ack.send(()); }
                    Some(Command::Unsubscribe(_)) => {}
                },
            }
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
