"""End to end with a client we did not write: the official TypeScript MCP SDK (tests/ts_client).

`client.mjs` connects over stdio (spawning `mcp-knecht serve`) or over Streamable HTTP with a
bearer token, lists the tools, calls one, calls one with invalid arguments and prints a JSON
summary. The SDK validates `structuredContent` against each tool's `outputSchema` on its own.
Node packages come from `npm ci` against the committed package-lock.json, once per session.
Without node/npm the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.knecht.demo import PROJECTS
from tests.conftest import server_env
from tests.servers import http_server, knecht_executable

pytestmark = pytest.mark.slow

TS_DIR = Path(__file__).resolve().parent / "ts_client"
SDK_MARKER = TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
CLIENT_TIMEOUT = 45  # seconds for one client run

# What a readonly token (conftest.READONLY: projects, workflows, runs, logs — all :read) sees.
READONLY_TOOLS = {  # the `readonly` profile: projects, workflows, runs and logs, nothing that writes
    "list_projects", "get_project", "list_workflows", "get_workflow",
    "list_runs", "get_run", "get_run_log", "get_action_log",
}
DEMO_SLUGS = {project.slug for project in PROJECTS}
CALL = ["--call", "list_projects", "--args", "{}"]
INVALID = ["--invalid-call", "list_runs", "--invalid-args", json.dumps({"limit": 10_000})]


# --- node and the SDK --------------------------------------------------------------------------


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the TypeScript client test must run in CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def node() -> str:
    """The node binary, with the TypeScript SDK installed from package-lock.json (npm ci)."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        _missing("node and npm are needed for the TypeScript MCP SDK client (tests/ts_client)")
    assert node_bin is not None and npm_bin is not None
    if not SDK_MARKER.exists():
        try:
            done = subprocess.run(
                [npm_bin, "ci", "--no-audit", "--no-fund"],
                cwd=TS_DIR,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"npm ci in {TS_DIR} timed out after 300 s:\n{exc.stdout}\n{exc.stderr}")
        if done.returncode != 0 or not SDK_MARKER.exists():
            pytest.fail(f"npm ci in {TS_DIR} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return node_bin


def run_client(node: str, mode: str, *args: str, env: dict[str, str], expect_rc: int = 0) -> dict[str, Any]:
    """Run client.mjs; return its JSON summary (the last stdout line)."""
    command = [node, str(TS_DIR / "client.mjs"), mode, *args]
    try:
        done = subprocess.run(
            command, cwd=TS_DIR, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"TypeScript client timed out after {CLIENT_TIMEOUT} s\n"
            f"stdout: {exc.stdout}\nstderr: {exc.stderr}"
        )
    lines = done.stdout.strip().splitlines()
    detail = f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert lines, f"TypeScript client printed nothing; {detail}"
    summary: dict[str, Any] = json.loads(lines[-1])
    assert done.returncode == expect_rc, f"TypeScript client: expected exit {expect_rc}; {detail}"
    return summary


# --- what every transport must show ------------------------------------------------------------


def check_summary(summary: dict[str, Any]) -> None:
    assert summary["ok"] is True, summary
    assert summary["server"]["name"] == "mcp-knecht"
    assert summary["instructions"], "the server should send instructions"

    # A readonly token sees exactly the read tools, each marked read-only with an object input schema.
    assert set(summary["tools"]) == READONLY_TOOLS
    for name, details in summary["toolDetails"].items():
        assert details["readOnlyHint"] is True, name
        assert details["destructiveHint"] is False, name
        assert details["inputSchemaType"] == "object", name

    # list_projects returns the demo projects (structured, and in the text for clients without it).
    call = summary["call"]
    assert call["isError"] is False, call
    assert call["contentTypes"] and set(call["contentTypes"]) == {"text"}
    structured = call["structuredContent"]
    assert isinstance(structured, dict), call
    slugs = {project["slug"] for project in structured["projects"]}
    assert slugs == DEMO_SLUGS
    assert all(slug in call["text"] for slug in DEMO_SLUGS)

    # Invalid arguments are a tool error the model can read, naming the field — not a protocol error.
    invalid = summary["invalid"]
    assert "protocolError" not in invalid, invalid
    assert invalid["isError"] is True, invalid
    assert "limit" in invalid["text"], invalid
    error = (invalid["structuredContent"] or {}).get("error", {})
    if error.get("problems") is not None:
        assert "limit" in {problem["field"] for problem in error["problems"]}, error


# --- stdio -------------------------------------------------------------------------------------


def test_typescript_client_over_stdio(node: str, demo_env: dict[str, str], mint: Callable[..., str]) -> None:
    env = server_env(demo_env, KNECHT_TOKEN=mint())
    summary = run_client(node, "stdio", *CALL, *INVALID, "--", knecht_executable(), "serve", env=env)
    assert summary["transport"] == "stdio"
    check_summary(summary)


# --- Streamable HTTP ---------------------------------------------------------------------------


@pytest.fixture(params=[[], ["--stateless"]], ids=["sessions", "stateless"])
def http_base(request: pytest.FixtureRequest, demo_env: dict[str, str]) -> Iterator[str]:
    with http_server(demo_env, *request.param) as base:
        yield base


def client_env(demo_env: dict[str, str], bearer: str | None) -> dict[str, str]:
    env = server_env(demo_env)
    env.pop("MCP_BEARER_TOKEN", None)
    if bearer is not None:
        env["MCP_BEARER_TOKEN"] = bearer
    return env


def test_typescript_client_over_http(
    node: str, http_base: str, demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    env = client_env(demo_env, mint())
    summary = run_client(node, "http", "--url", http_base + "/mcp", *CALL, *INVALID, env=env)
    assert summary["transport"] == "http"
    assert summary["protocolVersion"], "the HTTP transport should have negotiated a protocol version"
    check_summary(summary)


def _forged(mint: Callable[..., str]) -> dict[str, str]:
    good = mint()
    header, payload, signature = good.split(".")
    return {
        "missing": "",
        "garbage": "not-a-jwt",
        "other secret": mint_token(
            TokenSettings(secret="s" * 64), subject="alice", scopes=("projects:read",), client="pytest"
        ),
        "tampered signature": f"{header}.{payload}.{signature[::-1]}",
    }


def test_typescript_client_gets_401_for_bad_tokens(
    node: str, http_base: str, demo_env: dict[str, str], mint: Callable[..., str]
) -> None:
    for label, bearer in _forged(mint).items():
        env = client_env(demo_env, bearer or None)
        url = http_base + "/mcp"
        # Without --expect-unauthorized the connection failure is an exit 1 that names the status ...
        failed = run_client(node, "http", "--url", url, env=env, expect_rc=1)
        assert failed["ok"] is False and failed["error"]["status"] == 401, (label, failed)
        # ... and with it, 401 is the expected outcome.
        refused = run_client(node, "http", "--url", url, "--expect-unauthorized", env=env)
        assert refused["unauthorized"] is True, (label, refused)


def test_http_401_points_at_protected_resource_metadata(http_base: str, mint: Callable[..., str]) -> None:
    """The same refusal seen without the SDK: 401, WWW-Authenticate, and metadata that resolves."""
    initialize = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "urllib", "version": "0"},
            },
        }
    ).encode()
    for label, bearer in _forged(mint).items():
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        request = urllib.request.Request(http_base + "/mcp", data=initialize, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401, label
        challenge = refused.value.headers.get("WWW-Authenticate", "")
        refused.value.close()
        assert challenge.startswith("Bearer "), (label, challenge)
        assert 'resource_metadata="' in challenge, (label, challenge)

    metadata_url = challenge.split('resource_metadata="', 1)[1].split('"', 1)[0]
    with urllib.request.urlopen(metadata_url, timeout=10) as response:
        metadata = json.load(response)
    assert metadata["resource"] == http_base + "/mcp"
