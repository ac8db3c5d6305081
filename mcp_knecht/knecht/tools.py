"""The Knecht toolset: read tools over projects and runs, built around one database."""

from __future__ import annotations

from typing import Any

from mcp_knecht.core.tools import Tool, ToolContext
from mcp_knecht.knecht import queries
from mcp_knecht.knecht.inputs import (
    MAX_RUNS_PER_PAGE,
    GetProjectInput,
    GetRunInput,
    ListProjectsInput,
    ListRunsInput,
)
from mcp_knecht.store.database import Database

LIST_PROJECTS = """\
List every Knecht CI project: id, slug, name, description, repository URL, default branch, the number \
of workflows, and the id and status of its latest run. Start here to find a project's id or slug, or to \
see at a glance which projects are currently failing. Takes no arguments; for workflows, branches and \
recent runs of one project use get_project."""

GET_PROJECT = """\
Get one Knecht project by numeric id or slug: its details, its branches with head commit SHAs, its \
workflows (id, name, file path, current version, status of the latest run) and its 5 most recent runs. \
Use it to learn which workflows a project has before filtering list_runs. For more runs use list_runs."""

LIST_RUNS = f"""\
List CI runs, newest first, optionally filtered by project (id or slug), workflow (id or name), status \
(queued, running, succeeded, failed, cancelled), branch and trigger (push, pull_request, schedule, \
manual, rerun). Each run has id, per-workflow number, project, workflow and version, status, trigger, \
branch, commit SHA, who started it, queued/started/finished times, duration in seconds, and rerun_of \
(the run it re-ran). Returns at most `limit` runs (default 20, max {MAX_RUNS_PER_PAGE}) and `next_cursor`: \
pass it as `before` to get the next, older page; it is null on the last page. Use get_run for the \
actions of one run."""

GET_RUN = """\
Get one CI run by id with its actions in execution order: each action's id, position, name, status \
(succeeded, failed, skipped, cancelled, running, pending), exit code, start/finish times, duration and \
number of log lines. `failed_action` names the action that failed (null if none); actions after it are \
skipped. Also returns the run's inputs, rerun_of (the run this one re-ran), reruns (later runs that \
re-ran this one) and the size of the run's own log. Logs are not included: read them with the log \
tools (the run's own log is action_id 0). To diagnose a failure, read the failed action's log first; \
if the cause is not there, an earlier action's log may show it."""


def knecht_tools(db: Database) -> list[Tool]:
    """The Knecht read tools, bound to `db`."""

    async def list_projects(_: ListProjectsInput, ctx: ToolContext) -> dict[str, Any]:
        return {"projects": await queries.list_projects(db)}

    async def get_project(args: GetProjectInput, ctx: ToolContext) -> dict[str, Any]:
        return await queries.get_project(db, args.project)

    async def list_runs(args: ListRunsInput, ctx: ToolContext) -> dict[str, Any]:
        return await queries.list_runs(
            db,
            project=args.project,
            workflow=args.workflow,
            status=args.status,
            branch=args.branch,
            trigger=args.trigger,
            limit=args.limit,
            before=args.before,
        )

    async def get_run(args: GetRunInput, ctx: ToolContext) -> dict[str, Any]:
        return await queries.get_run(db, args.run_id)

    return [
        Tool(
            name="list_projects",
            description=LIST_PROJECTS,
            scope="projects:read",
            input_model=ListProjectsInput,
            handler=list_projects,
            title="List projects",
            tags=frozenset({"knecht"}),
        ),
        Tool(
            name="get_project",
            description=GET_PROJECT,
            scope="projects:read",
            input_model=GetProjectInput,
            handler=get_project,
            title="Get a project",
            tags=frozenset({"knecht"}),
        ),
        Tool(
            name="list_runs",
            description=LIST_RUNS,
            scope="runs:read",
            input_model=ListRunsInput,
            handler=list_runs,
            title="List runs",
            tags=frozenset({"knecht"}),
        ),
        Tool(
            name="get_run",
            description=GET_RUN,
            scope="runs:read",
            input_model=GetRunInput,
            handler=get_run,
            title="Get a run",
            tags=frozenset({"knecht"}),
        ),
    ]
