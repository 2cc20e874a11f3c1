-- The signed cancel a delegated attempt's service is sent when its buyer
-- cancels (issue 38, docs/executors.md "Cancel"). The task row is its own
-- outbox: a cancel asked (`cancel_requested_at`) of a running task whose
-- current attempt was handed to a service (`delegated_attempt = attempts`)
-- is owed to that service until `cancel_sent_at` says it was told. The
-- sweeper wakes the worker for each one owed; the worker, which alone
-- holds the services' signing secrets and the Invoke grant, sends it and
-- records it here. A task is canceled once, so one column is enough.
ALTER TABLE tasks ADD COLUMN cancel_sent_at TIMESTAMPTZ;
