"""Runs: `list_runs` and `get_run`, and the staged `rerun_run` and `cancel_run`.

Every change is one write transaction; state checks are conditional updates, so a run that
finished between proposal and execution is refused rather than overwritten. Values reach SQL only
as `?` parameters; optional filters pick from fixed WHERE fragments.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from mcp_knecht.ai.diagnoses import shown_diagnosis
from mcp_knecht.core import clock
from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.core.tools import Fact, Tool, ToolContext, ToolInput
from mcp_knecht.errors import ConflictError, NotFoundError
from mcp_knecht.knecht.definitions import action_names
from mcp_knecht.knecht.refs import branch_head, find_project

# --- Inputs --------------------------------------------------------------------------------------

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
RunTrigger = Literal["push", "pull_request", "schedule", "manual", "rerun"]
CommitSha = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]

MAX_RUNS_PER_PAGE = 50


class ListRunsInput(ToolInput):
    project: int | str | None = Field(
        default=None, description="Only runs of this project: numeric id or slug (e.g. 'payments-api')."
    )
    workflow: int | str | None = Field(
        default=None,
        description="Only runs of this workflow: numeric workflow id, or name (e.g. 'ci'). A name matches "
        "that workflow in every project unless `project` is given too.",
    )
    status: RunStatus | None = Field(default=None, description="Only runs with this status.")
    branch: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Only runs on this branch (exact name, e.g. 'main').",
    )
    trigger: RunTrigger | None = Field(default=None, description="Only runs started by this kind of trigger.")
    limit: int = Field(
        default=20,
        ge=1,
        le=MAX_RUNS_PER_PAGE,
        description=f"How many runs to return (1 to {MAX_RUNS_PER_PAGE}).",
    )
    before: int | None = Field(
        default=None,
        ge=1,
        description="Paging cursor: return only runs with an id lower than this. Pass the `next_cursor` "
        "of the previous page; omit it for the newest runs.",
    )


class GetRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The numeric id of the run (the `id` field of list_runs results).")


class RerunRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The run to re-run (it must have finished).")
    ref: Literal["same_commit", "branch_head"] = Field(
        default="same_commit",
        description="'same_commit' re-runs exactly the commit of the run (e.g. to retry a flaky failure); "
        "'branch_head' runs the current head of the run's branch (e.g. after a fix was pushed).",
    )
    commit_sha: CommitSha | None = Field(
        default=None,
        description="Leave empty: filled in when the call is proposed, so the approver sees the exact commit "
        "that will run. If given, it must equal what `ref` resolves to.",
    )
    workflow_version: int | None = Field(
        default=None,
        ge=1,
        description="Leave empty: the workflow's current version is filled in when the call is proposed, so "
        "the approver sees which definition will run; execution refuses if the workflow changed since.",
    )


class CancelRunInput(ToolInput):
    run_id: int = Field(ge=1, description="The run to cancel; only queued or running runs can be cancelled.")
    reason: str = Field(default="", max_length=500, description="Why, for the run log and the approver.")


# --- Descriptions --------------------------------------------------------------------------------

LIST_RUNS = f"""\
List CI runs, newest first, optionally filtered by project (id or slug), workflow (id or name), status \
(queued, running, succeeded, failed, cancelled), branch and trigger (push, pull_request, schedule, \
manual, rerun). Each run has id, per-workflow number, project, workflow and version, status, trigger, \
branch, commit SHA, who started it, queued/started/finished times, duration in seconds, rerun_of \
(the run it re-ran), and failed_action (id, position, name, exit code of the action that failed; null \
unless the run failed), so that triaging many failures needs no get_run each. Returns at most `limit` \
runs (default 20, max {MAX_RUNS_PER_PAGE}) and `next_cursor`: pass it as `before` to get the next, older \
page; it is null on the last page. Use get_run for all the actions of one run."""

GET_RUN = """\
Get one CI run by id with its actions in execution order: each action's id, position, name, status \
(succeeded, failed, skipped, cancelled, running, pending), exit code, start/finish times, duration and \
number of log lines. `failed_action` names the action that failed (null if none); actions after it are \
skipped. Also returns the run's inputs, rerun_of (the run this one re-ran), reruns (later runs that \
re-ran this one) and the size of the run's own log. Logs are not included: read them with the log \
tools (the run's own log is action_id 0). To diagnose a failure, read the failed action's log first; \
if the cause is not there, an earlier action's log may show it. When Knecht has diagnosed a failed run \
itself, `diagnosis` holds it: status (pending, done, failed, unavailable), the cause and fix in `summary`, \
and the ids of the actions whose logs show it in `actionIds`."""

RERUN_RUN = """\
Propose to run a finished run again (same workflow, branch and inputs), as a new run with trigger \
'rerun' and rerun_of set. `ref` = 'same_commit' (default) re-runs the exact commit, e.g. to retry a flaky \
network failure or timeout; 'branch_head' runs the branch's current head, e.g. after a fix was pushed. The \
commit is resolved when you call this, so the approver approves exactly what will run. Queued or running \
runs cannot be re-run. Returns the new run once executed."""

CANCEL_RUN = """\
Propose to cancel a queued or running run: its running action is cancelled, pending ones are skipped. A \
run that already finished (succeeded, failed, cancelled) cannot be cancelled: you get a clear error at \
once. Give a short `reason`; it goes into the run log."""

RUN_FACTS = {
    "project": Fact(str, "the run's project (slug)"),
    "workflow": Fact(str, "the run's workflow (name)"),
    "branch": Fact(str, "the branch the run is on"),
    "created_by": Fact(str, "who started the run"),
    "own_run": Fact(bool, "true when the caller started the run (the proposer, once approved)"),
}
"""What policy rules on rerun_run and cancel_run may test besides the arguments: the run's own
facts, so a rule on `branch` holds for the branch the run is on, whatever the model typed."""

# --- Tools ---------------------------------------------------------------------------------------


class RunTools:
    """The run tools, bound to one store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def list_runs(self, args: ListRunsInput, ctx: ToolContext) -> dict[str, Any]:
        return await list_runs(self.db, project=args.project, workflow=args.workflow, status=args.status,
                               branch=args.branch, trigger=args.trigger, limit=args.limit, before=args.before)

    async def get_run(self, args: GetRunInput, ctx: ToolContext) -> dict[str, Any]:
        run = await get_run(self.db, args.run_id)
        if run["status"] == "failed" and (diagnosis := await shown_diagnosis(self.db, args.run_id)) is not None:
            run["diagnosis"] = diagnosis  # stored by the AI layer (mcp_knecht/ai/diagnoses.py)
        return run

    async def freeze_rerun(self, args: RerunRunInput, ctx: ToolContext) -> RerunRunInput:
        run = await run_row(self.db, args.run_id)
        if run["status"] in ACTIVE:
            raise ConflictError(
                f"Run {args.run_id} is still {run['status']}; only a finished run can be re-run "
                "(cancel it first with cancel_run, or wait)."
            )
        resolved = (
            run["commit_sha"] if args.ref == "same_commit"
            else await branch_head(self.db, run["project_id"], run["branch"])
        )
        if args.commit_sha is not None and args.commit_sha != resolved:
            raise ConflictError(
                f"commit_sha {args.commit_sha[:12]} is not what ref={args.ref!r} resolves to ({resolved[:12]}); "
                "leave commit_sha empty."
            )
        version = await current_version(self.db, run["workflow_id"])
        if args.workflow_version is not None and args.workflow_version != version:
            raise ConflictError(f"workflow_version {args.workflow_version} is not the workflow's current version "
                                f"({version}); leave workflow_version empty.")
        return args.model_copy(update={"commit_sha": resolved, "workflow_version": version})

    async def preview_rerun(self, args: RerunRunInput, ctx: ToolContext) -> dict[str, Any]:
        run = await run_row(self.db, args.run_id)
        assert args.workflow_version is not None
        return {"run": summary(run),
                "will_run": {"branch": run["branch"], "commit_sha": args.commit_sha, "ref": args.ref,
                             **await definition_shown(self.db, run["workflow_id"], args.workflow_version)}}

    async def rerun(self, args: RerunRunInput, ctx: ToolContext) -> dict[str, Any]:
        assert args.commit_sha is not None and args.workflow_version is not None
        run = await run_row(self.db, args.run_id)
        if run["status"] in ACTIVE:
            raise ConflictError(f"Run {args.run_id} is {run['status']} again; not re-running it twice.")
        new = await queue_run(
            self.db, workflow_id=run["workflow_id"], version=args.workflow_version, branch=run["branch"],
            commit_sha=args.commit_sha, trigger="rerun", inputs=json.loads(run["inputs_json"] or "{}"),
            actor=ctx.actor.subject, rerun_of=run["id"],
        )
        return {"run": new, "next": f"Follow it with get_run(run_id={new['id']})."}

    async def preview_cancel(self, args: CancelRunInput, ctx: ToolContext) -> dict[str, Any]:
        run = await run_row(self.db, args.run_id)
        if run["status"] not in ACTIVE:
            raise not_cancellable(run)  # refused at once, not staged for nothing
        return {"run": summary(run)}

    async def cancel(self, args: CancelRunInput, ctx: ToolContext) -> dict[str, Any]:
        return await cancel_run(self.db, args.run_id, ctx.actor.subject, args.reason)

    async def facts(self, args: RerunRunInput | CancelRunInput, ctx: ToolContext) -> dict[str, Any]:
        """What policy rules on rerun_run and cancel_run see of the run (RUN_FACTS)."""
        run = await run_row(self.db, args.run_id)
        return {"project": run["project"], "workflow": run["workflow"], "branch": run["branch"],
                "created_by": run["created_by"], "own_run": run["created_by"] == ctx.actor.subject}

    def tools(self) -> list[Tool]:
        return [
            Tool(name="list_runs", description=LIST_RUNS, scope="runs:read", input_model=ListRunsInput,
                 handler=self.list_runs, title="List runs"),
            Tool(name="get_run", description=GET_RUN, scope="runs:read", input_model=GetRunInput,
                 handler=self.get_run, title="Get a run"),
            Tool(name="rerun_run", description=RERUN_RUN, scope="runs:write", input_model=RerunRunInput,
                 handler=self.rerun, effect="write", preview=self.preview_rerun, freeze=self.freeze_rerun,
                 frozen_fields=("commit_sha", "workflow_version"), facts=self.facts, fact_fields=RUN_FACTS,
                 title="Re-run a run"),
            Tool(name="cancel_run", description=CANCEL_RUN, scope="runs:write", input_model=CancelRunInput,
                 handler=self.cancel, effect="write", preview=self.preview_cancel, facts=self.facts,
                 fact_fields=RUN_FACTS, title="Cancel a run"),
        ]


# --- Reading runs --------------------------------------------------------------------------------

_RUN_COLUMNS = """
    r.id, r.number, r.project_id, p.slug AS project, r.workflow_id, w.name AS workflow,
    r.workflow_version, r.status, r.trigger, r.branch, r.commit_sha, r.created_by,
    r.queued_at, r.started_at, r.finished_at, r.rerun_of
"""
_RUN_FROM = " FROM runs r JOIN projects p ON p.id = r.project_id JOIN workflows w ON w.id = r.workflow_id"


def duration_seconds(started_at: str | None, finished_at: str | None) -> int | None:
    """Whole seconds between two stored timestamps (computed here: date math is not portable SQL); None
    when either is missing or no moment (the CI system, or someone, wrote something else)."""
    started, finished = clock.readable(started_at), clock.readable(finished_at)
    if started is None or finished is None:
        return None
    return int((finished - started).total_seconds())


def _with_duration(row: Row) -> dict[str, Any]:
    return {**row, "duration_seconds": duration_seconds(row["started_at"], row["finished_at"])}


async def _listed(db: Database, rows: list[Row]) -> list[dict[str, Any]]:
    """Runs as the read tools list them: their columns, their duration, and for a failed run the
    action that failed (one query for the whole page)."""
    failed_ids = [row["id"] for row in rows if row["status"] == "failed"]
    failed: dict[int, dict[str, Any]] = {}
    if failed_ids:
        actions = await db.fetch_all(
            "SELECT run_id, id, position, name, exit_code FROM actions WHERE status = 'failed'"
            f" AND run_id IN ({', '.join('?' * len(failed_ids))}) ORDER BY run_id, position",
            failed_ids,
        )
        for action in actions:
            failed.setdefault(action.pop("run_id"), action)
    return [{**_with_duration(row), "failed_action": failed.get(row["id"])} for row in rows]


async def recent_runs(db: Database, project_id: int, limit: int) -> list[dict[str, Any]]:
    """A project's newest runs, as list_runs shows them."""
    rows = await db.fetch_all(
        f"SELECT {_RUN_COLUMNS}{_RUN_FROM} WHERE r.project_id = ? ORDER BY r.id DESC LIMIT ?", (project_id, limit)
    )
    return await _listed(db, rows)


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
    for column, value in (("r.status = ?", status), ("r.branch = ?", branch), ("r.trigger = ?", trigger),
                          ("r.id < ?", before)):
        if value is not None:
            where.append(column)
            params.append(value)
    # One extra row tells whether another page exists without a COUNT over a large table.
    rows = await db.fetch_all(*_runs_page(where, params, ids, limit + 1))
    page = rows[:limit]
    next_cursor = page[-1]["id"] if len(rows) > limit else None
    return {"runs": await _listed(db, page), "next_cursor": next_cursor}


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

    run = _with_duration({k: v for k, v in row.items() if k != "inputs_json"})
    run["inputs"] = json.loads(row["inputs_json"] or "{}")
    run["actions"] = [
        {**a, "duration_seconds": duration_seconds(a["started_at"], a["finished_at"]),
         "log_lines": lines.get(a["id"], 0)}
        for a in actions
    ]
    failed = next((a for a in actions if a["status"] == "failed"), None)
    run["failed_action"] = (
        {k: failed[k] for k in ("id", "position", "name", "exit_code")} if failed is not None else None
    )
    run["run_log_lines"] = lines.get(0, 0)
    run["reruns"] = reruns
    return run


# --- Changing runs -------------------------------------------------------------------------------

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


def summary(row: Row) -> dict[str, Any]:
    """A run as the write tools show it (in previews and results)."""
    keys = ("id", "number", "project", "workflow", "workflow_version", "status", "trigger", "branch",
            "commit_sha", "created_by", "queued_at", "started_at", "finished_at", "rerun_of")
    return {key: row.get(key) for key in keys}


async def current_version(db: Database, workflow_id: int) -> int:
    row = await db.fetch_one("SELECT current_version FROM workflows WHERE id = ?", (workflow_id,))
    if row is None:
        raise NotFoundError(f"Workflow {workflow_id} does not exist.")
    return int(row["current_version"])


async def definition_shown(db: Database, workflow_id: int, version: int) -> dict[str, Any]:
    """What a preview shows of the definition that will run: its version and its actions, in order."""
    row = await db.fetch_one("SELECT definition FROM workflow_versions WHERE workflow_id = ? AND version = ?",
                             (workflow_id, version))
    return {"workflow_version": version, "actions": action_names(row["definition"]) if row else []}


async def queue_run(
    db: Database,
    *,
    workflow_id: int,
    version: int,
    branch: str,
    commit_sha: str,
    trigger: str,
    inputs: dict[str, Any],
    actor: str,
    rerun_of: int | None = None,
) -> dict[str, Any]:
    """Insert a queued run of exactly `version` of the workflow (the version the approver saw), with its
    actions pending; refused when the workflow has moved on since."""
    now = clock.timestamp()
    async with db.transaction() as tx:
        workflow = await tx.fetch_one(
            "SELECT w.id, w.project_id, w.name, w.current_version, v.definition FROM workflows w"
            " JOIN workflow_versions v ON v.workflow_id = w.id AND v.version = w.current_version WHERE w.id = ?",
            (workflow_id,),
        )
        if workflow is None:
            raise NotFoundError(f"Workflow {workflow_id} does not exist any more.")
        if workflow["current_version"] != version:
            raise ConflictError(
                f"Workflow {workflow['name']!r} changed since it was proposed: version {version} was shown, version "
                f"{workflow['current_version']} is current. Nothing was started; propose it again.",
                details={"workflow_id": workflow_id, "proposed_version": version,
                         "current_version": workflow["current_version"]})
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
            f"{actor} via {trigger}" + (f" (rerun of run {rerun_of})" if rerun_of else "")
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
