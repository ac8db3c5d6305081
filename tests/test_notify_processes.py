"""Notifications across real processes: two server replicas on PostgreSQL deliver each event
exactly once; a server killed with SIGKILL between the commit and the delivery loses nothing;
the `notify` commands; a malformed channel stops `serve`."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
from mcp_knecht.store import open_database
from mcp_knecht.testing import approve
from tests.conftest import REPO, server_env
from tests.receivers import Mailbox, WebhookReceiver
from tests.servers import free_port, http_server, knecht_executable
from tests.staging import AGENT, TEST_TOOLSETS, acli, make_config
from tests.toolsets import EFFECTS_TABLE

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FAST = '[notify.delivery]\ntimeout = 2\nbackoff = 0.1\nmax_backoff = 0.5\n'


def deployment(url: str, tmp_path: Path, receiver: WebhookReceiver, knecht_toml: str = FAST) -> dict[str, str]:
    config = make_config(tmp_path / "config")
    (config / "knecht.toml").write_text(knecht_toml, encoding="utf-8")
    return {
        "KNECHT_DATA_DIR": str(tmp_path / "data"),
        "KNECHT_DATABASE_URL": url,
        "KNECHT_CONFIG_DIR": str(config),
        "KNECHT_JWT_SECRET": secrets.token_urlsafe(48),
        "KNECHT_TOOLSETS": TEST_TOOLSETS,
        "KNECHT_WEBHOOK_URL": receiver.url,
        "KNECHT_WEBHOOK_SECRET": receiver.secret,
        "PYTHONPATH": str(REPO),
    }


async def _prepare(url: str) -> None:
    db = await open_database(url)
    try:
        async with db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
    finally:
        await db.close()


async def _rows(url: str, sql: str) -> list[dict[str, object]]:
    db = await open_database(url, migrate=False)
    try:
        return await db.fetch_all(sql)
    finally:
        await db.close()


async def test_two_replicas_on_postgresql_deliver_each_event_exactly_once(
    pg_url: str, tmp_path: Path, webhook_receiver: WebhookReceiver
) -> None:
    env = deployment(pg_url, tmp_path, webhook_receiver)
    await _prepare(pg_url)
    with ExitStack() as stack:
        for _ in range(2):
            stack.enter_context(http_server(env, "--stateless"))
        async with open_app(load_settings(env=env), watch_policy=False) as app:  # an operator's side
            alice = Actor("alice", "pytest", frozenset(AGENT))
            for n in range(40):
                staged = await app.gate.call_tool(alice, "record_effect", {"label": f"effect-{n}"})
                if n % 2:
                    await approve(app, staged.data["id"], "bob")  # type: ignore[index]
        expected = 40 + 20 + 20  # pending, decided, executed
        await webhook_receiver.wait_for(expected, timeout=60)
        await anyio.sleep(1.0)  # time for a duplicate to show, if there were one
    assert webhook_receiver.bad_signatures == 0
    assert len(webhook_receiver.delivered) == expected
    assert set(webhook_receiver.ids().values()) == {1}
    rows = await _rows(pg_url, "SELECT o.uid, d.status, d.claimed_by FROM notify_deliveries d"
                               " JOIN notify_outbox o ON o.id = d.event_id")
    assert {row["status"] for row in rows} == {"delivered"}
    assert {row["uid"] for row in rows} == set(webhook_receiver.ids())


@contextmanager
def killable_server(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    process = subprocess.Popen([knecht_executable(), "serve", "--transport", "http", "--host", "127.0.0.1",
                                "--port", str(port), "--stateless"], env=server_env(env),
                               stdout=subprocess.DEVNULL, stderr=errors)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"server exited: {errors.seek(0) or errors.read().decode()}"
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "server did not become ready"
                time.sleep(0.1)
        yield process, base
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)
        errors.close()


async def _propose_over_mcp(base_url: str, env: dict[str, str]) -> int:
    token = mint_token(TokenSettings(secret=env["KNECHT_JWT_SECRET"]), subject="alice", scopes=AGENT)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http, Client(
        streamable_http_client(f"{base_url}/mcp", http_client=http)
    ) as client:
        staged = await client.call_tool("record_effect", {"label": "survives"})
    assert not staged.is_error and staged.structured_content is not None
    return int(staged.structured_content["id"])


async def test_a_server_killed_between_commit_and_delivery_loses_nothing(
    database_url: str, tmp_path: Path, webhook_receiver: WebhookReceiver
) -> None:
    env = deployment(database_url, tmp_path, webhook_receiver)
    await _prepare(database_url)
    webhook_receiver.mode = "hang"  # the delivery is in flight when the server dies
    with killable_server(env) as (server, base_url):
        proposal_id = await _propose_over_mcp(base_url, env)  # committed by the server
        with anyio.fail_after(20):
            while webhook_receiver.hanging < 1:
                await anyio.sleep(0.05)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    [held] = await _rows(database_url, "SELECT status, attempts FROM notify_deliveries")
    assert held == {"status": "delivering", "attempts": 1}

    # No server runs: the operator's decision and the execution are committed to the outbox only.
    approved = await acli("knecht-approve", env, "approve", str(proposal_id), "--as", "bob")
    assert approved.returncode == 0, approved.stderr
    webhook_receiver.mode = "up"
    webhook_receiver.release()

    with killable_server(env):
        taken = await webhook_receiver.wait_for(3, timeout=40)  # the pending one after its lease runs out
    assert sorted(d.payload["type"] for d in taken) == ["proposal.decided", "proposal.executed", "proposal.pending"]
    assert set(webhook_receiver.ids().values()) == {1}
    rows = await _rows(database_url, "SELECT o.event, d.status, d.attempts FROM notify_deliveries d"
                                     " JOIN notify_outbox o ON o.id = d.event_id ORDER BY d.id")
    assert [(r["event"], r["status"], r["attempts"]) for r in rows] == [
        ("proposal.pending", "delivered", 2), ("proposal.decided", "delivered", 1),
        ("proposal.executed", "delivered", 1)]


async def test_notify_test_sends_to_each_channel_and_says_which_failed(
    tmp_path: Path, webhook_receiver: WebhookReceiver, mailbox: Mailbox
) -> None:
    env = deployment(f"sqlite:///{tmp_path / 'knecht.db'}", tmp_path, webhook_receiver,
                     f'[notify.channels]\nops = "{mailbox.url()}"\n')
    sent = await acli("mcp-knecht", env, "notify", "test")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.splitlines() == ["ops: sent", "webhook: sent"]
    [taken] = await webhook_receiver.wait_for(1)
    assert taken.payload["type"] == "notify.test" and webhook_receiver.bad_signatures == 0
    [mail] = await mailbox.wait_for(1)
    assert mail["Subject"] == "mcp-knecht: test message"

    webhook_receiver.mode = "down"
    failed = await acli("mcp-knecht", env, "notify", "test", "webhook")
    assert failed.returncode == 1
    assert failed.stdout.strip() == f"webhook: FAILED: webhook: HTTP 503 from {webhook_receiver.url}"
    unknown = await acli("mcp-knecht", env, "notify", "test", "pager")
    assert unknown.returncode == 2 and "no channel 'pager'; configured: ops, webhook" in unknown.stderr


async def test_serve_refuses_to_start_with_a_malformed_channel(
    tmp_path: Path, webhook_receiver: WebhookReceiver
) -> None:
    env = deployment(f"sqlite:///{tmp_path / 'knecht.db'}", tmp_path, webhook_receiver,
                     '[notify]\npending = ["ops"]\n[notify.channels]\nops = "mailto://?to=nobody"\n')
    started = await acli("mcp-knecht", env, "serve", "--transport", "http", "--port", str(free_port()), timeout=30)
    assert started.returncode == 2
    assert "knecht.toml: notify.channels.ops: apprise cannot use this URL" in started.stderr
