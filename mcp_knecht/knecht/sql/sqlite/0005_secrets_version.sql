-- Secret values change outside any one server process: another replica executes an approved
-- `set`, the CI system writes its variables directly. Every change of project_variables bumps one
-- counter, which each server reads cheaply before a call and reloads the values it masks when the
-- counter moved (mcp_knecht.core.scrub.SecretRegistry.watch).
-- Trigger bodies keep their inner semicolon off the line end: migrations split statements there.
CREATE TABLE knecht_secrets_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT INTO knecht_secrets_version (id, version) VALUES (1, 0);
CREATE TRIGGER project_variables_inserted AFTER INSERT ON project_variables BEGIN
    UPDATE knecht_secrets_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER project_variables_updated AFTER UPDATE ON project_variables BEGIN
    UPDATE knecht_secrets_version SET version = version + 1 WHERE id = 1; END;
CREATE TRIGGER project_variables_deleted AFTER DELETE ON project_variables BEGIN
    UPDATE knecht_secrets_version SET version = version + 1 WHERE id = 1; END;
