-- Mirrors sql/sqlite/0005_proposal_inbox.sql.
-- The proposer's inbox: a decided proposal its agent has not seen yet has seen_at NULL;
-- list_proposals(unseen=true) returns each once and stamps it.
ALTER TABLE proposals ADD COLUMN seen_at TEXT COLLATE "C";
CREATE INDEX proposals_unseen ON proposals (proposer_subject, seen_at, id);
