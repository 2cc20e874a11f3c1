-- Cancel and list (GET /v1/tasks, POST /v1/tasks/{id}/cancel).
--
-- A running task cannot be stopped from the API: its executor runs in a
-- worker. The API records the request here and the worker, which checks it
-- while the task runs, stops the executor and ends the task `canceled`.
ALTER TABLE tasks ADD COLUMN cancel_requested_at TIMESTAMPTZ;

-- The list is newest first with a cursor on the id; a ULID's bytes sort by
-- time, so this index serves both the order and the cursor.
CREATE INDEX tasks_space_id ON tasks (space_idx, id DESC);
