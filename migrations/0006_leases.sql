-- Short leases (worker/store.rs): a running task's lease is renewed every
-- few seconds, and a run that takes over from a worker whose lease lapsed
-- says so in the task's log with a `lease_lost` event before its own
-- `running` status.
ALTER TABLE task_events DROP CONSTRAINT task_events_type_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_type_check
    CHECK (type IN ('status', 'progress', 'log', 'result', 'error', 'credit_used', 'payment_settled_late',
                    'lease_lost'));

-- The sweeper looks for lapsed leases every few seconds: the running tasks
-- are few, the table's history is not.
CREATE INDEX tasks_running_lease ON tasks (lease_until) WHERE status = 'running';
