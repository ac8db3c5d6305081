"""The Knecht read tools: projects, workflows, runs and logs, built around one database."""

from __future__ import annotations

from typing import Any

from mcp_knecht.ai.diagnoses import shown_diagnosis
from mcp_knecht.core.tools import Tool, ToolContext
from mcp_knecht.knecht import logs, queries, workflows
from mcp_knecht.knecht.inputs import (
    DEFAULT_LOG_LINES,
    MAX_LOG_LINES,
    MAX_RUNS_PER_PAGE,
    GetActionLogInput,
    GetProjectInput,
    GetRunInput,
    GetRunLogInput,
    GetWorkflowInput,
    ListProjectsInput,
    ListRunsInput,
    ListWorkflowsInput,
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
if the cause is not there, an earlier action's log may show it. When Knecht has diagnosed a failed run \
itself, `diagnosis` holds it: status (pending, done, failed, unavailable), the cause and fix in `summary`, \
and the ids of the actions whose logs show it in `actionIds`."""


LIST_WORKFLOWS = """\
List workflows (CI pipeline definitions), optionally of one project: id, project slug, name, file path, \
current version, when and by whom that version was made, and the status of the workflow's latest run. \
Use get_workflow for a definition's text and declared inputs."""

GET_WORKFLOW = """\
Get one workflow's definition (YAML text) at its current version, or at `version`: the text, the declared \
inputs (name → type, required, default, options) that dispatch_workflow validates against, the action \
names in run order, and the list of all versions with author and date. Address it by numeric id, or by \
name plus project. Read it when diagnosing a failure that may come from the workflow itself (bad YAML, a \
timeout setting, a missing cache), and before proposing update_workflow: `version` is the base of an \
update."""

_LOG_LIMITS = f"""\
Output is bounded: at most `limit` lines (default {DEFAULT_LOG_LINES}, max {MAX_LOG_LINES}) and about 24 KB; \
very long lines are cut. When more remains, `truncated` is true and `next_offset` says where to continue \
("truncated — next offset N"). `tail`: the last N lines (best first look at a failure). `offset`/`limit`: a \
window, line 1 is offset 0. `grep`: only lines containing a literal text (case-insensitive, no regex), \
searched forwards from `offset`, or backwards with `tail`; a search of a huge log stops after a time budget \
and says which lines it searched. Every line comes with its number `n`. Secrets are masked."""

GET_RUN_LOG = f"""\
Read the run's own log (the runner's output around the actions: queueing, runner, inputs, each action's \
start, end and exit code, and how the run ended). Good for the overall story of a run; the details of a \
failure are in the failed action's log (get_action_log). {_LOG_LIMITS}"""

GET_ACTION_LOG = f"""\
Read the log of one action of a run, addressed by the action's id or by its name (e.g. 'test', \
'install'; get_run lists them). To diagnose a failure: tail the failed action's log first; if the cause is \
not there (e.g. a build warning that led to a later crash), read earlier actions' logs. {_LOG_LIMITS}"""


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
        run = await queries.get_run(db, args.run_id)
        if run["status"] == "failed" and (diagnosis := await shown_diagnosis(db, args.run_id)) is not None:
            run["diagnosis"] = diagnosis  # stored by the AI layer (mcp_knecht/ai/diagnoses.py)
        return run

    async def list_workflows(args: ListWorkflowsInput, ctx: ToolContext) -> dict[str, Any]:
        return {"workflows": await workflows.list_workflows(db, args.project)}

    async def get_workflow(args: GetWorkflowInput, ctx: ToolContext) -> dict[str, Any]:
        return await workflows.get_workflow(db, args.workflow, args.project, args.version)

    def window(args: GetRunLogInput | GetActionLogInput) -> logs.LogWindow:
        return logs.LogWindow(tail=args.tail, offset=args.offset, limit=args.limit, grep=args.grep)

    async def get_run_log(args: GetRunLogInput, ctx: ToolContext) -> dict[str, Any]:
        await logs.find_action(db, args.run_id, logs.RUN_LOG)
        page = await logs.read_log(db, args.run_id, logs.RUN_LOG, window(args))
        return {"run_id": args.run_id, **page}

    async def get_action_log(args: GetActionLogInput, ctx: ToolContext) -> dict[str, Any]:
        action = await logs.find_action(db, args.run_id, args.action)
        page = await logs.read_log(db, args.run_id, action["id"], window(args))
        return {"run_id": args.run_id, "action": action, **page}

    return [
        Tool(
            name="list_projects",
            description=LIST_PROJECTS,
            scope="projects:read",
            input_model=ListProjectsInput,
            handler=list_projects,
            title="List projects",
        ),
        Tool(
            name="get_project",
            description=GET_PROJECT,
            scope="projects:read",
            input_model=GetProjectInput,
            handler=get_project,
            title="Get a project",
        ),
        Tool(
            name="list_runs",
            description=LIST_RUNS,
            scope="runs:read",
            input_model=ListRunsInput,
            handler=list_runs,
            title="List runs",
        ),
        Tool(
            name="get_run",
            description=GET_RUN,
            scope="runs:read",
            input_model=GetRunInput,
            handler=get_run,
            title="Get a run",
        ),
        Tool(
            name="list_workflows",
            description=LIST_WORKFLOWS,
            scope="workflows:read",
            input_model=ListWorkflowsInput,
            handler=list_workflows,
            title="List workflows",
        ),
        Tool(
            name="get_workflow",
            description=GET_WORKFLOW,
            scope="workflows:read",
            input_model=GetWorkflowInput,
            handler=get_workflow,
            title="Get a workflow definition",
        ),
        Tool(
            name="get_run_log",
            description=GET_RUN_LOG,
            scope="logs:read",
            input_model=GetRunLogInput,
            handler=get_run_log,
            title="Read a run's log",
        ),
        Tool(
            name="get_action_log",
            description=GET_ACTION_LOG,
            scope="logs:read",
            input_model=GetActionLogInput,
            handler=get_action_log,
            title="Read an action's log",
        ),
    ]
