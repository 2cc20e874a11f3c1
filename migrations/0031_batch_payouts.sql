-- Payouts the escrow may owe, and money a channel lost (issue 42).
--
-- A claim (the sweep's, or a cooperative refund's) credits what it claims
-- to the receiver inside the escrow; only a `settle` pays it out to
-- `payTo`. A claim whose answer was lost can land later, after the sweep that sent it has moved on, so the
-- receiver is written here whenever a read of a channel finds claims on it
-- that Reeve had not seen, and stays until a later read of the escrow shows
-- nothing of the receiver's claims left unpaid. Each sweep settles what the
-- rows' receivers are owed.
CREATE TABLE batch_payouts (
    network    TEXT        NOT NULL,
    -- Lowercase hex addresses, as the channel's configuration names them.
    receiver   TEXT        NOT NULL CHECK (receiver ~ '^0x[0-9a-f]{40}$'),
    token      TEXT        NOT NULL CHECK (token ~ '^0x[0-9a-f]{40}$'),
    -- When claims for it were last seen: a row is removed only by a read
    -- of the escrow made after that.
    owed_since TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (network, receiver, token)
);

-- What a channel's vouchers bought that its escrow no longer holds: the
-- payer withdrew before a claim landed (the sweep claims within a quarter of
-- the withdraw delay, so only a claim failing for the rest of it leaves
-- this). Written by the sweep when it finds it, claimed no more, and shown to
-- operators.
ALTER TABLE batch_channels
    ADD COLUMN written_off NUMERIC(39) NOT NULL DEFAULT 0 CHECK (written_off >= 0);
