-- Listings stay fast at scale (scripts/bench_scale.py: 1M proposals, 10M audit rows): a proposer's
-- proposals by status, and the audit log by proposal, by source and by outcome, newest first.
CREATE INDEX proposals_by_subject_status ON proposals (proposer_subject, status, id);
CREATE INDEX audit_by_proposal ON audit_log (proposal_id, id);
CREATE INDEX audit_by_source ON audit_log (source, id);
CREATE INDEX audit_by_outcome ON audit_log (outcome, id);
