-- The sweeper forgets every Space's pay links older than an hour (no call
-- can meet them any more): found by when they were made, without reading
-- the whole table on each sweep.
CREATE INDEX pay_links_created ON pay_links (created_at);
