-- Re-runs (issue 41, `reeve tasks rerun`): an operator may run a task that
-- failed by Reeve's fault again, as a new attempt of the same task.
--
-- `attempts` stays the fencing token, so it only ever grows: a worker, or a
-- service holding a report token, from before the re-run can never write
-- into it. `rerun_from` is what `attempts` was when the task was last re-run;
-- the retry limit counts `attempts - rerun_from`, the runs since then, and
-- a cancel before the re-run's first claim is a cancel before it ran.
ALTER TABLE tasks ADD COLUMN rerun_from INTEGER NOT NULL DEFAULT 0;

-- A paid task's re-run spends the credit its failure left (`spent_by` is
-- then the task itself): the payment buys the re-run or the credit, never
-- both. Should the re-run fail by Reeve's fault too, it earns a credit
-- again. So a task may be the source of several credits, but of only one
-- it did not spend on itself, and may spend several of its own beside the
-- one other credit that may have paid for it.
ALTER TABLE credits DROP CONSTRAINT credits_source_task_key;
CREATE UNIQUE INDEX credits_source_task ON credits (source_task) WHERE spent_by IS DISTINCT FROM source_task;
ALTER TABLE credits DROP CONSTRAINT credits_spent_by_key;
CREATE UNIQUE INDEX credits_spent_by ON credits (spent_by) WHERE spent_by IS DISTINCT FROM source_task;
