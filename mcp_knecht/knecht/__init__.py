"""The Knecht CI toolset: projects, workflows, runs, actions and logs (seed 002)."""

from __future__ import annotations

from mcp_knecht.core.toolset import Toolset, ToolsetContext
from mcp_knecht.knecht.variables import secret_values

__all__ = ["secret_values", "toolset"]


async def toolset(context: ToolsetContext) -> Toolset:
    """The Knecht tools and prompts over the server's store. Secret variable values go into the
    server's scrubber now, and on every change from the moment it is proposed."""
    db, secrets = context.db, context.secrets
    secrets.add(await secret_values(db))
    from mcp_knecht.knecht.prompts import knecht_prompts
    from mcp_knecht.knecht.tools import knecht_tools
    from mcp_knecht.knecht.write_tools import knecht_write_tools

    return Toolset(
        name="knecht",
        tools=[*knecht_tools(db), *knecht_write_tools(db, secrets=secrets)],
        prompts=knecht_prompts(),
    )
