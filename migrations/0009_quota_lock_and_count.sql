-- The free quota's lock and count in one round trip (domain/tasks/quota.rs).
-- Each free create takes a (space, kind) lock, then counts that Space's tasks
-- of the kind. In one plain statement the count would use the statement's
-- snapshot, taken before the lock was granted, and miss a create committed
-- while it waited. A VOLATILE function takes a fresh snapshot for each query
-- it runs (under READ COMMITTED), so this count, made after the lock, sees
-- every create committed before it. The lock is held until the caller's
-- transaction ends.
CREATE FUNCTION quota_lock_and_count(space bytea, task_kind text, OUT this_hour bigint, OUT unfinished bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('reeve.quota:' || encode(space, 'hex') || ':' || task_kind, 0));
    SELECT count(*) FILTER (WHERE t.created_at > now() - interval '1 hour'),
           count(*) FILTER (WHERE t.status IN ('queued', 'running'))
      INTO this_hour, unfinished
      FROM tasks t
     WHERE t.space_idx = space AND t.kind = task_kind
       AND (t.created_at > now() - interval '1 hour' OR t.status IN ('queued', 'running'));
END
$$;
