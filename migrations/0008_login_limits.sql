-- Spaces created and sessions opened per client address (issue 25). In
-- Postgres so that every auth and mcp Lambda instance, and every
-- `reeve serve`, spend one budget per address: a limit held in one process
-- was no limit across Lambda instances, and MCP's create_space passed none.
--
-- One row per (client, action), a GCRA limiter (domain/login_limits.rs):
-- `tat` is when the address's budget is full again. A row whose `tat` has
-- passed means the same as no row, so the requests that spend a budget
-- delete a few such rows each (`tat` indexed): idle addresses do not pile up.
CREATE TABLE login_limits (
    -- An IPv4 address, or an IPv6 /64 (adapters/http/client_addr.rs).
    client  TEXT        NOT NULL,
    action  TEXT        NOT NULL CHECK (action IN ('space', 'session')),
    tat     TIMESTAMPTZ NOT NULL,
    -- Whether the last request was let through (what the upsert returns).
    allowed BOOLEAN     NOT NULL,
    PRIMARY KEY (client, action)
);

CREATE INDEX login_limits_tat ON login_limits (tat);
