"""`kill -9` of a server while agents stage: every proposal an agent was told about exists, with its
`staged` audit row — they commit together or not at all."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.store import open_database
from tests.conftest import server_env
from tests.servers import free_port, knecht_executable
from tests.staging import AGENT
from tests.test_replicas import shared_env  # noqa: F401  (fixture)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CLIENTS = 10


def _start(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([knecht_executable(), "serve", "--transport", "http", "--port", str(port)],
                               env=server_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1):
                return process, base
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("server did not start")


async def test_kill_9_while_staging_leaves_no_proposal_without_its_audit_row(
    shared_env: dict[str, str],  # noqa: F811
) -> None:
    process, base = _start(shared_env)
    told: list[int] = []

    async def agent(n: int) -> None:
        token = mint_token(TokenSettings(secret=shared_env["KNECHT_JWT_SECRET"]), subject=f"agent-{n}", scopes=AGENT)
        try:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http, \
                    Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
                for i in range(10_000):
                    result = await client.call_tool("record_effect", {"label": f"a{n}-{i}"})
                    if result.structured_content and not result.is_error:
                        told.append(int(result.structured_content["id"]))
        except Exception:  # the server died under it: what it was told so far is what counts
            return

    async with anyio.create_task_group() as tasks:
        for n in range(CLIENTS):
            tasks.start_soon(agent, n)
        await anyio.sleep(2.5)
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert len(told) >= 20, "the agents staged too little before the kill to prove anything"

    db = await open_database(shared_env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        proposals = {r["id"] for r in await db.fetch_all("SELECT id FROM proposals")}
        staged = {r["proposal_id"] for r in await db.fetch_all(
            "SELECT proposal_id FROM audit_log WHERE outcome = 'staged'")}
    finally:
        await db.close()
    assert set(told) <= proposals, "an agent was told about a proposal that does not exist"
    assert proposals == staged, "a proposal without its staged audit row (or the reverse)"
