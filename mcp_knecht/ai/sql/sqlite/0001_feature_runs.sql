-- AI features (issue 14): one row per feature run: model, steps, tokens, cost where known, the tool
-- calls and their gate outcomes. Namespace `ai` (mcp_knecht.ai.tables.AI_MIGRATIONS).
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
