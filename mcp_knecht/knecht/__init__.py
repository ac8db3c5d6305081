"""The Knecht CI toolset: projects, workflows, runs, actions and logs (seed 002)."""

from __future__ import annotations

from typing import Any

from mcp_knecht.core.toolset import Toolset


def toolset(db: Any) -> Toolset:
    from mcp_knecht.knecht.tools import knecht_tools

    return Toolset(name="knecht", tools=knecht_tools(db))
