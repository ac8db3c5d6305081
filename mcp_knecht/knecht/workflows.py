"""Workflows: versioned definitions, their declared inputs, and validation of dispatch inputs."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row
from mcp_knecht.errors import ConflictError, InvalidArgumentsError, NotFoundError
from mcp_knecht.knecht.queries import find_project

_ACTION_NAME = re.compile(r"^\s*-\s*name:\s*['\"]?([A-Za-z0-9_.\-]+)", re.MULTILINE)


async def find_workflow(db: Database, workflow: int | str, project: int | str | None) -> Row:
    """The workflow row for an id, or a name within a project; a name alone must be unambiguous."""
    project_id = (await find_project(db, project))["id"] if project is not None else None
    if isinstance(workflow, int) or workflow.isdigit():
        row = await db.fetch_one("SELECT * FROM workflows WHERE id = ?", (int(workflow),))
        if row is not None and (project_id is None or row["project_id"] == project_id):
            return row
    elif project_id is not None:
        row = await db.fetch_one(
            "SELECT * FROM workflows WHERE name = ? AND project_id = ?", (workflow, project_id)
        )
        if row is not None:
            return row
    else:
        rows = await db.fetch_all("SELECT * FROM workflows WHERE name = ? ORDER BY id", (workflow,))
        if len(rows) == 1:
            return rows[0]
        if rows:
            raise InvalidArgumentsError(
                "workflow",
                [{"field": "project", "problem": f"{len(rows)} projects have a workflow named {workflow!r}; "
                  "give `project` too, or the workflow's numeric id"}],
            )
    where = "" if project is None else f" in project {project!r}"
    raise NotFoundError(f"Workflow {workflow!r} does not exist{where}. list_workflows shows the workflows.")


async def list_workflows(db: Database, project: int | str | None) -> list[dict[str, Any]]:
    params: tuple[Any, ...] = ()
    where = ""
    if project is not None:
        where = " WHERE w.project_id = ?"
        params = ((await find_project(db, project))["id"],)
    rows = await db.fetch_all(
        "SELECT w.id, p.slug AS project, w.name, w.path, w.current_version,"
        " v.created_at AS updated_at, v.created_by AS updated_by,"
        " (SELECT r.status FROM runs r WHERE r.workflow_id = w.id ORDER BY r.id DESC LIMIT 1) AS latest_run_status"
        " FROM workflows w JOIN projects p ON p.id = w.project_id"
        " JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.current_version"
        f"{where} ORDER BY p.slug, w.name",
        params,
    )
    return rows


async def get_workflow(
    db: Database, workflow: int | str, project: int | str | None, version: int | None
) -> dict[str, Any]:
    row = await find_workflow(db, workflow, project)
    wanted = version or row["current_version"]
    stored = await db.fetch_one(
        "SELECT version, definition, inputs_json, created_at, created_by FROM workflow_versions"
        " WHERE workflow_id = ? AND version = ?",
        (row["id"], wanted),
    )
    if stored is None:
        raise NotFoundError(
            f"Workflow {row['name']!r} has no version {wanted}; its versions are 1 to {row['current_version']}."
        )
    versions = await db.fetch_all(
        "SELECT version, created_at, created_by FROM workflow_versions WHERE workflow_id = ? ORDER BY version",
        (row["id"],),
    )
    project_row = await find_project(db, row["project_id"])
    return {
        "id": row["id"],
        "project": project_row["slug"],
        "name": row["name"],
        "path": row["path"],
        "version": stored["version"],
        "current_version": row["current_version"],
        "is_current": stored["version"] == row["current_version"],
        "definition": stored["definition"],
        "inputs": json.loads(stored["inputs_json"] or "{}"),
        "actions": action_names(stored["definition"]),
        "created_at": stored["created_at"],
        "created_by": stored["created_by"],
        "versions": versions,
    }


def action_names(definition: str) -> list[str]:
    """The action names of a definition, in order: every run first parses its workflow."""
    section = definition.split("\nactions:", 1)
    names = _ACTION_NAME.findall(section[1]) if len(section) == 2 else []
    return ["parse-workflow", *names]


def check_definition(definition: str) -> list[str]:
    """Cheap structural checks of a new definition; an empty list means it looks sound."""
    problems = []
    if "\t" in definition:
        problems.append("tabs are not allowed in YAML indentation")
    if not re.search(r"^name:\s*\S", definition, re.MULTILINE):
        problems.append("a top-level 'name:' is missing")
    if not re.search(r"^actions:\s*$", definition, re.MULTILINE):
        problems.append("a top-level 'actions:' list is missing")
    elif len(action_names(definition)) < 2:
        problems.append("'actions:' declares no action ('- name: …')")
    for number, line in enumerate(definition.splitlines(), start=1):
        # The classic mistake of the demo data: a second ': ' inside an unquoted scalar.
        stripped = line.strip()
        if stripped.startswith(("run:", "- run:")) and ": " in stripped.split(":", 1)[1]:
            value = stripped.split(":", 1)[1].strip()
            if not value.startswith(("'", '"', "|", ">")):
                problems.append(f"line {number}: mapping values are not allowed here; quote the command")
    return problems


def resolve_inputs(declared: dict[str, dict[str, Any]], given: dict[str, Any]) -> dict[str, Any]:
    """Check dispatch inputs against the declared ones; return the full set with defaults."""
    problems: list[dict[str, str]] = []
    for name in sorted(set(given) - set(declared)):
        expected = ", ".join(sorted(declared)) or "none"
        problems.append({"field": f"inputs.{name}", "problem": f"not a declared input; declared: {expected}"})
    resolved: dict[str, Any] = {}
    for name, spec in declared.items():
        if name not in given:
            if spec.get("required") and spec.get("default") is None:
                problems.append({"field": f"inputs.{name}", "problem": "required input is missing"})
            resolved[name] = spec.get("default")
            continue
        value = given[name]
        kind = spec.get("type", "string")
        ok = {
            "boolean": isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "string": isinstance(value, str),
            "choice": isinstance(value, str) and value in (spec.get("options") or []),
        }.get(kind, False)
        if not ok:
            wanted = f"one of {spec.get('options')}" if kind == "choice" else f"a {kind}"
            problems.append({"field": f"inputs.{name}", "problem": f"expected {wanted} (got {value!r})"})
        resolved[name] = value
    if problems:
        raise InvalidArgumentsError("dispatch_workflow", problems)
    return resolved


async def definition_diff(db: Database, workflow: Row, base_version: int, definition: str) -> dict[str, Any]:
    """The preview of an update: a unified diff from the base version to the proposed definition."""
    stored = await db.fetch_one(
        "SELECT definition FROM workflow_versions WHERE workflow_id = ? AND version = ?",
        (workflow["id"], base_version),
    )
    old = stored["definition"] if stored else ""
    diff = difflib.unified_diff(
        old.splitlines(keepends=True), definition.splitlines(keepends=True),
        fromfile=f"{workflow['path']} (version {base_version})",
        tofile=f"{workflow['path']} (proposed version {base_version + 1})",
    )
    return {
        "workflow_id": workflow["id"],
        "workflow": workflow["name"],
        "base_version": base_version,
        "current_version": workflow["current_version"],
        "diff": "".join(diff) or "(no change to the definition text)",
    }


async def update_workflow(
    db: Database,
    workflow_id: int,
    *,
    base_version: int,
    definition: str,
    inputs: dict[str, Any] | None,
    actor: str,
) -> dict[str, Any]:
    """Store version base+1, only if the workflow is still at `base_version` (no lost update)."""
    now = clock.timestamp()
    async with db.transaction() as tx:
        row = await tx.fetch_one("SELECT * FROM workflows WHERE id = ?", (workflow_id,))
        if row is None:
            raise NotFoundError(f"Workflow {workflow_id} does not exist any more.")
        if row["current_version"] != base_version:
            raise stale(row, base_version)
        if inputs is None:
            current = await tx.fetch_one(
                "SELECT inputs_json FROM workflow_versions WHERE workflow_id = ? AND version = ?",
                (workflow_id, base_version),
            )
            inputs_json = current["inputs_json"] if current else "{}"
        else:
            inputs_json = json.dumps(inputs, sort_keys=True)
        version = base_version + 1
        changed = await tx.execute(
            "UPDATE workflows SET current_version = ? WHERE id = ? AND current_version = ?",
            (version, workflow_id, base_version),
        )
        if changed != 1:
            raise stale(row, base_version)
        await tx.execute(
            "INSERT INTO workflow_versions (workflow_id, version, definition, inputs_json, created_at, created_by)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (workflow_id, version, definition, inputs_json, now, actor),
        )
    return {"workflow_id": workflow_id, "workflow": row["name"], "version": version,
            "previous_version": base_version, "created_at": now, "created_by": actor}


def stale(row: Row, base_version: int) -> ConflictError:
    return ConflictError(
        f"Workflow {row['name']!r} (id {row['id']}) changed since this update was proposed: it is at version "
        f"{row['current_version']} now, the proposal was based on version {base_version}. Nothing was changed; "
        "read the current definition with get_workflow and propose the update again.",
        details={"workflow_id": row["id"], "base_version": base_version, "current_version": row["current_version"]},
    )
