-- The web page's own tables (namespace `web`). Mirrors sql/sqlite/0001_web.sql.

-- One-time sign-in links (`mcp-knecht login-link`): only a keyed hash of the link's secret is kept,
-- and a seal (a server-keyed MAC) binds the subject and scopes to it, so neither a reader nor a writer
-- of this table can sign in with, or alter, a link. Redeeming is one conditional UPDATE: single use
-- across every replica.
CREATE TABLE web_login_links (
    token_hash  TEXT COLLATE "C" PRIMARY KEY,
    subject     TEXT COLLATE "C" NOT NULL,
    scopes      TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    used_at     TEXT COLLATE "C",
    seal        TEXT COLLATE "C" NOT NULL
);
CREATE INDEX web_login_links_by_expiry ON web_login_links (expires_at);

-- Sessions: the signed cookie carries subject and scopes; this row lets signing out end it everywhere.
CREATE TABLE web_sessions (
    id          TEXT COLLATE "C" PRIMARY KEY,
    subject     TEXT COLLATE "C" NOT NULL,
    created_at  TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    ended_at    TEXT COLLATE "C"
);
CREATE INDEX web_sessions_by_expiry ON web_sessions (expires_at);
