"""Delivery: each event reaches its destinations once, signed; a receiver that was down gets it
later; a delivery that keeps failing gives up and says why; two workers never deliver the same
one; a worker that died is replaced after its lease; a dead channel never slows anybody."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.settings import load_settings
from mcp_knecht.notify import NotifyWorker, notify_config, outbox
from mcp_knecht.notify.channels import destinations
from mcp_knecht.store import open_database
from mcp_knecht.testing import approve, reject
from tests.receivers import Mailbox, WebhookReceiver, text_of
from tests.staging import AGENT, acli
from tests.toolsets import EFFECTS_TABLE

pytestmark = pytest.mark.anyio

ALICE = Actor("alice", "pytest", frozenset(AGENT))
FAST = '[notify.delivery]\ntimeout = 2\nbackoff = 0.05\nmax_backoff = 0.2\nmax_attempts = 3\n'


def configure(env: dict[str, str], knecht_toml: str, receiver: WebhookReceiver | None = None) -> dict[str, str]:
    """Write knecht.toml into the test's config dir; point the webhook at `receiver`."""
    Path(env["KNECHT_CONFIG_DIR"], "knecht.toml").write_text(knecht_toml, encoding="utf-8")
    if receiver is None:
        return env
    return {**env, "KNECHT_WEBHOOK_URL": receiver.url, "KNECHT_WEBHOOK_SECRET": receiver.secret}


@asynccontextmanager
async def cli_app(env: dict[str, str]) -> AsyncIterator[App]:
    """The app as an operator's CLI opens it: writes the outbox, delivers nothing."""
    async with open_app(load_settings(env=env), watch_policy=False) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        yield app


@asynccontextmanager
async def worker_for(app: App, env: dict[str, str], **options: Any) -> AsyncIterator[NotifyWorker]:
    config = notify_config(load_settings(env=env), app.registry)
    app.secrets.add(config.secrets)
    async with httpx.AsyncClient() as client:
        yield NotifyWorker(app.db, config, destinations(config, client), scrub=app.secrets, **options)


async def stage(app: App, label: str = "deploy", tool: str = "record_effect") -> int:
    staged = await app.gate.call_tool(ALICE, tool, {"label": label})
    assert staged.outcome == "staged", staged.text
    return int(staged.data["id"])  # type: ignore[index]


async def deliveries(app: App) -> list[dict[str, Any]]:
    return await app.db.fetch_all(
        "SELECT d.destination, d.status, d.attempts, d.last_error, o.event, o.proposal_id, o.uid"
        " FROM notify_deliveries d JOIN notify_outbox o ON o.id = d.event_id ORDER BY d.id")


async def until(condition: Callable[[], Any], timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not await condition():
            await anyio.sleep(0.05)


async def test_each_event_reaches_the_webhook_signed_and_the_mailboxes_once(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver, mailbox: Mailbox
) -> None:
    env = configure(staged_env, f"""
[notify]
public_url = "https://knecht.example.com"
pending = ["ops"]
proposer = ["dev"]
[notify.channels]
ops = "{mailbox.url("ops@example.com")}"
dev = "{mailbox.url("alice@example.com")}"
{FAST}""", webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        first, second = await stage(app, "deploy-1"), await stage(app, "deploy-2")
        await approve(app, first, "bob")
        await reject(app, second, "not today", "bob")
        assert await worker.run_once() == 10
        assert await worker.run_once() == 0

    taken = await webhook_receiver.wait_for(5)
    assert webhook_receiver.bad_signatures == 0
    assert sorted((d.payload["type"], d.payload["data"]["id"]) for d in taken) == [
        ("proposal.decided", first), ("proposal.decided", second), ("proposal.executed", first),
        ("proposal.pending", first), ("proposal.pending", second)]
    assert set(webhook_receiver.ids().values()) == {1}
    pending = next(d.payload for d in taken if d.payload["type"] == "proposal.pending")
    data = pending["data"]
    assert data["link"] == f"https://knecht.example.com/proposals/{data['id']}"
    assert data["proposer"] == {"subject": "alice", "client": "pytest"}
    assert data["tool"] == "record_effect" and data["status"] == "pending"
    assert len(data["arguments_hash"]) == 12 and data["arguments"].startswith('label="deploy-')
    assert all(d.webhook_id.startswith("evt_") for d in taken)

    mails = await mailbox.wait_for(5)
    to_ops = [m for m in mails if m["To"] == "ops@example.com"]
    to_alice = [m for m in mails if m["To"] == "alice@example.com"]
    assert len(to_ops) == 2 and len(to_alice) == 3
    assert {m["Subject"] for m in to_ops} == {f"Approval needed: #{first} record_effect",
                                              f"Approval needed: #{second} record_effect"}
    assert f"Review: https://knecht.example.com/proposals/{first}" in "\n".join(text_of(m) for m in to_ops)
    assert f"#{second} record_effect rejected by bob" in {m["Subject"] for m in to_alice}
    assert "Reason: not today" in "\n".join(text_of(m) for m in to_alice)


async def test_without_a_public_url_the_link_is_the_command(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    env = configure(staged_env, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        proposal_id = await stage(app)
        await worker.run_once()
    [taken] = await webhook_receiver.wait_for(1)
    assert taken.payload["data"]["link"] == f"knecht-approve show {proposal_id}"


async def test_a_receiver_that_was_down_gets_the_event_later_with_the_same_id(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    # A backoff long enough that the retry is not due again within the same run_once on a slow machine.
    env = configure(staged_env, FAST.replace("backoff = 0.05\nmax_backoff = 0.2", "backoff = 1\nmax_backoff = 1"),
                    webhook_receiver)
    webhook_receiver.mode = "down"
    async with cli_app(env) as app, worker_for(app, env) as worker:
        await stage(app)
        assert await worker.run_once() == 1
        [row] = await deliveries(app)
        assert (row["status"], row["attempts"]) == ("pending", 1)
        assert row["last_error"] == f"webhook: HTTP 503 from {webhook_receiver.url}"
        webhook_receiver.mode = "up"
        assert await worker.run_once() == 0  # not due yet
        await anyio.sleep(1.1)  # the backoff (0.8-1 s), bounded by max_backoff
        assert await worker.run_once() == 1
        [row] = await deliveries(app)
        assert (row["status"], row["attempts"], row["last_error"]) == ("delivered", 2, None)
    assert webhook_receiver.refused == 1
    assert webhook_receiver.ids() == {row["uid"]: 1}


async def test_a_delivery_that_keeps_failing_gives_up_and_status_says_why(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    env = configure(staged_env, FAST, webhook_receiver)
    webhook_receiver.mode = "down"
    async with cli_app(env) as app, worker_for(app, env) as worker:
        proposal_id = await stage(app)
        for _ in range(3):
            await worker.run_once()
            await anyio.sleep(0.25)
        assert await worker.run_once() == 0
        [row] = await deliveries(app)
        assert (row["status"], row["attempts"]) == ("failed", 3)
        webhook_receiver.mode = "gone"
        await stage(app, "another")
        assert await worker.run_once() == 1  # 410 Gone: no retry
        assert [r["status"] for r in await deliveries(app)] == ["failed", "failed"]

    shown = await acli("mcp-knecht", env, "notify", "status", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["deliveries"] == [{"destination": "webhook", "status": "failed", "n": 2}]
    errors = {(p["proposal_id"], p["last_error"]) for p in report["problems"]}
    assert (proposal_id, f"webhook: HTTP 503 from {webhook_receiver.url}") in errors
    assert (proposal_id + 1, f"webhook: HTTP 410 from {webhook_receiver.url}") in errors
    text = await acli("mcp-knecht", env, "notify", "status")
    assert "LAST ERROR" in text.stdout and "HTTP 410" in text.stdout


async def test_two_workers_on_one_store_deliver_each_event_exactly_once(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    """As two replicas would: each worker has its own connection(s) to the store."""
    env = configure(staged_env, FAST.replace("timeout = 2", "timeout = 5"), webhook_receiver)
    count = 60
    async with cli_app(env) as app:
        for n in range(count):
            await stage(app, f"deploy-{n}")
        config = notify_config(load_settings(env=env), app.registry)
        workers: list[NotifyWorker] = []
        async with httpx.AsyncClient() as client, anyio.create_task_group() as tasks:
            for name in ("replica-a", "replica-b"):
                db = await open_database(env["KNECHT_DATABASE_URL"], migrate=False)
                tasks.start_soon(_run_then_close, NotifyWorker(
                    db, config, destinations(config, client), scrub=app.secrets, interval=0.05, name=name), db,
                    workers)
            await webhook_receiver.wait_for(count, timeout=60)

            async def all_recorded() -> bool:
                return [r["status"] for r in await deliveries(app)] == ["delivered"] * count

            await until(all_recorded)  # every outcome written, none lost between send and record
            await anyio.sleep(0.3)  # time for a duplicate to show, if there were one
            tasks.cancel_scope.cancel()
    assert len(webhook_receiver.delivered) == count
    assert set(webhook_receiver.ids().values()) == {1}
    assert sum(w.delivered for w in workers) == count


async def _run_then_close(worker: NotifyWorker, db: Any, workers: list[NotifyWorker]) -> None:
    workers.append(worker)
    try:
        await worker.run()
    finally:
        with anyio.CancelScope(shield=True):
            await db.close()


async def test_a_worker_that_died_holding_a_delivery_is_replaced_after_its_lease(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    env = configure(staged_env, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env, name="survivor") as worker:
        await stage(app)
        await outbox.route(app.db, lambda event, facts: ("webhook",))
        [held] = await outbox.claim(app.db, "killed-worker", lease=2.0, limit=10)
        assert await worker.run_once() == 0  # held by another, whose lease still runs
        await anyio.sleep(2.1)
        assert await worker.run_once() == 1
        [row] = await deliveries(app)
        assert (row["status"], row["attempts"]) == ("delivered", 2)
        assert not await outbox.holds(app.db, held.id, "killed-worker")  # its claim was taken over
    assert webhook_receiver.ids() == {held.uid: 1}


async def test_a_dead_webhook_never_slows_a_gate_call_or_a_decision(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    env = configure(staged_env, '[notify.delivery]\ntimeout = "60s"\n', webhook_receiver)
    webhook_receiver.mode = "hang"
    async with cli_app(env) as app, worker_for(app, env, interval=0.05) as worker, \
            anyio.create_task_group() as tasks:
        tasks.start_soon(worker.run)
        await stage(app, "first")
        await until(lambda: _true(webhook_receiver.hanging >= 1))
        slowest = 0.0
        for n in range(10):
            started = anyio.current_time()
            proposal_id = await stage(app, f"deploy-{n}")
            if n % 2:
                await approve(app, proposal_id, "bob")
            else:
                await reject(app, proposal_id, "no", "bob")
            slowest = max(slowest, anyio.current_time() - started)
        assert slowest < 1.0, f"a call and its decision took {slowest:.2f}s with the webhook hanging"
        assert webhook_receiver.delivered == []
        tasks.cancel_scope.cancel()
    webhook_receiver.release()


async def _true(value: bool) -> bool:
    return value


async def test_an_expired_proposal_is_told_without_anyone_reading_it(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    env = configure({**staged_env, "KNECHT_PROPOSAL_TTL": "1s"}, FAST, webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env, interval=0.05) as worker, \
            anyio.create_task_group() as tasks:
        proposal_id = await stage(app)
        tasks.start_soon(worker.run)
        await webhook_receiver.wait_for(1, timeout=10)
        await anyio.sleep(1.1)
        await app.approvals.expire_due()  # what the server's sweep does every 30 s
        taken = await webhook_receiver.wait_for(2, timeout=10)
        tasks.cancel_scope.cancel()
    assert [(d.payload["type"], d.payload["data"]["id"]) for d in taken] == [
        ("proposal.pending", proposal_id), ("proposal.expired", proposal_id)]
    assert taken[1].payload["data"]["status"] == "expired"


async def test_the_server_delivers_in_the_background(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver
) -> None:
    """`open_app` of a server runs the worker from knecht.toml and the environment."""
    env = configure(staged_env, FAST, webhook_receiver)
    async with open_app(load_settings(env=env)) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        proposal_id = await stage(app)
        [taken] = await webhook_receiver.wait_for(1, timeout=10)
    assert (taken.payload["type"], taken.payload["data"]["id"]) == ("proposal.pending", proposal_id)


async def test_a_server_with_a_malformed_channel_does_not_start(staged_env: dict[str, str]) -> None:
    from mcp_knecht.errors import ConfigError

    env = configure(staged_env, '[notify.channels]\nops = "mailto://nobody?to=not-an-address"\n')
    with pytest.raises(ConfigError, match=r"notify\.channels\.ops: apprise cannot use this URL"):
        async with open_app(load_settings(env=env)):
            pass
    async with open_app(load_settings(env=env), watch_policy=False):
        pass  # an operator's CLI does not deliver, so it does not read [notify]
