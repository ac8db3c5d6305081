"""The first minutes of a newcomer: the lines quickstart prints work as printed, a token says how
long it lives, and a missing or refused token is explained to the client, not only on stderr."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_knecht import testing
from mcp_knecht.core.auth import TokenSettings, TokenVerifier, load_token_settings
from mcp_knecht.core.settings import load_settings
from mcp_knecht.transports.http import build_http_app
from mcp_knecht.transports.stdio import REFUSAL_TOOL
from tests.conftest import REPO, server_env
from tests.servers import knecht_executable
from tests.staging import cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BARE_PATH = "/usr/bin:/bin"


@pytest.fixture
def newcomer_env(tmp_path: Path) -> dict[str, str]:
    """A first run: no secret configured (a dev secret is generated), everything in a data dir."""
    return {
        "KNECHT_DATA_DIR": str(tmp_path / "data"),
        "KNECHT_DATABASE_URL": f"sqlite:///{tmp_path / 'data' / 'knecht.db'}",
        "KNECHT_CONFIG_DIR": str(REPO),
    }


def _quickstart(env: dict[str, str], *args: str) -> str:
    shown = cli("mcp-knecht", env, "quickstart", "--no-serve", "--sub", "erin", *args, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def _json_after(text: str, heading: str) -> dict[str, Any]:
    start = text.index("{", text.index(heading))
    value, _ = json.JSONDecoder().raw_decode(text, start)
    return value  # type: ignore[no-any-return]


async def _tools_and_projects(params: StdioServerParameters) -> tuple[set[str], int]:
    async with Client(params) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("list_projects", {})
        assert not result.is_error, result.content
        return names, len(result.structured_content["projects"])  # type: ignore[index]


def test_the_path_of_these_tests_lacks_the_venv() -> None:
    assert str(Path(sys.executable).parent) not in BARE_PATH.split(":")
    assert shutil.which("mcp-knecht", path=BARE_PATH) is None


async def test_the_printed_claude_code_stdio_line_runs_from_a_shell_without_the_venv(
    newcomer_env: dict[str, str], tmp_path: Path
) -> None:
    printed = _quickstart(newcomer_env)
    line = next(row.strip() for row in printed.splitlines() if row.strip().startswith("claude mcp add knecht --env"))
    options, command = line.split(" -- ", 1)
    words = shlex.split(options)
    assignments = [words[i + 1] for i, word in enumerate(words) if word == "--env"]
    assert shlex.split(command)[0].startswith("/") and shlex.split(command)[-1] == "serve"
    # What Claude Code does with the line: set the environment, run the command — here from a shell
    # whose PATH lacks the venv, in another folder, with another HOME.
    script = f"export {' '.join(shlex.quote(a) for a in assignments)}; exec {command}"
    elsewhere = tmp_path / "some-repository"
    elsewhere.mkdir()
    params = StdioServerParameters(command="/bin/sh", args=["-c", script], cwd=elsewhere,
                                   env={"PATH": BARE_PATH, "HOME": str(tmp_path / "home")})
    names, projects = await _tools_and_projects(params)
    assert {"list_runs", "get_run", "rerun_run", "get_proposal"} <= names and projects == 5


async def test_the_printed_cursor_stdio_snippet_runs_without_the_venv(
    newcomer_env: dict[str, str], tmp_path: Path
) -> None:
    printed = _quickstart(newcomer_env)
    server = _json_after(printed, "Cursor (~/.cursor/mcp.json or .cursor/mcp.json), stdio:")["mcpServers"]["knecht"]
    assert Path(server["command"]).is_absolute() and server["args"][-1] == "serve"
    assert all(Path(server["env"][key]).is_absolute() for key in ("KNECHT_CONFIG_DIR", "KNECHT_DATA_DIR"))
    params = StdioServerParameters(command=server["command"], args=server["args"], cwd=tmp_path,
                                   env={**server["env"], "PATH": BARE_PATH, "HOME": str(tmp_path / "home")})
    names, _ = await _tools_and_projects(params)
    assert "list_runs" in names


def _lifetime(token: str) -> timedelta:
    claims = jwt.decode(token, options={"verify_signature": False})
    return timedelta(seconds=claims["exp"] - claims["iat"])


def test_the_quickstart_token_lives_30_days_and_says_so(newcomer_env: dict[str, str]) -> None:
    printed = _quickstart(newcomer_env)
    token = printed.split("KNECHT_TOKEN=", 1)[1].split()[0].strip("'")
    assert _lifetime(token) == timedelta(days=30)
    until = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%d")
    assert f"valid 30 days, until {until}" in printed
    secret = (Path(newcomer_env["KNECHT_DATA_DIR"]) / "jwt-secret").read_text().strip()
    assert TokenVerifier(TokenSettings(secret=secret)).verify(token).subject == "erin"

    shorter = _quickstart(newcomer_env, "--ttl", "2d")
    assert "valid 2 days" in shorter
    assert _lifetime(shorter.split("KNECHT_TOKEN=", 1)[1].split()[0].strip("'")) == timedelta(days=2)


# --- a stdio token that cannot be used --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
@pytest.mark.parametrize("kind", ["expired", "forged", "missing"])
async def test_a_stdio_client_is_told_in_band_why_the_server_cannot_serve(  # type: ignore[no-untyped-def]
    demo_env: dict[str, str], mint: Callable[..., str], kind: str, mode: str
) -> None:
    token = {
        "expired": mint(ttl=timedelta(hours=8), now=datetime.now(UTC) - timedelta(days=2)),
        "forged": mint()[:-4] + "AAAA",
        "missing": "",
    }[kind]
    params = StdioServerParameters(command=knecht_executable(), args=["serve"],
                                   env=server_env(demo_env, KNECHT_TOKEN=token))
    async with Client(params, mode=mode) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool(REFUSAL_TOOL, {})
        instructions = client.instructions
    assert [tool.name for tool in tools] == [REFUSAL_TOOL]
    message = tools[0].description or ""
    expected = {"expired": "Token has expired", "forged": "signature is invalid", "missing": "not set"}[kind]
    assert expected in message
    assert f"{Path(knecht_executable())} quickstart --no-serve" in message  # absolute: PATH may lack it
    assert "token mint --sub" in message
    assert result.is_error and result.content[0].text == message  # type: ignore[union-attr]
    assert instructions == message


# --- HTTP without a valid token -------------------------------------------------------------------


@pytest.fixture
def http_app(demo_env: dict[str, str]):  # type: ignore[no-untyped-def]
    """`async with http_app(**env) as client`: the ASGI app in process, for what a 401 says."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def _open(**extra: str) -> AsyncIterator[httpx2.AsyncClient]:
        env = {**demo_env, **extra}
        async with testing.running_app(env) as app:
            verifier = TokenVerifier(load_token_settings(load_settings(env=env), create_dev_secret=False))
            asgi = build_http_app(app, verifier, public_url="http://127.0.0.1:8765")
            transport = httpx2.ASGITransport(app=asgi)
            async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
                yield client

    return _open


async def _post_mcp(client: httpx2.AsyncClient, bearer: str | None = None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream",
               **({"Authorization": f"Bearer {bearer}"} if bearer else {})}
    return await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)


async def test_metadata_names_no_authorization_server_when_the_server_mints_its_own(http_app) -> None:  # type: ignore[no-untyped-def]
    async with http_app() as client:
        metadata = (await client.get("/.well-known/oauth-protected-resource")).json()
    assert metadata["resource"] == "http://127.0.0.1:8765/mcp"
    assert "authorization_servers" not in metadata  # nothing to register a client with


async def test_metadata_names_the_identity_provider_when_the_issuer_is_one(http_app) -> None:  # type: ignore[no-untyped-def]
    issuer = "https://idp.example.com/realms/knecht"
    async with http_app(KNECHT_JWT_ISSUER=issuer) as client:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            assert (await client.get(path)).json()["authorization_servers"] == [issuer]
        refused = await _post_mcp(client)
    assert issuer in refused.json()["error_description"]


async def test_a_401_says_what_was_wrong_and_how_to_get_a_token(http_app, mint: Callable[..., str]) -> None:  # type: ignore[no-untyped-def]
    async with http_app() as client:
        missing = await _post_mcp(client)
        expired = await _post_mcp(client, mint(ttl=timedelta(hours=1), now=datetime.now(UTC) - timedelta(days=1)))
        forged = await _post_mcp(client, mint()[:-4] + "AAAA")
    for refused in (missing, expired, forged):
        assert refused.status_code == 401
        assert "resource_metadata=" in refused.headers["www-authenticate"]
        body = refused.json()
        assert body["error"] == "invalid_token"
        assert "Authorization: Bearer" in body["error_description"]
        assert "mcp-knecht token mint --sub NAME --profile claude-code" in body["error_description"]
        assert int(refused.headers["content-length"]) == len(refused.content)
    assert missing.json()["error_description"].startswith("No bearer token.")
    assert "refused: Token has expired" in expired.json()["error_description"]
    assert "signature is invalid" in forged.json()["error_description"]
