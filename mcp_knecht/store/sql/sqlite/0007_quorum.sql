-- The two-person rule. A proposal records how many distinct operators must approve it and the reason
-- of the policy rule that staged it (both covered by its seal); each approval is a row of its own,
-- sealed to the proposal, at most one per person. The approval that completes the quorum claims the
-- proposal in the same transaction (store/quorum.py).
ALTER TABLE proposals ADD COLUMN approvers INTEGER NOT NULL DEFAULT 1 CHECK (approvers >= 1);
ALTER TABLE proposals ADD COLUMN policy_reason TEXT;
CREATE TABLE proposal_approvals (
    id          INTEGER PRIMARY KEY,
    proposal_id INTEGER NOT NULL REFERENCES proposals (id),
    operator    TEXT NOT NULL,
    person      TEXT NOT NULL,
    approved_at TEXT NOT NULL,
    seal        TEXT NOT NULL,
    UNIQUE (proposal_id, person)
);
