"""Read queries over the Knecht domain. Portable SQL only: a PostgreSQL backend runs the same text.

Values reach SQL only as `?` parameters; optional filters pick from fixed WHERE fragments.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row
from mcp_knecht.errors import NotFoundError

RECENT_RUNS = 5

_RUN_COLUMNS = """
    r.id, r.number, r.project_id, p.slug AS project, r.workflow_id, w.name AS workflow,
    r.workflow_version, r.status, r.trigger, r.branch, r.commit_sha, r.created_by,
    r.queued_at, r.started_at, r.finished_at, r.rerun_of
"""
_RUN_FROM = " FROM runs r JOIN projects p ON p.id = r.project_id JOIN workflows w ON w.id = r.workflow_id"


def duration_seconds(started_at: str | None, finished_at: str | None) -> int | None:
    """Whole seconds between two stored ISO timestamps (computed here: date math is not portable SQL)."""
    if not started_at or not finished_at:
        return None
    return int((clock.parse(finished_at) - clock.parse(started_at)).total_seconds())


def _run_summary(row: Row) -> dict[str, Any]:
    summary = dict(row)
    summary["duration_seconds"] = duration_seconds(row["started_at"], row["finished_at"])
    return summary


# --- Projects ------------------------------------------------------------------------------------


async def find_project(db: Database, project: int | str) -> Row:
    """The project row for an id or a slug; NotFoundError names what was asked for."""
    row: Row | None = None
    if isinstance(project, int):
        row = await db.fetch_one("SELECT * FROM projects WHERE id = ?", (project,))
    else:
        row = await db.fetch_one("SELECT * FROM projects WHERE slug = ?", (project,))
        if row is None and project.isdigit():
            # Models sometimes pass ids as strings; slugs are never purely numeric in practice.
            row = await db.fetch_one("SELECT * FROM projects WHERE id = ?", (int(project),))
    if row is None:
        raise NotFoundError(f"Project {project!r} does not exist. Use list_projects to see the projects.")
    return row


async def list_projects(db: Database) -> list[dict[str, Any]]:
    return await db.fetch_all(
        """
        SELECT p.id, p.slug, p.name, p.description, p.repository_url, p.default_branch,
               (SELECT COUNT(*) FROM workflows w WHERE w.project_id = p.id) AS workflow_count,
               (SELECT r.id FROM runs r WHERE r.project_id = p.id ORDER BY r.id DESC LIMIT 1)
                   AS latest_run_id,
               (SELECT r.status FROM runs r WHERE r.project_id = p.id ORDER BY r.id DESC LIMIT 1)
                   AS latest_run_status
        FROM projects p
        ORDER BY p.slug
        """
    )


async def get_project(db: Database, project: int | str) -> dict[str, Any]:
    row = await find_project(db, project)
    project_id = row["id"]
    workflows = await db.fetch_all(
        """
        SELECT w.id, w.name, w.path, w.current_version,
               (SELECT r.status FROM runs r WHERE r.workflow_id = w.id ORDER BY r.id DESC LIMIT 1)
                   AS latest_run_status
        FROM workflows w WHERE w.project_id = ? ORDER BY w.name
        """,
        (project_id,),
    )
    branches = await db.fetch_all(
        "SELECT name, head_sha FROM branches WHERE project_id = ? ORDER BY name", (project_id,)
    )
    recent = await db.fetch_all(
        f"SELECT {_RUN_COLUMNS}{_RUN_FROM} WHERE r.project_id = ? ORDER BY r.id DESC LIMIT ?",
        (project_id, RECENT_RUNS),
    )
    return {
        **row,
        "branches": branches,
        "workflows": workflows,
        "recent_runs": [_run_summary(r) for r in recent],
    }


# --- Runs ----------------------------------------------------------------------------------------


async def _workflow_ids(db: Database, workflow: int | str, project_id: int | None) -> list[int]:
    """Workflow ids matching an id or a name (a name without a project matches in every project)."""
    if isinstance(workflow, int):
        rows = await db.fetch_all("SELECT id, project_id FROM workflows WHERE id = ?", (workflow,))
        rows = [r for r in rows if project_id is None or r["project_id"] == project_id]
    elif project_id is None:
        rows = await db.fetch_all("SELECT id FROM workflows WHERE name = ? ORDER BY id", (workflow,))
    else:
        rows = await db.fetch_all(
            "SELECT id FROM workflows WHERE name = ? AND project_id = ?", (workflow, project_id)
        )
    if not rows:
        where = "" if project_id is None else " in that project"
        raise NotFoundError(
            f"Workflow {workflow!r} does not exist{where}. get_project lists a project's workflows."
        )
    return [r["id"] for r in rows]


async def list_runs(
    db: Database,
    *,
    project: int | str | None = None,
    workflow: int | str | None = None,
    status: str | None = None,
    branch: str | None = None,
    trigger: str | None = None,
    limit: int = 20,
    before: int | None = None,
) -> dict[str, Any]:
    """One page of runs, newest first, and the cursor for the next page (None on the last one)."""
    where: list[str] = []
    params: list[Any] = []
    project_id: int | None = None
    if project is not None:
        project_id = (await find_project(db, project))["id"]
        where.append("r.project_id = ?")
        params.append(project_id)
    ids = await _workflow_ids(db, workflow, project_id) if workflow is not None else []
    if status is not None:
        where.append("r.status = ?")
        params.append(status)
    if branch is not None:
        where.append("r.branch = ?")
        params.append(branch)
    if trigger is not None:
        where.append("r.trigger = ?")
        params.append(trigger)
    if before is not None:
        where.append("r.id < ?")
        params.append(before)
    # One extra row tells whether another page exists without a COUNT over a large table.
    rows = await db.fetch_all(*_runs_page(where, params, ids, limit + 1))
    page = rows[:limit]
    next_cursor = page[-1]["id"] if len(rows) > limit else None
    return {"runs": [_run_summary(r) for r in page], "next_cursor": next_cursor}


def _runs_page(where: list[str], params: list[Any], workflow_ids: list[int], limit: int) -> tuple[str, list[Any]]:
    """The newest `limit` runs matching `where`. Several workflows (a name shared by projects) become
    one index-ordered, limited scan per workflow, merged: never a sort of every matching run."""
    if len(workflow_ids) <= 1:
        conditions = [*where, *(["r.workflow_id = ?"] if workflow_ids else [])]
        clause = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return f"SELECT {_RUN_COLUMNS}{_RUN_FROM}{clause} ORDER BY r.id DESC LIMIT ?", [
            *params, *workflow_ids, limit]
    parts: list[str] = []
    values: list[Any] = []
    for index, workflow_id in enumerate(workflow_ids):
        clause = " AND ".join(["r.workflow_id = ?", *where])
        parts.append(
            f"SELECT * FROM (SELECT {_RUN_COLUMNS}{_RUN_FROM} WHERE {clause} ORDER BY r.id DESC LIMIT ?) AS w{index}"
        )
        values.extend([workflow_id, *params, limit])
    return f"SELECT * FROM ({' UNION ALL '.join(parts)}) AS merged ORDER BY id DESC LIMIT ?", [*values, limit]


async def get_run(db: Database, run_id: int) -> dict[str, Any]:
    row = await db.fetch_one(f"SELECT {_RUN_COLUMNS}, r.inputs_json{_RUN_FROM} WHERE r.id = ?", (run_id,))
    if row is None:
        raise NotFoundError(f"Run {run_id} does not exist.")
    actions = await db.fetch_all(
        "SELECT id, position, name, status, exit_code, started_at, finished_at"
        " FROM actions WHERE run_id = ? ORDER BY position",
        (run_id,),
    )
    counts = await db.fetch_all(
        "SELECT action_id, COUNT(*) AS lines FROM log_lines WHERE run_id = ? GROUP BY action_id", (run_id,)
    )
    lines = {c["action_id"]: c["lines"] for c in counts}
    reruns = await db.fetch_all("SELECT id, status FROM runs WHERE rerun_of = ? ORDER BY id", (run_id,))

    run = _run_summary({k: v for k, v in row.items() if k != "inputs_json"})
    run["inputs"] = json.loads(row["inputs_json"] or "{}")
    run["actions"] = [
        {
            **a,
            "duration_seconds": duration_seconds(a["started_at"], a["finished_at"]),
            "log_lines": lines.get(a["id"], 0),
        }
        for a in actions
    ]
    failed = next((a for a in actions if a["status"] == "failed"), None)
    run["failed_action"] = (
        {k: failed[k] for k in ("id", "position", "name", "exit_code")} if failed is not None else None
    )
    run["run_log_lines"] = lines.get(0, 0)
    run["reruns"] = reruns
    return run
