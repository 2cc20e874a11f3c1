-- Cooperative refunds of batch-settlement channels (issue 42): a payer asks,
-- Reeve claims every voucher it took on the channel and has the rest sent
-- back to the payer in the same transaction (the escrow's `multicall` of
-- `claimWithSignature` and `refundWithSignature`), signed by the receiver
-- authorizer.

-- The escrow's count of a channel's refunds at Reeve's last read: a refund
-- is signed for the current count, and the scheme's channel state tells it
-- to the buyer (`refundNonce`).
ALTER TABLE batch_channels
    ADD COLUMN refund_nonce BIGINT NOT NULL DEFAULT 0 CHECK (refund_nonce >= 0);

-- Every refund Reeve had sent and saw land, one per refund count: what an
-- operator reads, and what answers the same request sent again.
CREATE TABLE batch_refunds (
    channel_id   TEXT        NOT NULL REFERENCES batch_channels (channel_id),
    -- The count the refund was signed for (the escrow's refundNonce before).
    refund_nonce BIGINT      NOT NULL CHECK (refund_nonce >= 0),
    -- What the channel was charged, all of it claimed in the same
    -- transaction: the seller keeps exactly this.
    charged      NUMERIC(39) NOT NULL CHECK (charged >= 0),
    -- What went back to the payer.
    amount       NUMERIC(39) NOT NULL CHECK (amount > 0),
    -- The escrow's balance after it.
    balance      NUMERIC(39) NOT NULL CHECK (balance >= 0),
    transaction  TEXT        NOT NULL,
    -- SHA-256 of the payer's request as signed: the same request sent again
    -- is answered this refund, never a second one.
    request_hash BYTEA       NOT NULL UNIQUE,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (channel_id, refund_nonce)
);
