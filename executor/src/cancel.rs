//! Reaching a running attempt with its cancel, in a service that works on
//! its jobs in one long-lived process (an HTTP service): [`Cancels`] keeps
//! the attempts under way, so that a signed cancel (docs/executors.md,
//! "Cancel") stops the one it names at once, without waiting for its next
//! report to be answered `409 canceled`.
//!
//! The work asks its [`Reporter`] between steps: [`Reporter::check`] is a
//! flag read until a cancel arrives, then sends one `heartbeat`, whose
//! `409 canceled` ends the task at Reeve now, and answers the error to
//! stop with. A Lambda function gets each event in a fresh invocation, so
//! its cancel never reaches the running one: there the job stops at its
//! next report, answered `409 canceled`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use crate::messages::{Cancel, Job};
use crate::reporter::Reporter;

/// Whether an attempt was canceled: set once, by its cancel.
#[derive(Debug)]
pub(crate) struct Stop(watch::Sender<bool>);

impl Stop {
    pub(crate) fn new() -> Arc<Stop> {
        Arc::new(Stop(watch::Sender::new(false)))
    }

    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    fn set(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once set.
    pub(crate) async fn wait(&self) {
        let mut seen = self.0.subscribe();
        // The sender lives as long as `self`: this only ends set.
        let _ = seen.wait_for(|set| *set).await;
    }
}

/// The attempts a service is working on, by task and attempt: hand each
/// job's [`Reporter`] out through [`Cancels::reporter`], and each cancel to
/// [`Cancels::cancel`]. Cheap to clone (one shared map); an attempt leaves
/// it when the last clone of its reporter is dropped.
#[derive(Debug, Clone, Default)]
pub struct Cancels {
    running: Arc<Mutex<Running>>,
}

/// Each attempt under way, by task id and attempt: its stop, while any
/// clone of its reporter lives.
type Running = HashMap<(String, u32), Weak<Stop>>;

impl Cancels {
    /// A reporter for `job`'s attempt that its cancel reaches.
    pub fn reporter(&self, job: &Job) -> Reporter {
        self.track(job, Reporter::new(job))
    }

    /// `reporter`, for `job`'s attempt, reached by its cancel from now.
    pub fn track(&self, job: &Job, reporter: Reporter) -> Reporter {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.retain(|_, stop| stop.strong_count() > 0);
        running.insert((job.task.id.clone(), job.task.attempt), Arc::downgrade(reporter.stop()));
        reporter
    }

    /// Stops the attempt `cancel` names, if it is under way here: `true`
    /// when it was. A cancel for an attempt not (or no longer) here is no
    /// error: it may have ended, or run elsewhere.
    pub fn cancel(&self, cancel: &Cancel) -> bool {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(&(cancel.task.id.clone(), cancel.task.attempt)).and_then(Weak::upgrade) {
            Some(stop) => {
                stop.set();
                true
            }
            None => false,
        }
    }
}
