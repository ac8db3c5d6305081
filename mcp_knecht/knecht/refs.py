"""How callers name what every noun needs: a project by id or slug, a branch of a project.

The lowest layer of the toolset: the noun modules (projects, runs, workflows, variables) resolve
these references here, so none of them has to import another just to find a project.
"""

from __future__ import annotations

from mcp_knecht.core.database import Database, Row, Transaction
from mcp_knecht.errors import NotFoundError


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


async def branch_head(db: Database | Transaction, project_id: int, branch: str) -> str:
    """The commit SHA at the head of a project's branch; NotFoundError lists the branches."""
    row = await db.fetch_one(
        "SELECT head_sha FROM branches WHERE project_id = ? AND name = ?", (project_id, branch)
    )
    if row is None:
        names = await db.fetch_all("SELECT name FROM branches WHERE project_id = ? ORDER BY name", (project_id,))
        listing = ", ".join(r["name"] for r in names)
        raise NotFoundError(f"Branch {branch!r} does not exist in this project. Branches: {listing}.")
    return str(row["head_sha"])
