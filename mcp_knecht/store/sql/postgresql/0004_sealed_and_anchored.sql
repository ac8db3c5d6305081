-- Mirrors sql/sqlite/0004_sealed_and_anchored.sql.
ALTER TABLE proposals ADD COLUMN seal TEXT COLLATE "C";
CREATE TABLE audit_anchor (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    row_count  BIGINT NOT NULL,
    head_id    BIGINT NOT NULL,
    head_hash  TEXT COLLATE "C" NOT NULL,
    keyed_from BIGINT NOT NULL,
    mac        TEXT COLLATE "C" NOT NULL
);
INSERT INTO audit_anchor (id, row_count, head_id, head_hash, keyed_from, mac)
    SELECT 1, COUNT(*), COALESCE(MAX(id), 0),
           COALESCE((SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1), ''), COALESCE(MAX(id), 0) + 1, ''
    FROM audit_log;
CREATE INDEX proposals_by_call ON proposals (proposer_subject, arguments_hash, status);
