"""A real `mcp-knecht serve` subprocess over stdio, driven by the SDK's client."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import server_env
from tests.servers import knecht_executable

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_stdio_server_serves_the_tools_of_its_token(  # type: ignore[no-untyped-def]
    demo_env: dict[str, str], mint: Callable[..., str], protocol_mode: str
) -> None:
    params = StdioServerParameters(
        command=knecht_executable(), args=["serve"],
        env=server_env(demo_env, KNECHT_TOKEN=mint("dave", ["projects:read"])),
    )
    async with Client(params, mode=protocol_mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"list_projects", "get_project"}
        result = await client.call_tool("list_projects", {})
        assert not result.is_error and len(result.structured_content["projects"]) >= 5
        refused = await client.call_tool("list_runs", {})
        assert refused.is_error and "Unknown tool" in refused.content[0].text


def run_serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [knecht_executable(), "serve"], env=server_env(env), input="", capture_output=True, text=True, timeout=60
    )


def test_without_a_token_the_server_exits_and_says_how_to_mint_one(demo_env: dict[str, str]) -> None:
    result = run_serve(demo_env)
    assert result.returncode != 0
    assert "KNECHT_TOKEN" in result.stderr and "token mint" in result.stderr


@pytest.mark.parametrize("kind", ["forged", "expired", "garbage"])
def test_a_refused_token_stops_the_server_with_the_reason(  # type: ignore[no-untyped-def]
    demo_env: dict[str, str], mint: Callable[..., str], kind: str
) -> None:
    token = {
        "forged": mint()[:-4] + "AAAA",
        "expired": mint(ttl=timedelta(seconds=1), now=datetime(2020, 1, 1, tzinfo=UTC)),
        "garbage": "not-a-jwt",
    }[kind]
    result = run_serve({**demo_env, "KNECHT_TOKEN": token})
    assert result.returncode != 0
    assert "refused" in result.stderr and "token mint" in result.stderr


async def test_a_stdio_session_does_not_outlive_its_token(demo_env: dict[str, str], mint: Callable[..., str]) -> None:
    """Valid at start (inside the 30 s clock leeway), expired beyond it a little later: the next call
    is refused and says why, as over HTTP."""
    import time

    import anyio

    valid_until = time.time() + 15  # expiry + the verifier's 30 s leeway: room for a slow cold start
    expires = datetime.fromtimestamp(int(valid_until) - 30, UTC)
    almost = mint("dave", ["projects:read"], ttl=timedelta(seconds=60), now=expires - timedelta(seconds=60))
    params = StdioServerParameters(command=knecht_executable(), args=["serve"],
                                   env=server_env(demo_env, KNECHT_TOKEN=almost))
    async with Client(params) as client:
        assert not (await client.call_tool("list_projects", {})).is_error
        await anyio.sleep(max(0.0, int(valid_until) + 1.5 - time.time()))
        late = await client.call_tool("list_projects", {})
        assert late.is_error and "expired" in late.content[0].text and "token mint" in late.content[0].text
        assert (await client.list_tools()).tools == []


_SERVE_THEN_REPORT = """
import sys
from mcp_knecht.cli.main import main
code = main(["serve"])  # stdin is empty: it serves until EOF
import jwt.algorithms
print(code, jwt.algorithms.has_crypto, "cryptography.x509" in sys.modules, file=sys.stderr)
"""


def test_a_stdio_server_with_a_secret_loads_pyjwt_without_cryptography(demo_env: dict[str, str],
                                                                       mint: Callable[..., str]) -> None:
    """HS256 needs only `hmac`: pyjwt is loaded as it runs without its `crypto` extra, 20 ms less of the
    cold start a client waits for at every launch (the SDK itself loads only `cryptography.exceptions`).
    The token is verified all the same."""
    import sys

    def serve(token: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _SERVE_THEN_REPORT], env=server_env(demo_env, KNECHT_TOKEN=token),
                              input="", capture_output=True, text=True, timeout=60)

    token = mint("dave", ["projects:read"])
    assert serve(token).stderr.strip().splitlines()[-1] == "0 False False"
    forged = serve(token[:-4] + "AAAA")
    assert "refused" in forged.stderr and forged.stderr.strip().splitlines()[-1].startswith("2 ")


_SERVE_TO_A_TOOLS_LIST_THEN_REPORT = """
import sys
from mcp_knecht.cli.main import main
code = main(["serve"])  # answers the requests on stdin, then stops at EOF
from mcp_knecht.knecht.projects import ListProjectsInput
from mcp_knecht.knecht.runs import RerunRunInput
print(code, *(name in sys.modules for name in ("re2", "difflib")), ListProjectsInput.__pydantic_complete__,
      RerunRunInput.__pydantic_complete__, file=sys.stderr)
"""


def test_a_stdio_start_to_its_first_tools_list_loads_and_builds_only_what_it_answers_with(
        demo_env: dict[str, str], mint: Callable[..., str]) -> None:
    """A cold start loads what it needs before it answers, not what the first call might: RE2 comes
    with the first text the scrubber scans, difflib with the first diff a preview shows, and a tool's
    input model is built when it is listed (or called), not for a tool this token never sees."""
    import json
    import sys

    requests = "".join(json.dumps(message) + "\n" for message in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ))
    server = subprocess.Popen([sys.executable, "-c", _SERVE_TO_A_TOOLS_LIST_THEN_REPORT], text=True,
                              env=server_env(demo_env, KNECHT_TOKEN=mint("dave", ["projects:read"])),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(requests)
    server.stdin.flush()
    listed = None  # stdin stays open until the listing came: at EOF a stdio server stops answering
    while listed is None and (line := server.stdout.readline()):
        if (message := json.loads(line)).get("id") == 2:
            listed = message
    _, stderr = server.communicate(timeout=60)
    assert listed is not None, stderr
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["list_projects", "get_project"]
    assert stderr.strip().splitlines()[-1] == "0 False False True False"
