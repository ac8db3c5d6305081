"""Changing runs: queue a rerun or a dispatch, cancel a queued or running run.

Every change is one write transaction; state checks are conditional updates, so a run that
finished between proposal and execution is refused rather than overwritten.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.errors import ConflictError, NotFoundError
from mcp_knecht.knecht.workflows import action_names

ACTIVE = ("queued", "running")


async def run_row(db: Database | Transaction, run_id: int) -> Row:
    row = await db.fetch_one(
        "SELECT r.*, p.slug AS project, w.name AS workflow FROM runs r"
        " JOIN projects p ON p.id = r.project_id JOIN workflows w ON w.id = r.workflow_id WHERE r.id = ?",
        (run_id,),
    )
    if row is None:
        raise NotFoundError(f"Run {run_id} does not exist.")
    return row


async def branch_head(db: Database | Transaction, project_id: int, branch: str) -> str:
    row = await db.fetch_one(
        "SELECT head_sha FROM branches WHERE project_id = ? AND name = ?", (project_id, branch)
    )
    if row is None:
        names = await db.fetch_all("SELECT name FROM branches WHERE project_id = ? ORDER BY name", (project_id,))
        listing = ", ".join(r["name"] for r in names)
        raise NotFoundError(f"Branch {branch!r} does not exist in this project. Branches: {listing}.")
    return str(row["head_sha"])


def summary(row: Row) -> dict[str, Any]:
    keys = ("id", "number", "project", "workflow", "workflow_version", "status", "trigger", "branch",
            "commit_sha", "created_by", "queued_at", "started_at", "finished_at", "rerun_of")
    return {key: row.get(key) for key in keys}


async def queue_run(
    db: Database,
    *,
    workflow_id: int,
    branch: str,
    commit_sha: str,
    trigger: str,
    inputs: dict[str, Any],
    actor: str,
    rerun_of: int | None = None,
    note: str = "",
) -> dict[str, Any]:
    """Insert a queued run of the workflow's current version, with its actions pending."""
    now = clock.timestamp()
    async with db.transaction() as tx:
        workflow = await tx.fetch_one(
            "SELECT w.id, w.project_id, w.name, w.current_version, v.definition FROM workflows w"
            " JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.current_version WHERE w.id = ?",
            (workflow_id,),
        )
        if workflow is None:
            raise NotFoundError(f"Workflow {workflow_id} does not exist any more.")
        numbers = await tx.fetch_one("SELECT MAX(number) AS n FROM runs WHERE workflow_id = ?", (workflow_id,))
        number = int((numbers or {}).get("n") or 0) + 1
        await tx.execute(
            "INSERT INTO runs (project_id, workflow_id, workflow_version, number, status, trigger, branch,"
            " commit_sha, inputs_json, created_by, queued_at, rerun_of)"
            " VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
            (workflow["project_id"], workflow_id, workflow["current_version"], number, trigger, branch,
             commit_sha, json.dumps(inputs, sort_keys=True), actor, now, rerun_of),
        )
        created = await tx.fetch_one(
            "SELECT id FROM runs WHERE workflow_id = ? AND number = ?", (workflow_id, number)
        )
        assert created is not None
        run_id = int(created["id"])
        await tx.execute_many(
            "INSERT INTO actions (run_id, position, name, status) VALUES (?, ?, ?, 'pending')",
            [(run_id, position, name) for position, name in
             enumerate(action_names(workflow["definition"]), start=1)],
        )
        header = (
            f"{now} Run #{number} of {workflow['name']} (version {workflow['current_version']}) queued by "
            f"{actor} via {trigger}" + (f" (rerun of run {rerun_of})" if rerun_of else "") + note
        )
        await tx.execute_many(
            "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, 0, ?, ?)",
            [(run_id, 1, header), (run_id, 2, f"{now} Repository @ {branch} ({commit_sha[:12]})")],
        )
        row = await run_row(tx, run_id)
    return summary(row)


async def cancel_run(db: Database, run_id: int, actor: str, reason: str) -> dict[str, Any]:
    now = clock.timestamp()
    async with db.transaction() as tx:
        row = await run_row(tx, run_id)
        changed = await tx.execute(
            "UPDATE runs SET status = 'cancelled', finished_at = ? WHERE id = ? AND status IN ('queued', 'running')",
            (now, run_id),
        )
        if changed != 1:
            raise not_cancellable(row)
        await tx.execute(
            "UPDATE actions SET status = 'cancelled', finished_at = ? WHERE run_id = ? AND status = 'running'",
            (now, run_id),
        )
        await tx.execute(
            "UPDATE actions SET status = 'skipped' WHERE run_id = ? AND status = 'pending'", (run_id,)
        )
        last = await tx.fetch_one(
            "SELECT MAX(line_no) AS n FROM log_lines WHERE run_id = ? AND action_id = 0", (run_id,)
        )
        line = f"{now} Run cancelled by {actor}" + (f": {reason}" if reason else "") + "; remaining actions skipped"
        await tx.execute(
            "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, 0, ?, ?)",
            (run_id, int((last or {}).get("n") or 0) + 1, line),
        )
        row = await run_row(tx, run_id)
    return {"cancelled": True, "previous_status": "queued or running", "run": summary(row)}


def not_cancellable(row: Row) -> ConflictError:
    return ConflictError(
        f"Run {row['id']} is {row['status']}"
        + (f" (finished {row['finished_at']})" if row.get("finished_at") else "")
        + "; only queued or running runs can be cancelled. To run it again, use rerun_run.",
        details={"run_id": row["id"], "status": row["status"]},
    )
