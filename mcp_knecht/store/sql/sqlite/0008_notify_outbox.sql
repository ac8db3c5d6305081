-- Notifications (mcp_knecht/notify/): an outbox written in the same transaction as the proposal
-- state change it describes, and one delivery row per (event, destination), claimed by exactly one
-- worker at a time. Mirrors sql/postgresql/0008_notify_outbox.sql.
CREATE TABLE notify_outbox (
    id           INTEGER PRIMARY KEY,
    uid          TEXT NOT NULL UNIQUE,
    event        TEXT NOT NULL,
    proposal_id  INTEGER NOT NULL,
    payload_json TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    routed_at    TEXT
);
CREATE INDEX notify_outbox_unrouted ON notify_outbox (id) WHERE routed_at IS NULL;
CREATE INDEX notify_outbox_by_routed ON notify_outbox (routed_at);

CREATE TABLE notify_deliveries (
    id              INTEGER PRIMARY KEY,
    event_id        INTEGER NOT NULL REFERENCES notify_outbox (id) ON DELETE CASCADE,
    destination     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivering', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL,
    claimed_by      TEXT,
    lease_until     TEXT,
    last_error      TEXT,
    delivered_at    TEXT,
    UNIQUE (event_id, destination)
);
CREATE INDEX notify_deliveries_due ON notify_deliveries (status, next_attempt_at);
