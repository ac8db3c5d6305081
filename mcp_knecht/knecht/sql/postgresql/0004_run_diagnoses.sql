-- The failure diagnosis of a run (issue 14), stored per run: Knecht's state, written by the AI layer
-- (mcp_knecht/ai/diagnoses.py), read by get_run.
-- Mirrors ../sqlite/0004_run_diagnoses.sql.
-- pending (claimed by `owner` until `lease_until`) → done | failed; unavailable: no model was configured.
-- One row per run: the INSERT … ON CONFLICT DO NOTHING that creates it is the claim.
CREATE TABLE run_diagnoses (
    run_id       BIGINT PRIMARY KEY,
    status       TEXT COLLATE "C" NOT NULL CHECK (status IN ('pending', 'done', 'failed', 'unavailable')),
    summary      TEXT COLLATE "C",
    action_ids   TEXT COLLATE "C",
    model        TEXT COLLATE "C",
    error        TEXT COLLATE "C",
    owner        TEXT COLLATE "C",
    lease_until  TEXT COLLATE "C",
    attempts     INTEGER NOT NULL DEFAULT 0,
    feature_run  BIGINT,
    created_at   TEXT COLLATE "C" NOT NULL,
    updated_at   TEXT COLLATE "C" NOT NULL
);
CREATE INDEX run_diagnoses_by_status ON run_diagnoses (status, lease_until);
