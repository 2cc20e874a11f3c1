-- Sessions ended before their expiry (issue 39): `DELETE /v1/sessions/current`
-- and `reeve logout`. A session token is verified with the token key alone,
-- so ending one needs a record that every route taking a session reads: one
-- primary-key lookup of the token's random session id (domain/auth/token.rs),
-- on routes that reach Postgres anyway.
--
-- Only the ended sessions are stored, never the open ones, and a row is worth
-- keeping only until the token would have expired by itself: each new row
-- deletes a few rows past that (`expires_at` indexed), so the table holds at
-- most the sessions ended in the last 15 minutes.
CREATE TABLE revoked_sessions (
    session_id BYTEA       PRIMARY KEY CHECK (octet_length(session_id) = 12),
    space_idx  BYTEA       NOT NULL CHECK (octet_length(space_idx) = 16),
    expires_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX revoked_sessions_expires_at ON revoked_sessions (expires_at);
