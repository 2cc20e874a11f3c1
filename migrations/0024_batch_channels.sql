-- x402 `batch-settlement` (issue 42): a buyer deposits once into the escrow,
-- then pays each task with a signed cumulative voucher that Reeve checks
-- itself, with no transaction; Reeve claims the vouchers later, many in one
-- transaction. So what a buyer owes is no longer one row per payment but a
-- running total per channel, kept here.
--
-- Amounts are the token's smallest units, as NUMERIC (uint128 fits in 39
-- digits), so totals are compared and added in SQL.

-- One row per channel Reeve has taken a voucher on.
CREATE TABLE batch_channels (
    -- The escrow's id for it: the EIP-712 hash of its configuration, bound
    -- to the chain and the escrow. Lowercase hex.
    channel_id            TEXT        PRIMARY KEY CHECK (channel_id ~ '^0x[0-9a-f]{64}$'),
    network               TEXT        NOT NULL,
    payer                 TEXT        NOT NULL CHECK (payer ~ '^0x[0-9a-f]{40}$'),
    -- The configuration as the payer signed it (the escrow needs it whole to
    -- claim).
    config                JSONB       NOT NULL,
    -- What accepted vouchers bought so far: the latest voucher's ceiling.
    charged               NUMERIC(39) NOT NULL DEFAULT 0 CHECK (charged >= 0),
    -- The escrow's answer at `read_at`: what the channel holds, what of it
    -- is claimed, and when the payer asked to withdraw (unix seconds, 0:
    -- never). A voucher is covered only by a balance read recently enough.
    balance               NUMERIC(39) NOT NULL CHECK (balance >= 0),
    total_claimed         NUMERIC(39) NOT NULL CHECK (total_claimed >= 0),
    withdraw_requested_at BIGINT      NOT NULL DEFAULT 0 CHECK (withdraw_requested_at >= 0),
    read_at               TIMESTAMPTZ NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Every voucher Reeve accepted, each buying one task. A voucher is unique
-- per channel and cumulative amount, so the same voucher sent twice finds
-- the task it bought and never buys a second.
CREATE TABLE batch_vouchers (
    channel_id  TEXT        NOT NULL REFERENCES batch_channels (channel_id),
    ceiling     NUMERIC(39) NOT NULL CHECK (ceiling > 0),
    -- What this voucher added to the channel's total: the task's price.
    price       NUMERIC(39) NOT NULL CHECK (price > 0),
    signature   TEXT        NOT NULL CHECK (signature ~ '^0x[0-9a-f]{130}$'),
    -- The task it bought; a deleted task leaves the voucher (the money) here.
    task_id     BYTEA       UNIQUE REFERENCES tasks (id) ON DELETE SET NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_id, ceiling)
);
