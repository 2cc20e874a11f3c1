-- No payment lost: a settlement whose outcome is unknown is resolved by the
-- server from the chain, not by the client's retry. So an attempt keeps the
-- whole request it pays for (its task may be created minutes later, by the
-- reconciler), and when it can lead nowhere else the payer gets a credit.

-- The request an attempt pays for: kind, space and request_hash were there;
-- the input and the idempotency key make it possible to create its task
-- late. validBefore says when an unused authorisation can never land;
-- pay_to is where it pays, for the payments row written when it does.
ALTER TABLE payment_attempts ADD COLUMN input JSONB;
ALTER TABLE payment_attempts ADD COLUMN idempotency_key TEXT;
ALTER TABLE payment_attempts ADD COLUMN valid_before NUMERIC(78, 0);
ALTER TABLE payment_attempts ADD COLUMN pay_to TEXT;
-- Its client never got its task (it was answered `payment_pending`, or its
-- request died): the same payment sent again answers that task once it is
-- resolved, rather than `payment_replayed` as for a payment whose task was
-- answered.
ALTER TABLE payment_attempts ADD COLUMN told_pending BOOLEAN NOT NULL DEFAULT false;

-- An Idempotency-Key is reserved with its request before anything is
-- settled: while one attempt with the key may still charge (settling) or has
-- charged (settled), no second payment for the same key can start. A failed
-- attempt charged nothing and frees its key.
CREATE UNIQUE INDEX payment_attempts_idempotency_key ON payment_attempts (space_idx, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status <> 'failed';

-- What the reconciler looks at: attempts whose outcome is still open.
CREATE INDEX payment_attempts_settling ON payment_attempts (updated_at) WHERE status = 'settling';

-- A charge whose task can no longer be created (its kind was removed) is
-- owed back as a credit of the attempt rather than of a task.
ALTER TABLE credits ALTER COLUMN source_task DROP NOT NULL;
ALTER TABLE credits ADD COLUMN source_attempt BYTEA UNIQUE REFERENCES payment_attempts (id) ON DELETE CASCADE;
ALTER TABLE credits ADD CONSTRAINT credits_source CHECK (source_task IS NOT NULL OR source_attempt IS NOT NULL);

-- A task created by the reconciler says so in its event log.
ALTER TABLE task_events DROP CONSTRAINT task_events_type_check;
ALTER TABLE task_events ADD CONSTRAINT task_events_type_check
    CHECK (type IN ('status', 'progress', 'log', 'result', 'error', 'credit_used', 'payment_settled_late'));
