-- Every gate outcome and every decision. Append-only; each row's hash covers the previous
-- row's hash, so an edited or deleted row breaks the chain.
CREATE TABLE audit_log (
    id             INTEGER PRIMARY KEY,
    at             TEXT NOT NULL,
    source         TEXT NOT NULL,
    subject        TEXT NOT NULL,
    client         TEXT NOT NULL,
    tool           TEXT NOT NULL,
    action         TEXT,
    outcome        TEXT NOT NULL,
    rule           TEXT,
    proposal_id    INTEGER,
    arguments_hash TEXT,
    detail         TEXT NOT NULL DEFAULT '{}',
    duration_ms    REAL,
    prev_hash      TEXT NOT NULL,
    hash           TEXT NOT NULL
);
CREATE INDEX audit_by_subject ON audit_log (subject, id);
CREATE INDEX audit_by_tool ON audit_log (tool, id);
