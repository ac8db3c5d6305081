-- Proposals carry a seal: a server-keyed MAC over everything that decides what runs (core/keys.py).
ALTER TABLE proposals ADD COLUMN seal TEXT;
-- The head of the audit chain, kept outside the audit table: `audit verify` checks that the chain
-- ends where the anchor says (no newest rows deleted) and that the anchor's MAC holds. Rows from
-- `keyed_from` on are linked with a keyed MAC; older rows (release 0.1.0) with plain SHA-256. The
-- anchor starts unsigned (mac ''); the first keyed append signs it.
CREATE TABLE audit_anchor (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    row_count  INTEGER NOT NULL,
    head_id    INTEGER NOT NULL,
    head_hash  TEXT NOT NULL,
    keyed_from INTEGER NOT NULL,
    mac        TEXT NOT NULL
);
INSERT INTO audit_anchor (id, row_count, head_id, head_hash, keyed_from, mac)
    SELECT 1, COUNT(*), COALESCE(MAX(id), 0),
           COALESCE((SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1), ''), COALESCE(MAX(id), 0) + 1, ''
    FROM audit_log;
-- An identical pending proposal by the same proposer is found, not made twice.
CREATE INDEX proposals_by_call ON proposals (proposer_subject, arguments_hash, status);
