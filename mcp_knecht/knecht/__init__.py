"""The Knecht CI toolset: projects, workflows, runs, actions and logs (seed 002)."""

from __future__ import annotations

from mcp_knecht.core.toolset import Database, Migrations, Toolset, ToolsetContext
from mcp_knecht.knecht.variables import secret_values

__all__ = ["MIGRATIONS", "open_store", "secret_values", "toolset"]

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


def toolset(context: ToolsetContext) -> Toolset:
    """The Knecht tools and prompts over the server's store. Secret variable values go into the
    server's scrubber once the tables exist, and on every change."""
    from mcp_knecht.knecht.prompts import knecht_prompts
    from mcp_knecht.knecht.tools import knecht_tools
    from mcp_knecht.knecht.write_tools import knecht_write_tools

    db, scrubber = context.store, context.scrubber

    async def start() -> None:
        scrubber.add(await secret_values(db))

    return Toolset(
        name="knecht",
        tools=[*knecht_tools(db), *knecht_write_tools(db, secrets=scrubber)],
        prompts=knecht_prompts(),
        instructions=INSTRUCTIONS,
        migrations=MIGRATIONS,
        start=start,
    )
