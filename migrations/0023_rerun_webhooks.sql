-- A re-run's end gets its own completion webhook (issue 41).
--
-- A task ends once per run series: its first run, then once after each
-- operator's re-run (`reeve tasks rerun`, migration 0019). `reruns` counts
-- the re-runs (the re-run's statement adds one), and a delivery records the
-- series it is about (`rerun`: 0 for the first run, n after the n-th
-- re-run), so each end has its own outbox row, written once whatever writes
-- it twice. `rerun_from` could not be the key: a task that failed before
-- any run (a queue refused at create) is re-run from 0 attempts, and its
-- re-run would share the first end's key.
ALTER TABLE tasks ADD COLUMN reruns INTEGER NOT NULL DEFAULT 0;

-- The tasks re-run before this migration: their re-runs are the `status`
-- events that say so.
UPDATE tasks t SET reruns = r.n
  FROM (SELECT task_id, count(*)::int AS n FROM task_events
         WHERE type = 'status' AND data->>'rerun' = 'true' GROUP BY task_id) r
 WHERE t.id = r.task_id;

-- Every existing end's row is its first run's: before this, a re-run's end
-- found that row and wrote none.
ALTER TABLE webhook_deliveries ADD COLUMN rerun INTEGER NOT NULL DEFAULT 0;

DROP INDEX webhook_deliveries_end;
-- One row per end of a task.
CREATE UNIQUE INDEX webhook_deliveries_end ON webhook_deliveries (task_id, rerun) WHERE event <> 'progress';
