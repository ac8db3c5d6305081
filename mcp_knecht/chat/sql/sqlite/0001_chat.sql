-- The chat's own tables (namespace `chat`, mcp_knecht.chat.store.CHAT_MIGRATIONS). Mirrored by
-- ../postgresql/0001_chat.sql; a test keeps the two in step.

-- A conversation belongs to the subject who started it; nobody else can read or continue it.
CREATE TABLE chat_conversations (
    id          TEXT PRIMARY KEY,
    subject     TEXT NOT NULL,
    title       TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE INDEX chat_conversations_by_subject ON chat_conversations (subject, updated_at);

-- Only what the person and the assistant said: tool calls live inside a turn and are never stored.
-- `kind` 'followup' marks the message Knecht appends when a proposal of the conversation is decided;
-- an assistant message that staged a proposal keeps it (`proposal_id`) and the page it opened (`action_json`).
CREATE TABLE chat_messages (
    id               INTEGER PRIMARY KEY,
    conversation_id  TEXT NOT NULL REFERENCES chat_conversations (id) ON DELETE CASCADE,
    role             TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    kind             TEXT NOT NULL DEFAULT 'message' CHECK (kind IN ('message', 'followup')),
    content          TEXT NOT NULL,
    proposal_id      INTEGER,
    action_json      TEXT,
    created_at       TEXT NOT NULL
);
CREATE INDEX chat_messages_by_conversation ON chat_messages (conversation_id, id);

-- The follow-up owed to a conversation when its proposal is decided, and the claim of the worker
-- delivering it: `waiting` until a worker claims it (owner, lease_until) and commits the messages
-- together with `done`, conditional on still holding the claim. `actor_json`: who the turn runs as.
CREATE TABLE chat_followups (
    proposal_id      INTEGER PRIMARY KEY,
    conversation_id  TEXT NOT NULL REFERENCES chat_conversations (id) ON DELETE CASCADE,
    actor_json       TEXT NOT NULL,
    status           TEXT NOT NULL DEFAULT 'waiting' CHECK (status IN ('waiting', 'done')),
    owner            TEXT,
    lease_until      TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    error            TEXT,
    created_at       TEXT NOT NULL,
    done_at          TEXT
);
CREATE INDEX chat_followups_waiting ON chat_followups (status, proposal_id);
