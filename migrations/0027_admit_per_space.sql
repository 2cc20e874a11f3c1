-- Fairness at admission (issue 41, part 2): a Space's backlog waits in
-- Postgres, not in the queue.
--
-- With `running_per_space` enforced only when a worker claims, a Space that
-- queued 1,000 tasks put 1,000 messages ahead of every other Space's next
-- task: the worker parked them one receive at a time, and another Space's
-- task waited behind the whole backlog (the fairness bench's quiet task had
-- not started after 60 s). Now a new task goes to the queue only while its
-- Space has fewer than its limit in flight (running, or queued and not
-- parked, so in the queue); otherwise it is parked at once, as a claim
-- parks, and a freed slot wakes it. The queue then holds at most the limit
-- of each Space's tasks, so another Space's task waits behind at most that.

-- The queued tasks not parked, counted per Space at admission and wake.
CREATE INDEX tasks_in_queue_by_space ON tasks (space_idx, kind) WHERE status = 'queued' AND parked_at IS NULL;

-- A Space's lock (the one running_lock_and_count takes) and its tasks in
-- flight: running, or queued and not parked. With `older_than`, only the
-- queued tasks older than it count: two tasks admitted at once each count
-- the other otherwise, and both would be parked with nothing in flight to
-- wake them until a sweep.
CREATE FUNCTION in_flight_lock_and_count(space bytea, own text, others text[], older_than bytea) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    in_flight bigint;
BEGIN
    IF space IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('reeve.running:' || encode(space, 'hex'), 0));
    SELECT count(*) INTO in_flight
      FROM tasks t
     WHERE t.space_idx = space
       AND (t.status = 'running'
            OR (t.status = 'queued' AND t.parked_at IS NULL AND (older_than IS NULL OR t.id < older_than)))
       AND CASE WHEN own IS NULL THEN t.kind <> ALL(others) ELSE t.kind = own END;
    RETURN in_flight;
END
$$;

-- Wakes only as many as the Space has free of its tasks in flight, not of
-- its running ones: a woken task is in the queue until a worker claims it,
-- and counting it keeps the queue at the limit (0018's version sent more
-- on every end, and the worker parked them again).
CREATE OR REPLACE FUNCTION wake_parked(space bytea, own text, others text[], lim bigint)
RETURNS TABLE (woken_id bytea, woken_kind text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    in_flight bigint;
BEGIN
    in_flight := in_flight_lock_and_count(space, own, others, NULL);
    IF space IS NULL OR in_flight >= lim THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE tasks t SET parked_at = NULL, updated_at = now()
     WHERE t.id IN (SELECT p.id FROM tasks p
                     WHERE p.space_idx = space AND p.status = 'queued' AND p.parked_at IS NOT NULL
                       AND CASE WHEN own IS NULL THEN p.kind <> ALL(others) ELSE p.kind = own END
                     ORDER BY p.id LIMIT lim - in_flight)
    RETURNING t.id, t.kind;
END
$$;
