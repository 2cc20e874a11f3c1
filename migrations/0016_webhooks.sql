-- Completion webhooks, signed per Standard Webhooks (issue 41, part 1).
--
-- A task may name its own endpoint (`tasks.webhook_url`, with the events it
-- wants); a Space may set a default for its tasks that name none
-- (`space_webhooks`). Every delivery is a row of the outbox
-- (`webhook_deliveries`), written by the very statement that ends the task
-- (domain/tasks/transition.rs), so no end is ever without its row: the
-- sender polls the outbox and delivers at least once.

ALTER TABLE tasks
    ADD COLUMN webhook_url    TEXT,
    ADD COLUMN webhook_events TEXT[];

-- The endpoint a Space's tasks are delivered to when they name none.
CREATE TABLE space_webhooks (
    space_idx  BYTEA       PRIMARY KEY REFERENCES spaces (idx) ON DELETE CASCADE,
    url        TEXT        NOT NULL,
    events     TEXT[]      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The signing secrets of a Space. The key must be kept to sign with, so it is
-- stored (it signs notifications, it opens nothing). The newest is current;
-- a rotation gives the one before an end (`expires_at`, a grace period) during
-- which deliveries carry both signatures.
CREATE TABLE webhook_secrets (
    id         BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    space_idx  BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    key        BYTEA       NOT NULL CHECK (octet_length(key) BETWEEN 24 AND 64),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ
);

CREATE INDEX webhook_secrets_space ON webhook_secrets (space_idx, created_at DESC);

-- Endpoints that answered `410 Gone`: nothing more is sent to them for that
-- Space until it sets the URL again as its default.
CREATE TABLE webhook_disabled (
    space_idx   BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    url         TEXT        NOT NULL,
    disabled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (space_idx, url)
);

-- The outbox: one delivery per task end (a task ends once), `pending` until it
-- is `delivered`, `failed` (refused, or the schedule ran out) or `disabled`
-- (its endpoint answered 410, now or before). `claimed_until` is the lease a
-- sender holds while it sends, so two senders never send one row at once.
CREATE TABLE webhook_deliveries (
    id              BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    task_id         BYTEA       NOT NULL UNIQUE REFERENCES tasks (id) ON DELETE CASCADE,
    space_idx       BYTEA       NOT NULL,
    url             TEXT        NOT NULL,
    event           TEXT        NOT NULL CHECK (event IN ('completed', 'failed', 'canceled')),
    status          TEXT        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    attempts        INT4        NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_until   TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- Every attempt, as its owner sees it (`GET /v1/tasks/{id}/webhooks`).
CREATE TABLE webhook_attempts (
    delivery_id     BYTEA       NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    n               INT4        NOT NULL,
    at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    status_code     INT4,
    error           TEXT,
    duration_ms     INT8        NOT NULL,
    next_attempt_at TIMESTAMPTZ,
    PRIMARY KEY (delivery_id, n)
);
