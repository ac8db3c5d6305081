-- The Knecht CI domain: projects, versioned workflows, runs, their actions, and logs.
CREATE TABLE projects (
    id             INTEGER PRIMARY KEY,
    slug           TEXT NOT NULL UNIQUE,
    name           TEXT NOT NULL,
    description    TEXT NOT NULL DEFAULT '',
    repository_url TEXT NOT NULL DEFAULT '',
    default_branch TEXT NOT NULL DEFAULT 'main',
    created_at     TEXT NOT NULL
);

CREATE TABLE branches (
    project_id INTEGER NOT NULL REFERENCES projects(id),
    name       TEXT NOT NULL,
    head_sha   TEXT NOT NULL,
    PRIMARY KEY (project_id, name)
);

CREATE TABLE workflows (
    id              INTEGER PRIMARY KEY,
    project_id      INTEGER NOT NULL REFERENCES projects(id),
    name            TEXT NOT NULL,
    path            TEXT NOT NULL,
    current_version INTEGER NOT NULL DEFAULT 1,
    created_at      TEXT NOT NULL,
    UNIQUE (project_id, name)
);

CREATE TABLE workflow_versions (
    workflow_id INTEGER NOT NULL REFERENCES workflows(id),
    version     INTEGER NOT NULL,
    definition  TEXT NOT NULL,
    inputs_json TEXT NOT NULL DEFAULT '{}',
    created_at  TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    PRIMARY KEY (workflow_id, version)
);

CREATE TABLE runs (
    id               INTEGER PRIMARY KEY,
    project_id       INTEGER NOT NULL REFERENCES projects(id),
    workflow_id      INTEGER NOT NULL REFERENCES workflows(id),
    workflow_version INTEGER NOT NULL,
    number           INTEGER NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    trigger          TEXT NOT NULL CHECK (trigger IN ('push', 'pull_request', 'schedule', 'manual', 'rerun')),
    branch           TEXT NOT NULL,
    commit_sha       TEXT NOT NULL,
    inputs_json      TEXT NOT NULL DEFAULT '{}',
    created_by       TEXT NOT NULL,
    queued_at        TEXT NOT NULL,
    started_at       TEXT,
    finished_at      TEXT,
    rerun_of         INTEGER REFERENCES runs(id)
);
CREATE INDEX runs_by_project ON runs (project_id, id DESC);
CREATE INDEX runs_by_workflow ON runs (workflow_id, id DESC);
CREATE INDEX runs_by_status ON runs (status, id DESC);
CREATE INDEX runs_by_project_status ON runs (project_id, status, id DESC);
CREATE INDEX runs_by_branch ON runs (project_id, branch, id DESC);
CREATE INDEX runs_by_rerun_of ON runs (rerun_of);

CREATE TABLE actions (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    position    INTEGER NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped', 'cancelled')),
    exit_code   INTEGER,
    started_at  TEXT,
    finished_at TEXT,
    UNIQUE (run_id, position)
);

-- Logs are stored line by line so that paging, tail and grep never load a huge log whole.
-- action_id 0 is the run's own log (runner output around the actions).
CREATE TABLE log_lines (
    run_id    INTEGER NOT NULL,
    action_id INTEGER NOT NULL,
    line_no   INTEGER NOT NULL,
    text      TEXT NOT NULL,
    PRIMARY KEY (run_id, action_id, line_no)
) WITHOUT ROWID;

CREATE TABLE project_variables (
    project_id INTEGER NOT NULL REFERENCES projects(id),
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    secret     INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (project_id, name)
);
