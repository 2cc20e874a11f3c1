-- Reeve's schema (DESIGN §5). Every id is a ULID stored as its 16 raw bytes;
-- the CHECKs keep a stray text or UUID-string id from ever being written.

CREATE TABLE spaces (
    idx        BYTEA       PRIMARY KEY CHECK (octet_length(idx) = 16),
    hash       TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE uploads (
    id           BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    space_idx    BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    key          TEXT        NOT NULL UNIQUE,
    filename     TEXT        NOT NULL,
    content_type TEXT        NOT NULL,
    size         BIGINT      NOT NULL CHECK (size >= 0),
    status       TEXT        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'uploaded', 'rejected', 'consumed')),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX uploads_space_idx ON uploads (space_idx, created_at);

CREATE TABLE tasks (
    id              BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    space_idx       BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    kind            TEXT        NOT NULL,
    input           JSONB       NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'queued'
                                CHECK (status IN ('queued', 'running', 'completed', 'failed', 'canceled')),
    progress        REAL        NOT NULL DEFAULT 0 CHECK (progress >= 0 AND progress <= 1),
    result          JSONB,
    error           JSONB,
    -- The key and a hash of the request it came with: the same key with a
    -- different body must be refused, not silently answered with the old task.
    idempotency_key TEXT,
    request_hash    BYTEA       CHECK (request_hash IS NULL OR octet_length(request_hash) = 32),
    attempts        INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    lease_until     TIMESTAMPTZ,
    -- The event counter: seq is allocated here in the same transaction as the
    -- event insert, so concurrent writers can neither collide nor leave holes.
    last_seq        BIGINT      NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (space_idx, idempotency_key)
);
CREATE INDEX tasks_space_idx ON tasks (space_idx, created_at);

CREATE TABLE task_events (
    task_id BYTEA       NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    seq     BIGINT      NOT NULL CHECK (seq >= 1),
    type    TEXT        NOT NULL CHECK (type IN ('status', 'progress', 'log', 'result', 'error')),
    data    JSONB       NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE payments (
    id          BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    task_id     BYTEA       NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    network     TEXT        NOT NULL,
    payer       TEXT        NOT NULL,
    -- Atomic units can exceed any integer column; kept as a decimal string.
    amount      TEXT        NOT NULL CHECK (amount ~ '^[0-9]+$'),
    asset       TEXT        NOT NULL,
    -- One on-chain settlement pays for one task: a replayed payment fails here.
    transaction TEXT        NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX payments_task_id ON payments (task_id);
