-- The free-task quota (tasks/quota.rs): each free create counts the Space's
-- tasks of its kind that are queued or running. Those are few, while a
-- Space's history grows without end, so they get an index of their own;
-- the hour's count uses tasks_space_idx (space_idx, created_at).
CREATE INDEX tasks_unfinished ON tasks (space_idx, kind) WHERE status IN ('queued', 'running');
