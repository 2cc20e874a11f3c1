//! After each message, the worker wakes its task's Space: a run that ended
//! freed a slot, and a task of that Space parked over the limit takes it
//! (see `domain/tasks/fairness`). One statement, under the Space's lock. A
//! wake that fails is only logged: the sweep wakes every Space with parked
//! tasks.

use super::WorkerContext;
use crate::domain::tasks::{QueueMessage, fairness};

pub(super) async fn wake_space(ctx: &WorkerContext, message: &QueueMessage) {
    let Some(queue) = &ctx.visibility else { return };
    let slots = ctx.catalog.slots(&message.kind);
    let woken = async {
        let woken = fairness::wake_for(&ctx.db, message.task_id, &slots).await?;
        if woken.is_empty() {
            return Ok(0);
        }
        fairness::send_woken(&ctx.db, queue.sqs(), queue.queue_url(), woken).await
    };
    match woken.await {
        Ok(0) => {}
        Ok(woken) => tracing::info!(woken, "woke tasks of the Space its run freed a slot of"),
        Err(e) => tracing::warn!(error = %e, "could not wake the Space's parked tasks; the sweep will"),
    }
}
