"""The Knecht CI toolset: projects, workflows, runs, actions and logs (seed 002).

One module per noun, each holding its input models, its tools (descriptions and handlers, as
methods of a small class bound to the store) and its SQL:

    projects    list_projects, get_project
    runs        list_runs, get_run; staged rerun_run, cancel_run
    workflows   list_workflows, get_workflow; staged dispatch_workflow, update_workflow
    logs        get_run_log, get_action_log
    variables   project_variable (list and get read; set and delete staged)
    prompts     the diagnose_run prompt

below them `refs` (a project by id or slug, a branch's head) and `definitions` (workflow text:
action names, structural checks, dispatch inputs). A staged tool has three parts, run by the gate:

    freeze   at proposal time: decide what will actually run (branch → commit SHA, base version,
             defaults of inputs) and put it into the arguments, which are then hashed and frozen
    preview  at proposal time: the current state of what the call would change, for the approver
    handler  at execution (after approval): do it, re-checking the state it depends on
"""

from __future__ import annotations

from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.toolset import Database, Migrations, Tool, Toolset, ToolsetContext
from mcp_knecht.knecht.logs import LogTools
from mcp_knecht.knecht.projects import ProjectTools
from mcp_knecht.knecht.prompts import knecht_prompts
from mcp_knecht.knecht.runs import RunTools
from mcp_knecht.knecht.variables import VariableTools, secret_values, secrets_version
from mcp_knecht.knecht.workflows import WorkflowTools

__all__ = ["INSTRUCTIONS", "MIGRATIONS", "knecht_tools", "open_store", "secret_values", "toolset"]

MIGRATIONS = Migrations("knecht", "mcp_knecht.knecht")
"""Knecht's tables: `mcp_knecht/knecht/sql/<dialect>/`."""


async def open_store(url: str) -> Database:
    """The store at `url` with Knecht's tables (for the CLIs that fill or read them directly)."""
    from mcp_knecht.store import open_database
    from mcp_knecht.store.migrations import apply_migrations

    db = await open_database(url)
    try:
        await apply_migrations(db, MIGRATIONS)
    except BaseException:
        await db.close()
        raise
    return db


INSTRUCTIONS = (
    "The Knecht tools give you the data of the Knecht CI system: projects, workflows (versioned "
    "definitions), runs, their actions and logs. To find out why a run failed, read get_run, then the failed "
    "action's log (tail first), earlier actions' logs if needed, and the workflow. Secrets are masked."
)


def knecht_tools(db: Database, secrets: SecretRegistry | None = None) -> list[Tool]:
    """Every Knecht tool, bound to `db`: the read tools first, then those that write. `secrets` (if
    given) masks log lines at their source (a search sees only what the caller may see) and is
    refreshed when variables are written."""
    tools = [
        *ProjectTools(db).tools(),
        *RunTools(db).tools(),
        *WorkflowTools(db).tools(),
        *LogTools(db, secrets).tools(),
        *VariableTools(db, secrets).tools(),
    ]
    return sorted(tools, key=lambda tool: "write" in tool.effects)


def toolset(context: ToolsetContext) -> Toolset:
    """The Knecht tools and prompts over the server's store. Secret variable values go into the
    server's scrubber once the tables exist, and again whenever they change — in this process,
    another replica, or written by the CI system itself (a counter the store's trigger bumps)."""
    db, scrubber = context.store, context.scrubber

    async def start() -> None:
        scrubber.watch("knecht", lambda: secret_values(db), lambda: secrets_version(db))
        await scrubber.refresh(force=True)

    return Toolset(
        name="knecht",
        tools=knecht_tools(db, scrubber),
        prompts=knecht_prompts(db),
        instructions=INSTRUCTIONS,
        migrations=MIGRATIONS,
        start=start,
    )
