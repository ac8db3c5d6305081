-- Secret values change outside any one server process: another replica executes an approved
-- `set`, the CI system writes its variables directly. Every change of project_variables bumps one
-- counter, which each server reads cheaply before a call and reloads the values it masks when the
-- counter moved (mcp_knecht.core.scrub.SecretRegistry.watch).
-- The body stays on one line: migrations split statements at a semicolon that ends a line.
CREATE TABLE knecht_secrets_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO knecht_secrets_version (id, version) VALUES (1, 0);
CREATE FUNCTION knecht_secrets_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE knecht_secrets_version SET version = version + 1 WHERE id = 1; RETURN NULL; END
$$;
CREATE TRIGGER project_variables_changed AFTER INSERT OR UPDATE OR DELETE ON project_variables
    FOR EACH STATEMENT EXECUTE FUNCTION knecht_secrets_changed();
