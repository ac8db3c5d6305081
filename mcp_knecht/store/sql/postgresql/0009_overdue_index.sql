-- The pending proposals whose time has run out, found by their expiry: what the expiry sweep writes
-- `expired` every 30 s, and what a listing of `expired` proposals reads beside the written ones.
-- The same expression as sql/sqlite/0009_overdue_index.sql, so both stores run the same statements;
-- ANALYZE gathers this expression's statistics over the pending rows alone.
CREATE INDEX proposals_overdue ON proposals ((expires_at || '')) WHERE status = 'pending';
