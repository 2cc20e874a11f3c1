-- Payments for real: every attempt is recorded before the facilitator is asked
-- to settle, so a settle with an unknown outcome can be resolved on retry, and
-- paid tasks that end without doing their work leave a credit.

-- One row per EIP-3009 authorisation ever presented: (network, payer, nonce)
-- names it on chain, so a replayed payment finds its row whatever the kind or
-- space it is sent to.
CREATE TABLE payment_attempts (
    id            BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    network       TEXT        NOT NULL,
    -- Lowercase hex addresses and nonce: the same authorisation has one spelling.
    payer         TEXT        NOT NULL,
    nonce         TEXT        NOT NULL,
    -- SHA-256 of the decoded PAYMENT-SIGNATURE document.
    payload_hash  BYTEA       NOT NULL CHECK (octet_length(payload_hash) = 32),
    space_idx     BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    kind          TEXT        NOT NULL,
    request_hash  BYTEA       NOT NULL CHECK (octet_length(request_hash) = 32),
    -- The client's payment-identifier extension id, if it sent one.
    payment_id    TEXT,
    asset         TEXT        NOT NULL,
    amount        TEXT        NOT NULL CHECK (amount ~ '^[0-9]+$'),
    -- settling: verify/settle may be under way or its outcome unknown;
    -- settled: paid, and task_id is the one task it bought;
    -- failed: the facilitator refused it (nothing was charged).
    status        TEXT        NOT NULL DEFAULT 'settling'
                              CHECK (status IN ('settling', 'settled', 'failed')),
    -- Who is settling it now: a second request with the same payment waits
    -- for this to pass instead of settling in parallel.
    claimed_until TIMESTAMPTZ,
    reason        TEXT,
    transaction   TEXT,
    task_id       BYTEA       REFERENCES tasks (id) ON DELETE SET NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (network, payer, nonce),
    UNIQUE (space_idx, payment_id)
);

-- The payments table records settled payments; the two columns it lacked.
ALTER TABLE payments ADD COLUMN space_idx BYTEA REFERENCES spaces (idx) ON DELETE CASCADE;
ALTER TABLE payments ADD COLUMN pay_to TEXT;
-- NULL when a retry learnt that an earlier settle had gone through but its
-- answer (and so its hash) was lost; still UNIQUE when known.
ALTER TABLE payments ALTER COLUMN transaction DROP NOT NULL;
CREATE INDEX payments_space_idx ON payments (space_idx, created_at);

-- What a paid task that never did its work is owed: one credit per such task,
-- spent by the next task of the same price in the same asset.
CREATE TABLE credits (
    id          BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    space_idx   BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    network     TEXT        NOT NULL,
    asset       TEXT        NOT NULL,
    amount      TEXT        NOT NULL CHECK (amount ~ '^[0-9]+$'),
    -- The task that failed; UNIQUE so a task is credited at most once.
    source_task BYTEA       NOT NULL UNIQUE REFERENCES tasks (id) ON DELETE CASCADE,
    reason      TEXT        NOT NULL,
    spent_by    BYTEA       UNIQUE REFERENCES tasks (id) ON DELETE SET NULL,
    spent_at    TIMESTAMPTZ,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX credits_unspent ON credits (space_idx, network, asset, amount) WHERE spent_at IS NULL;

-- A task paid with a credit says so in its event log.
ALTER TABLE task_events DROP CONSTRAINT task_events_type_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_type_check
    CHECK (type IN ('status', 'progress', 'log', 'result', 'error', 'credit_used'));
