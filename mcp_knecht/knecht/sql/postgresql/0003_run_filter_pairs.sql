-- list_runs: pairs of low-selectivity filters whose intersection is small (a trigger on a branch,
-- a status on a branch, a status with a trigger) would otherwise scan every run that one filter
-- matches (30-70 ms over a million runs).
CREATE INDEX runs_by_branch_trigger ON runs (branch, trigger, id DESC);
CREATE INDEX runs_by_branch_status ON runs (branch, status, id DESC);
CREATE INDEX runs_by_status_trigger ON runs (status, trigger, id DESC);
