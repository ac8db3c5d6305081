"""Issue 11, item 7: no subject can crowd out the others. A real HTTP server subprocess with small
session limits; a token with no scopes at all opens sessions until it is refused, and everyone
else still gets in."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_knecht.core.auth import TokenSettings, mint_token
from tests.servers import http_server

pytestmark = pytest.mark.slow

PER_SUBJECT = 3


@pytest.fixture
def server(demo_env: dict[str, str]) -> Iterator[str]:
    limits = {"KNECHT_SESSIONS_PER_SUBJECT": str(PER_SUBJECT), "KNECHT_MAX_SESSIONS": "50",
              "KNECHT_SESSION_IDLE_TIMEOUT": "2s"}
    with http_server({**demo_env, **limits}) as url:
        yield url


def _token(secret: str, subject: str, scopes: tuple[str, ...] = ()) -> str:
    return mint_token(TokenSettings(secret=secret), subject=subject, scopes=scopes)


def _initialize(base_url: str, bearer: str) -> tuple[int, str]:
    """One `initialize` (protocol 2025-11-25): it opens a session, which is never closed here."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hog", "version": "1"}}})
    request = urllib.request.Request(f"{base_url}/mcp", data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {bearer}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def _works(base_url: str, bearer: str, mode: str) -> bool:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=30) as http, Client(
        streamable_http_client(f"{base_url}/mcp", http_client=http), mode=mode
    ) as client:
        return not (await client.call_tool("list_projects", {})).is_error


@pytest.mark.anyio
async def test_one_subject_cannot_fill_the_session_table(server: str, secret: str) -> None:
    hog = _token(secret, "mallory")  # no scopes at all
    answers = [_initialize(server, hog) for _ in range(PER_SUBJECT + 5)]
    assert [status for status, _ in answers] == [200] * PER_SUBJECT + [429] * 5
    assert "Too many open sessions for 'mallory'" in answers[-1][1]

    # Everyone else is untouched, on both protocol versions.
    erin = _token(secret, "erin", ("projects:read",))
    assert await _works(server, erin, "legacy")
    assert await _works(server, erin, "auto")
    assert _initialize(server, erin)[0] == 200

    # Idle sessions expire (here after 2 s), and then the subject may open new ones.
    deadline = time.monotonic() + 20
    while (status := _initialize(server, hog)[0]) == 429 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert status == 200


def test_session_limits_are_settings_checked_at_start() -> None:
    from mcp_knecht.core.settings import load_settings
    from mcp_knecht.errors import ConfigError
    from tests.conftest import REPO

    base = {"KNECHT_CONFIG_DIR": str(REPO)}
    loaded = load_settings(env={**base, "KNECHT_SESSIONS_PER_SUBJECT": "4", "KNECHT_SESSION_IDLE_TIMEOUT": "90s"})
    assert loaded.sessions_per_subject == 4 and loaded.session_idle_timeout.total_seconds() == 90
    for name, bad in (("KNECHT_SESSIONS_PER_SUBJECT", "0"), ("KNECHT_MAX_SESSIONS", "lots"),
                      ("KNECHT_SESSION_IDLE_TIMEOUT", "2d")):
        with pytest.raises(ConfigError, match=f"(?i){name}"):
            load_settings(env={**base, name: bad})
