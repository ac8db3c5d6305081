"""The Knecht CI toolset: projects, workflows, runs, actions and logs (seed 002)."""

from __future__ import annotations

from typing import Any

from mcp_knecht.core.scrub import SecretRegistry
from mcp_knecht.core.toolset import Toolset
from mcp_knecht.knecht.variables import secret_values

__all__ = ["secret_values", "toolset"]


def toolset(db: Any, *, secrets: SecretRegistry | None = None) -> Toolset:
    """The Knecht tools and prompts over `db`. Pass the server's `SecretRegistry` (the gate's
    scrubber) so that changes to secret variables are masked from the moment they are proposed."""
    from mcp_knecht.knecht.prompts import knecht_prompts
    from mcp_knecht.knecht.tools import knecht_tools
    from mcp_knecht.knecht.write_tools import knecht_write_tools

    return Toolset(
        name="knecht",
        tools=[*knecht_tools(db), *knecht_write_tools(db, secrets=secrets)],
        prompts=knecht_prompts(),
    )
