-- Metered prices (x402 `upto`): the payer signs a ceiling through Permit2 when
-- the task is created, and Reeve settles what the task used when it ends, or
-- nothing. So an attempt may now outlive its request by the task's whole run:
-- it keeps the signed document (the worker settles with it), and moves
--   verifying  → the create's /verify is under way (nothing can be charged);
--   authorized → verified, its task stored and queued, nothing charged yet;
--   capturing  → the worker sent the used amount to be settled; its outcome
--                is open until the chain shows it;
--   settled    → charged `charged`, with `transaction`;
--   released   → nothing charged, nor ever can be: the task failed, was
--                canceled or used nothing (`reason` says which);
--   failed     → refused at create (nothing stored), or the capture was
--                refused (the task ends `payment_not_captured`).
ALTER TABLE payment_attempts ADD COLUMN scheme TEXT NOT NULL DEFAULT 'exact' CHECK (scheme IN ('exact', 'upto'));
ALTER TABLE payment_attempts ADD COLUMN document JSONB;
ALTER TABLE payment_attempts ADD COLUMN charged TEXT CHECK (charged ~ '^[0-9]+$');
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_status_check;
ALTER TABLE payment_attempts ADD CONSTRAINT payment_attempts_status_check
    CHECK (status IN ('settling', 'settled', 'failed', 'verifying', 'authorized', 'capturing', 'released'));
-- What the worker and the sweeper look for: metered payments not settled yet.
CREATE INDEX payment_attempts_open_upto ON payment_attempts (task_id) WHERE status IN ('authorized', 'capturing');

-- The metered payment as its buyer sees it, shown with the task everywhere
-- (GET /v1/tasks/{id}, the task list, MCP, the console): authorized up to X;
-- charged Y with its transaction; or released, nothing charged. NULL for a
-- free task or one paid `exact`.
ALTER TABLE tasks ADD COLUMN payment JSONB;
