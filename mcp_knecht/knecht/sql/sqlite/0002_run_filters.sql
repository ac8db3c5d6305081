-- list_runs filters without a project: by branch, by trigger (newest first). Without them a filter
-- that matches few runs scans the whole table (85 ms over a million runs).
CREATE INDEX runs_by_branch_only ON runs (branch, id DESC);
CREATE INDEX runs_by_trigger ON runs (trigger, id DESC);
