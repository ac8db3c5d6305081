-- AI features (issue 14): one row per feature run (usage, cost), and the stored failure diagnosis
-- of each run. Namespace `ai` (mcp_knecht.ai.runtime.AI_MIGRATIONS).
CREATE TABLE ai_feature_runs (
    id            INTEGER PRIMARY KEY,
    feature       TEXT NOT NULL,
    subject       TEXT NOT NULL,
    client        TEXT NOT NULL,
    model         TEXT,
    status        TEXT NOT NULL CHECK (status IN ('done', 'failed', 'unavailable')),
    steps         INTEGER NOT NULL DEFAULT 0,
    requests      INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd      REAL,
    tool_calls    TEXT NOT NULL DEFAULT '[]',
    error         TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT NOT NULL
);
CREATE INDEX ai_feature_runs_by_feature ON ai_feature_runs (feature, id);

-- pending (claimed by `owner` until `lease_until`) → done | failed; unavailable: no model was configured.
-- One row per run: the INSERT … ON CONFLICT DO NOTHING that creates it is the claim.
CREATE TABLE run_diagnoses (
    run_id       INTEGER PRIMARY KEY,
    status       TEXT NOT NULL CHECK (status IN ('pending', 'done', 'failed', 'unavailable')),
    summary      TEXT,
    action_ids   TEXT,
    model        TEXT,
    error        TEXT,
    owner        TEXT,
    lease_until  TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    feature_run  INTEGER,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE INDEX run_diagnoses_by_status ON run_diagnoses (status, lease_until);
