-- A Space ID can be rotated (issue 39, `POST /v1/space/rotate`). A Space
-- stays the same row, keyed by `idx` (the index of the ID it was created
-- with), so its tasks, uploads, payments and credits, which all refer to
-- `idx`, stay with it; what changes is the ID that opens it.
--
-- `login_idx`: the HMAC index of the Space's current ID, once it was
-- rotated; NULL while the first ID is current (its index is `idx`). A
-- session is opened by `COALESCE(login_idx, idx)`, unique across Spaces, so
-- the old ID finds nothing from the rotation on.
ALTER TABLE spaces
    ADD COLUMN login_idx BYTEA CHECK (octet_length(login_idx) = 16),
    -- Every session issued before this whole second is ended: the rotation
    -- ends all of a Space's sessions at once with one value, not a row per
    -- session. A token carries its expiry, so its issue is that less the
    -- session's lifetime (domain/sessions.rs).
    ADD COLUMN sessions_from TIMESTAMPTZ;

CREATE UNIQUE INDEX spaces_login_idx ON spaces ((COALESCE(login_idx, idx)));
