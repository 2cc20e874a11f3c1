-- Fairness between Spaces (issue 41, part 2): at most `running_per_space`
-- of a Space's tasks run at once (domain/tasks/fairness.rs).
--
-- A task a worker found over its Space's limit is parked: still `queued`,
-- its message deleted (so the queue's receive count, which the dead-letter
-- queue counts, does not grow while it waits), `parked_at` set until a
-- freed slot wakes it, and `wait_reason` (its owner's `waiting`) set until
-- a worker claims it.

ALTER TABLE tasks
    ADD COLUMN parked_at   TIMESTAMPTZ,
    ADD COLUMN wait_reason JSONB;

-- A claim counts its Space's running tasks (of its kind, or of the kinds
-- sharing the catalog's limit).
CREATE INDEX tasks_running_by_space ON tasks (space_idx, kind) WHERE status = 'running';

-- A wake takes a Space's oldest parked tasks; a sweep finds the Spaces that
-- have any.
CREATE INDEX tasks_parked_by_space ON tasks (space_idx, kind, id) WHERE status = 'queued' AND parked_at IS NOT NULL;

-- A Space's lock and its running tasks' count, in one round trip, as
-- quota_lock_and_count (0009) does for the quota, and for the same reason:
-- a VOLATILE function's count takes its snapshot after the lock, so it sees
-- every claim committed before the lock was granted. The lock is held until
-- the caller's transaction ends: claims and wakes of one Space run one after
-- the other. Counted: the tasks of kind `own`, or when it is NULL, of every
-- kind not in `others` (those with a limit of their own). NULL space (no
-- such task): 0, no lock.
CREATE FUNCTION running_lock_and_count(space bytea, own text, others text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    running bigint;
BEGIN
    IF space IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('reeve.running:' || encode(space, 'hex'), 0));
    SELECT count(*) INTO running
      FROM tasks t
     WHERE t.space_idx = space AND t.status = 'running'
       AND CASE WHEN own IS NULL THEN t.kind <> ALL(others) ELSE t.kind = own END;
    RETURN running;
END
$$;

-- Unparks as many of the Space's parked tasks (of the same pool) as it has
-- free slots under `lim`, oldest first, under the Space's lock: a park and
-- the end that frees its slot cannot miss each other. The caller sends each
-- one's message.
CREATE FUNCTION wake_parked(space bytea, own text, others text[], lim bigint)
RETURNS TABLE (woken_id bytea, woken_kind text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    running bigint;
BEGIN
    running := running_lock_and_count(space, own, others);
    IF space IS NULL OR running >= lim THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE tasks t SET parked_at = NULL, updated_at = now()
     WHERE t.id IN (SELECT p.id FROM tasks p
                     WHERE p.space_idx = space AND p.status = 'queued' AND p.parked_at IS NOT NULL
                       AND CASE WHEN own IS NULL THEN p.kind <> ALL(others) ELSE p.kind = own END
                     ORDER BY p.id LIMIT lim - running)
    RETURNING t.id, t.kind;
END
$$;
