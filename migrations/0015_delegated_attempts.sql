-- Attempts handed to a service (issue 38, docs/executors.md): a protocol
-- kind's service that answers its job `202` works on alone, and the worker
-- that sent the job is done with it. The attempt stays `running` under its
-- lease, which the service's reports renew (never past the deadline); a
-- service that goes silent lets the lease lapse and the sweeper re-sends the
-- task as the next attempt, exactly as for a dead worker.
--
-- `delegated_attempt` and `delegated_until` say which attempt was handed
-- over and until when (the job's deadline, its report token's expiry).
-- They describe the attempt `attempts` names only while they match it; a
-- later claim leaves them behind and they are read only with that check.
ALTER TABLE tasks
    ADD COLUMN delegated_attempt INTEGER,
    ADD COLUMN delegated_until   TIMESTAMPTZ;

-- Every report a service sent, by the id it chose: a report sent again
-- answers what it answered the first time and does nothing more. The row
-- is written in the transaction of the report's effect, so a report is
-- recorded exactly when it took effect. `held` keeps a metered task's
-- report that may carry its result until the capture (the worker's held
-- reports, adapters/worker/reports.rs); `answer` is the JSON answered.
CREATE TABLE executor_reports (
    task_id   BYTEA       NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    attempt   INTEGER     NOT NULL CHECK (attempt >= 1),
    report_id TEXT        NOT NULL CHECK (report_id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    type      TEXT        NOT NULL,
    status    SMALLINT    NOT NULL,
    answer    JSONB       NOT NULL,
    held      JSONB,
    at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, attempt, report_id)
);
