-- Progress webhooks (issue 41, part 1): a task, or its Space's default, may
-- name `progress` among its webhook events, beside the ends.
--
-- A task has one delivery per end (it ends once) and any number of
-- progress deliveries over its run, but at most one progress delivery
-- pending at a time: the statement that records a progress event
-- (`tasks::events::running_event`) writes one only when none is pending,
-- and the sender sends the task's view as it is then. A progress delivery
-- still pending when the task ends is `superseded` by the end's.

ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_task_id_key;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_event_check;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_status_check;

ALTER TABLE webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_event_check
        CHECK (event IN ('completed', 'failed', 'canceled', 'progress')),
    ADD CONSTRAINT webhook_deliveries_status_check
        CHECK (status IN ('pending', 'delivered', 'failed', 'disabled', 'superseded'));

-- One end per task, as before.
CREATE UNIQUE INDEX webhook_deliveries_end ON webhook_deliveries (task_id) WHERE event <> 'progress';
-- At most one progress delivery waiting per task.
CREATE UNIQUE INDEX webhook_deliveries_progress_pending ON webhook_deliveries (task_id)
    WHERE event = 'progress' AND status = 'pending';
-- A task's deliveries, listed by its owner and removed with it.
CREATE INDEX webhook_deliveries_task ON webhook_deliveries (task_id);
