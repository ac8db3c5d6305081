-- The pending proposals whose time has run out, found by their expiry: what the expiry sweep writes
-- `expired` every 30 s, and what a listing of `expired` proposals reads beside the written ones.
-- Without it both walked every pending row (1,000,000 proposals, a tenth pending: 75 ms and 92 ms).
-- The index is on an expression so that only a statement naming `expires_at || ''` can use it. SQLite's
-- planner has no histograms: over 1,000,000 proposals, after ANALYZE, it planned `status = 'pending'
-- AND expires_at > ? ORDER BY id DESC LIMIT 100` onto a plain `(expires_at) WHERE status = 'pending'`
-- (a range over every waiting proposal and a sort: 0.3 ms -> 200 ms). Mirrors
-- sql/postgresql/0009_overdue_index.sql.
CREATE INDEX proposals_overdue ON proposals (expires_at || '') WHERE status = 'pending';
