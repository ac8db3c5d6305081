"""Assembling the server: toolsets load by import path, and whatever they open is released
on every way out — a clean shutdown, or a start that fails closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_knecht.app import open_app
from mcp_knecht.core.settings import load_settings
from mcp_knecht.core.tools import Tool
from mcp_knecht.core.toolset import Toolset, ToolsetContext
from mcp_knecht.errors import ConfigError, ScopeCatalogueError
from tests.staging import make_config
from tests.toolsets import EffectInput

pytestmark = pytest.mark.anyio

closed: list[str] = []


async def _nothing(args: Any, ctx: Any) -> dict[str, Any]:
    return {}


def closing_toolset(context: ToolsetContext) -> Toolset:
    async def close() -> None:
        closed.append("closed")

    scope = context.env.get("TEST_TOOL_SCOPE", "runs:read")
    return Toolset(name="closing", tools=[Tool(name="closing_tool", description="Test.", scope=scope,
         input_model=EffectInput, handler=_nothing)], close=close)


@pytest.fixture
def app_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    closed.clear()
    return {**env, "KNECHT_CONFIG_DIR": str(make_config(tmp_path / "config")),
            "KNECHT_TOOLSETS": "tests.test_app:closing_toolset"}


async def test_a_toolset_is_closed_at_shutdown(app_env: dict[str, str]) -> None:
    async with open_app(load_settings(env=app_env)) as app:
        assert "closing_tool" in app.registry
        assert closed == []
    assert closed == ["closed"]


async def test_a_start_that_fails_closed_still_closes_the_toolsets(app_env: dict[str, str]) -> None:
    with pytest.raises(ScopeCatalogueError, match="no:such-scope"):
        async with open_app(load_settings(env={**app_env, "TEST_TOOL_SCOPE": "no:such-scope"})):
            pass
    assert closed == ["closed"]


async def test_a_toolset_path_that_does_not_resolve_is_a_clear_error(app_env: dict[str, str]) -> None:
    for spec, message in (("tests.nowhere:toolset", "cannot import"), ("tests.test_app:missing", "no function"),
                          ("justamodule", "expected 'package.module:function'")):
        with pytest.raises(ConfigError, match=message):
            async with open_app(load_settings(env={**app_env, "KNECHT_TOOLSETS": spec})):
                pass


_IMPORTED_FEATURES = """
import sys, anyio
from mcp_knecht.app import open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.settings import load_settings

async def main():
    async with open_app(load_settings()) as app:
        reader = Actor("dave", "test", frozenset({"projects:read", "runs:read"}))
        assert not (await app.gate.call_tool(reader, "list_projects", {})).is_error
        before = sorted(name for name in ("mcp_knecht.ai.runtime", "mcp_knecht.chat") if name in sys.modules)
        app.chat  # a route asks for it: built now
        after = sorted(name for name in ("mcp_knecht.ai.runtime", "mcp_knecht.chat") if name in sys.modules)
        print(before, after)

anyio.run(main)
"""


def test_a_server_without_a_model_never_imports_the_ai_features_or_the_chat(demo_env: dict[str, str]) -> None:
    """They cost a stdio server's cold start about 35 ms; nothing it serves needs them."""
    import subprocess
    import sys

    from tests.conftest import REPO, server_env

    result = subprocess.run([sys.executable, "-c", _IMPORTED_FEATURES], env=server_env(demo_env), cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[] ['mcp_knecht.ai.runtime', 'mcp_knecht.chat']"
