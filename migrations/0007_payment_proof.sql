-- Proof of payment is the transfer to payTo, found in the chain's logs: the
-- transaction whose AuthorizationUsed(payer, nonce) log the token emitted,
-- whose receipt succeeded and holds a Transfer of exactly the amount from the
-- payer to payTo. The search for it starts at the block the chain was at when
-- the attempt began (NULL: unknown, for an attempt recorded before this, or
-- when the chain could not be read then).
ALTER TABLE payment_attempts ADD COLUMN from_block BIGINT CHECK (from_block >= 0);

-- EIP-3009 nonces are per token: one payer's nonce on two assets of one
-- network is two authorizations.
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_network_payer_nonce_key;
CREATE UNIQUE INDEX payment_attempts_authorization ON payment_attempts (network, lower(asset), payer, nonce);

-- A payment sent again by the Space that paid is answered with what it bought,
-- whatever that Space was told before: nothing reads this any more.
ALTER TABLE payment_attempts DROP COLUMN told_pending;
