-- Frozen calls waiting for, or decided by, a human.
-- pending → approved → executing → succeeded | failed;  pending → rejected | expired.
CREATE TABLE proposals (
    id               INTEGER PRIMARY KEY,
    tool             TEXT NOT NULL,
    action           TEXT,
    arguments_json   TEXT NOT NULL,
    arguments_hash   TEXT NOT NULL,
    proposer_subject TEXT NOT NULL,
    proposer_client  TEXT NOT NULL,
    proposer_scopes  TEXT NOT NULL,
    rule             TEXT NOT NULL,
    preview_json     TEXT,
    status           TEXT NOT NULL CHECK (status IN
                         ('pending', 'approved', 'executing', 'succeeded', 'failed', 'rejected', 'expired')),
    created_at       TEXT NOT NULL,
    expires_at       TEXT NOT NULL,
    decided_by       TEXT,
    decided_at       TEXT,
    reason           TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    result_json      TEXT,
    error            TEXT
);
CREATE INDEX proposals_by_status ON proposals (status, id);
CREATE INDEX proposals_by_subject ON proposals (proposer_subject, id);
