"""Projects: `list_projects` and `get_project`, the overview a model starts from."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mcp_knecht.core.database import Database
from mcp_knecht.core.tools import Tool, ToolContext, ToolInput
from mcp_knecht.knecht.refs import find_project
from mcp_knecht.knecht.runs import recent_runs

RECENT_RUNS = 5

# --- Inputs --------------------------------------------------------------------------------------


class ListProjectsInput(ToolInput):
    """No arguments: every project the caller may see."""


class GetProjectInput(ToolInput):
    project: int | str = Field(
        description="The project: its numeric id (e.g. 1) or its slug (e.g. 'payments-api'), "
        "as returned by list_projects.",
    )


# --- Descriptions --------------------------------------------------------------------------------

LIST_PROJECTS = """\
List every Knecht CI project: id, slug, name, description, repository URL, default branch, the number \
of workflows, and the id and status of its latest run. Start here to find a project's id or slug, or to \
see at a glance which projects are currently failing. Takes no arguments; for workflows, branches and \
recent runs of one project use get_project."""

GET_PROJECT = """\
Get one Knecht project by numeric id or slug: its details, its branches with head commit SHAs, its \
workflows (id, name, file path, current version, status of the latest run) and its 5 most recent runs. \
Use it to learn which workflows a project has before filtering list_runs. For more runs use list_runs."""

# --- Tools ---------------------------------------------------------------------------------------


class ProjectTools:
    """The project tools, bound to one store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def list_projects(self, args: ListProjectsInput, ctx: ToolContext) -> dict[str, Any]:
        return {"projects": await list_projects(self.db)}

    async def get_project(self, args: GetProjectInput, ctx: ToolContext) -> dict[str, Any]:
        return await get_project(self.db, args.project)

    def tools(self) -> list[Tool]:
        return [
            Tool(name="list_projects", description=LIST_PROJECTS, scope="projects:read",
                 input_model=ListProjectsInput, handler=self.list_projects, title="List projects"),
            Tool(name="get_project", description=GET_PROJECT, scope="projects:read",
                 input_model=GetProjectInput, handler=self.get_project, title="Get a project"),
        ]


# --- Queries -------------------------------------------------------------------------------------


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
    return {
        **row,
        "branches": branches,
        "workflows": workflows,
        "recent_runs": await recent_runs(db, project_id, RECENT_RUNS),
    }
