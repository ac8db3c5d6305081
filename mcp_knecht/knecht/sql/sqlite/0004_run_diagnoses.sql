-- The failure diagnosis of a run (issue 14), stored per run: Knecht's state, written by the AI layer
-- (mcp_knecht/ai/diagnoses.py), read by get_run.
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
