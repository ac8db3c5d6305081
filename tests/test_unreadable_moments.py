"""A moment written around the store that is no moment — bytes, or text that is no timestamp — fails no
read but its own: a `/metrics` scrape, an agent waiting on its proposal, the pages, a run's duration and
settling an execution all go on. (An expiry written as bytes: tests/test_approval_integrity.py.)"""

from __future__ import annotations

import math

import anyio
import pytest

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.core import clock
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import Operator
from mcp_knecht.errors import DecisionError
from mcp_knecht.knecht.runs import duration_seconds
from mcp_knecht.notify import outbox
from mcp_knecht.web.render import ago, moment, when
from tests.receivers import WebhookReceiver
from tests.staging import AGENT
from tests.test_monitoring import _parse, _value
from tests.test_notify_delivery import FAST, cli_app, configure, stage, worker_for

pytestmark = pytest.mark.anyio

# As SQL literals: a BLOB (SQLite keeps it as bytes even in a TEXT column), text, and a number (text by the
# column's affinity on SQLite, and by the cast PostgreSQL makes of a literal into a text column).
NO_MOMENTS = ["x'00ff'", "'garbage'", "5"]


async def _stage(app: App, label: str) -> int:
    staged = await app.gate.call_tool(Actor("alice", "pytest", frozenset(AGENT)), "record_effect", {"label": label})
    return int(staged.data["id"])  # type: ignore[index]


async def _rewrite(app: App, proposal_id: int, column: str, literal: str) -> None:
    if literal.startswith("x'") and app.db.dialect == "postgresql":  # its text columns hold text only:
        literal = "'2026-13-45T99:99:99.000000Z'"  # one that looks like a moment instead
    async with app.db.transaction() as tx:
        await tx.execute(f"UPDATE proposals SET {column} = {literal} WHERE id = ?", (proposal_id,))


@pytest.mark.parametrize("literal", NO_MOMENTS)
async def test_a_scrape_goes_on_when_the_oldest_pending_ones_staging_time_is_no_moment(
    staged_app: App, literal: str, caplog: pytest.LogCaptureFixture
) -> None:
    from mcp_knecht.observe.metrics import Metrics

    metrics = Metrics()
    metrics.watch(db=staged_app.db, tools=[tool.name for tool in staged_app.registry])
    oldest = await _stage(staged_app, "first")
    await _stage(staged_app, "second")
    await _rewrite(staged_app, oldest, "created_at", literal)

    for _ in range(2):
        samples = _parse((await metrics.render()).decode())
        assert _value(samples, "knecht_proposals_pending") == 2
        assert _value(samples, "knecht_proposals", status="pending") == 2
        assert math.isnan(_value(samples, "knecht_proposal_oldest_pending_age_seconds"))  # type: ignore[arg-type]
    told = [r for r in caplog.records if "created_at is no timestamp" in r.getMessage()]
    assert len(told) == 1  # once per value, not at every scrape

    async with staged_app.db.transaction() as tx:  # that one decided: the age is read again
        await tx.execute("UPDATE proposals SET status = 'rejected' WHERE id = ?", (oldest,))
    samples = _parse((await metrics.render()).decode())
    assert 0 <= (_value(samples, "knecht_proposal_oldest_pending_age_seconds") or -1) < 60


@pytest.mark.parametrize("literal", NO_MOMENTS)
async def test_an_agent_waiting_on_a_proposal_whose_expiry_is_no_moment_is_answered_when_its_wait_ends(
    staged_app: App, literal: str
) -> None:
    proposal_id = await _stage(staged_app, "waited-on")
    await _rewrite(staged_app, proposal_id, "expires_at", literal)
    async with testing.connect(staged_app, testing.actor("alice", AGENT)) as client:
        answer = await client.call_tool("get_proposal", {"id": proposal_id, "wait_seconds": 1})
    assert not answer.is_error, answer.content
    assert answer.structured_content is not None and answer.structured_content["id"] == proposal_id
    # Bytes read as long past (expired); text after every timestamp reads as pending, as the store reads it.
    assert answer.structured_content["status"] == ("expired" if literal.startswith("x'")
                                                   and staged_app.db.dialect == "sqlite" else "pending")


async def test_settling_an_execution_whose_start_is_no_moment_needs_force(staged_app: App) -> None:
    proposal_id = await _stage(staged_app, "stuck")
    async with staged_app.db.transaction() as tx:  # what a dead approver leaves, its start rewritten
        await tx.execute("UPDATE proposals SET status = 'executing', decided_by = 'local:bob',"
                         " decided_at = created_at, started_at = 'garbage' WHERE id = ?", (proposal_id,))
    carol = Operator("carol")
    with pytest.raises(DecisionError, match=r"no timestamp.*--force"):
        await staged_app.approvals.settle(proposal_id, carol, succeeded=False, note="checked")
    settled = await staged_app.approvals.settle(proposal_id, carol, succeeded=False, note="checked", force=True)
    assert settled.status == "failed"
    assert await staged_app.db.fetch_all("SELECT label FROM test_effects") == []  # nothing ran


@pytest.mark.parametrize("value", [b"\x00\xff", "garbage", "5"])
def test_pages_and_run_durations_show_a_moment_that_is_none_as_it_is(value: object) -> None:
    assert clock.readable(value) is None and clock.seconds_until(value) is None
    assert when(value) == str(value)  # type: ignore[arg-type]
    assert moment(value) == str(value)  # type: ignore[arg-type]
    assert ago(value) == ""  # type: ignore[arg-type]
    assert duration_seconds(value, "2026-12-07T10:00:00.000000Z") is None  # type: ignore[arg-type]
    assert duration_seconds("2026-12-07T10:00:00.000000Z", value) is None  # type: ignore[arg-type]
    assert duration_seconds("2026-12-07T10:00:00.000000Z", "2026-12-07T10:01:30.500000Z") == 90


@pytest.mark.parametrize("literal", NO_MOMENTS)
async def test_the_notification_worker_goes_on_when_a_delivery_is_due_at_no_moment(
    staged_env: dict[str, str], webhook_receiver: WebhookReceiver, literal: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = configure(staged_env, f"[notify]\npending = []\n{FAST}", webhook_receiver)
    async with cli_app(env) as app, worker_for(app, env) as worker:
        if literal.startswith("x'") and app.db.dialect == "postgresql":
            literal = "'2026-13-45T99:99:99.000000Z'"
        await stage(app, "deploy")
        assert await outbox.route(app.db, worker._router) == 1
        async with app.db.transaction() as tx:  # its retry rewritten around the store
            await tx.execute(f"UPDATE notify_deliveries SET next_attempt_at = {literal}")
        async with anyio.create_task_group() as tasks:
            for _ in range(2):
                assert await worker._round(tasks) == worker._interval
    assert not [r for r in caplog.records if "round failed" in r.getMessage()]
