-- Batch settlement paid at create (issue 42): every accepted voucher now
-- records who bought with it and what, so that the same voucher sent again
-- answers the task it bought only to the Space that bought it and for the
-- same request (anything else is told where the channel stands), and so that
-- a voucher-paid task that ends without its work leaves a credit in the
-- asset the catalog priced it in, as an `exact` one does.
--
-- No voucher was ever recorded before this migration (a batch payment was
-- refused at create), so the columns can be required at once.
ALTER TABLE batch_vouchers
    -- Not a reference: a voucher is money Reeve still claims, kept whatever
    -- becomes of the Space.
    ADD COLUMN space_idx    BYTEA NOT NULL CHECK (octet_length(space_idx) = 16),
    -- SHA-256 of the request it paid for (kind, input, Idempotency-Key).
    ADD COLUMN request_hash BYTEA NOT NULL CHECK (octet_length(request_hash) = 32),
    -- The token as the catalog's offer spells it (a credit is matched on it).
    ADD COLUMN asset        TEXT  NOT NULL;
