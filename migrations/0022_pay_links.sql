-- Pay links (issue 40): an MCP client that declares URL elicitation and
-- sends no x402 payment is given a link to the console's pay page, where a
-- person pays with a browser wallet. A link is one offer: this Space, this
-- kind, this input (and its SHA-256), at these prices, until `expires_at`.
-- Its token is not stored: it is the link's id and an HMAC of it under the
-- token key, so a forged or altered token names no row. Paying creates the
-- task under the link's own idempotency key (`key`), so the page's payment,
-- a resent payment and the agent's retried call all answer that one task;
-- a task under the key is what makes the link used.
CREATE TABLE pay_links (
    id           BYTEA       PRIMARY KEY CHECK (octet_length(id) = 16),
    space_idx    BYTEA       NOT NULL REFERENCES spaces (idx) ON DELETE CASCADE,
    kind         TEXT        NOT NULL,
    input        JSONB       NOT NULL,
    input_sha256 TEXT        NOT NULL CHECK (input_sha256 ~ '^[0-9a-f]{64}$'),
    -- The `accepts` offered when the link was made (scheme, network, asset,
    -- amount, payTo): a catalog changed since is refused, never charged.
    prices       JSONB       NOT NULL,
    key          TEXT        NOT NULL UNIQUE,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL
);
-- A call without a requestState finds its link by what it asks for.
CREATE INDEX pay_links_offer ON pay_links (space_idx, kind, input_sha256, created_at DESC);
