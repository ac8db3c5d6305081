"""Several processes on one store, on SQLite and on PostgreSQL: racing approvers, two server
replicas (stateless HTTP) behind no load balancer, the operator's CLI, and one audit chain."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_knecht.app import open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.auth import TokenSettings, mint_token
from mcp_knecht.core.settings import load_settings
from mcp_knecht.knecht import open_store
from mcp_knecht.knecht.demo import fill_demo_data
from mcp_knecht.store import open_database
from tests.conftest import REPO
from tests.servers import http_server
from tests.staging import AGENT, TEST_TOOLSETS, acli, make_config, racing_approvers
from tests.toolsets import EFFECTS_TABLE

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROPOSALS = 200
APPROVERS = 8


async def _prepare(url: str) -> None:
    db = await open_store(url)
    try:
        await fill_demo_data(db, runs=100)
        async with db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
    finally:
        await db.close()


@pytest.fixture
def shared_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """One store with demo data and the test toolset, as every process of a deployment sees it."""
    anyio.run(_prepare, database_url)
    return {
        "KNECHT_DATA_DIR": str(tmp_path / "data"),
        "KNECHT_DATABASE_URL": database_url,
        "KNECHT_CONFIG_DIR": str(make_config(tmp_path / "config")),
        "KNECHT_JWT_SECRET": secrets.token_urlsafe(48),
        "KNECHT_TOOLSETS": TEST_TOOLSETS,
        "PYTHONPATH": str(REPO),
    }


@pytest.fixture
def replicas(shared_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """Two `mcp-knecht serve --transport http --stateless` processes on the one store."""
    with ExitStack() as stack:
        yield tuple(stack.enter_context(http_server(shared_env, "--stateless")) for _ in range(2))  # type: ignore[misc]


@asynccontextmanager
async def _client(base_url: str, env: dict[str, str], subject: str = "alice") -> AsyncIterator[Client]:
    token = mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject=subject, scopes=AGENT)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http, Client(
        streamable_http_client(f"{base_url}/mcp", http_client=http)
    ) as client:
        yield client


async def _effects(url: str) -> dict[str, int]:
    db = await open_database(url, migrate=False)
    try:
        rows = await db.fetch_all("SELECT label, COUNT(*) AS n FROM test_effects GROUP BY label")
    finally:
        await db.close()
    return {row["label"]: row["n"] for row in rows}


async def test_racing_approver_processes_execute_each_proposal_exactly_once(shared_env: dict[str, str]) -> None:
    async with open_app(load_settings(env=shared_env), watch_policy=False) as app:
        alice = Actor("alice", "pytest", frozenset(AGENT))
        ids = []
        for n in range(PROPOSALS):
            staged = await app.gate.call_tool(alice, "record_effect", {"label": f"effect-{n}"})
            assert staged.outcome == "staged"
            ids.append(staged.data["id"])  # type: ignore[index]
    assert ids == list(range(ids[0], ids[0] + PROPOSALS))

    reports = await racing_approvers(shared_env, APPROVERS, ids[0], ids[-1])

    effects = await _effects(shared_env["KNECHT_DATABASE_URL"])
    assert sorted(effects) == sorted(f"effect-{n}" for n in range(PROPOSALS))
    assert set(effects.values()) == {1}, "some effect ran more than once"
    assert sum(r["won"] for r in reports) == PROPOSALS
    verified = await acli("mcp-knecht", shared_env, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_staged_on_one_replica_approved_by_the_cli_and_followed_on_the_other(
    replicas: tuple[str, str], shared_env: dict[str, str]
) -> None:
    replica_a, replica_b = replicas
    async with _client(replica_a, shared_env) as on_a:
        staged = await on_a.call_tool("record_effect", {"label": "across-replicas"})
    assert not staged.is_error and staged.structured_content is not None
    proposal_id = staged.structured_content["id"]

    outcome: dict[str, object] = {}
    async with _client(replica_b, shared_env) as on_b:
        async def wait_on_b() -> None:
            result = await on_b.call_tool("get_proposal", {"id": proposal_id, "wait_seconds": 40})
            outcome.update(result.structured_content or {})
            outcome["answered_at"] = anyio.current_time()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(wait_on_b)
                await anyio.sleep(0.5)  # the agent is waiting on B before the operator acts
                approved = await acli("knecht-approve", shared_env, "approve", str(proposal_id), "--as", "bob")
                approved_at = anyio.current_time()
                assert approved.returncode == 0, approved.stderr

    assert outcome["status"] == "succeeded" and outcome["decided_by"] == "local:bob"
    assert outcome["result"] == {"recorded": "across-replicas"}
    # Woken by the decision (NOTIFY on PostgreSQL, a 0.25 s poll on SQLite), not by the 40 s timeout.
    assert float(outcome["answered_at"]) - approved_at < 2.0  # type: ignore[arg-type]
    assert await _effects(shared_env["KNECHT_DATABASE_URL"]) == {"across-replicas": 1}


async def test_the_audit_chain_verifies_after_concurrent_writes_through_two_replicas(
    replicas: tuple[str, str], shared_env: dict[str, str]
) -> None:
    calls_per_client, clients_per_replica = 15, 3

    async def agent(base_url: str, name: str) -> None:
        async with _client(base_url, shared_env, subject=name) as client:
            for n in range(calls_per_client):
                if n % 3:
                    result = await client.call_tool("list_projects", {})
                else:
                    result = await client.call_tool("record_effect", {"label": f"{name}-{n}"})
                assert not result.is_error

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tasks:
            for r, base_url in enumerate(replicas):
                for c in range(clients_per_replica):
                    tasks.start_soon(agent, base_url, f"agent-{r}-{c}")

    db = await open_database(shared_env["KNECHT_DATABASE_URL"], migrate=False)
    try:
        expected = calls_per_client * clients_per_replica * len(replicas)
        with anyio.fail_after(10):  # each replica commits its audit entries within ~50 ms
            while (await db.fetch_one("SELECT COUNT(*) AS n FROM audit_log WHERE subject LIKE 'agent-%'")
                   ) != {"n": expected}:
                await anyio.sleep(0.05)
    finally:
        await db.close()
    verified = await acli("mcp-knecht", shared_env, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
