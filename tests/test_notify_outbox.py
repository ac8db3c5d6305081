"""The outbox: every proposal state change writes its event in the same transaction, on both
stores; no change, no event; a change that rolls back takes its event with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import ApprovalService, Operator
from mcp_knecht.core.database import Transaction
from mcp_knecht.core.proposals import Proposal
from mcp_knecht.core.settings import load_settings
from mcp_knecht.errors import NotPendingError
from mcp_knecht.notify import OutboxWriter
from mcp_knecht.store.proposals import SqlProposalRepository
from mcp_knecht.testing import approve, reject
from tests.staging import AGENT
from tests.toolsets import EFFECTS_TABLE

pytestmark = pytest.mark.anyio

ALICE = Actor("alice", "pytest", frozenset(AGENT))


@pytest.fixture
async def app(staged_env: dict[str, str]) -> AsyncIterator[App]:
    """As the CLIs open it: the outbox is written, nothing delivers it."""
    async with open_app(load_settings(env=staged_env), watch_policy=False) as running:
        async with running.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        yield running


async def stage(app: App, tool: str = "record_effect", label: str = "deploy") -> int:
    staged = await app.gate.call_tool(ALICE, tool, {"label": label})
    assert staged.outcome == "staged", staged.text
    return int(staged.data["id"])  # type: ignore[index]


async def overdue(app: App, proposal_id: int) -> None:
    """Make a proposal's time run out (as waiting would), then let the server's sweep write it."""
    async with app.db.transaction() as tx:
        await tx.execute("UPDATE proposals SET expires_at = ? WHERE id = ?", ("2000-01-01T00:00:00.000000Z",
                                                                             proposal_id))
    await app.approvals.expire_due()


async def events(app: App) -> list[tuple[str, int, dict[str, Any]]]:
    rows = await app.db.fetch_all("SELECT event, proposal_id, payload_json FROM notify_outbox ORDER BY id")
    return [(row["event"], row["proposal_id"], json.loads(row["payload_json"])) for row in rows]


async def test_each_state_change_writes_exactly_its_event(app: App) -> None:
    approved, rejected, expiring, failing = [await stage(app, label=f"deploy-{n}") for n in range(3)] + [
        await stage(app, "fail_effect", "broken")]
    await approve(app, approved, "bob")
    await reject(app, rejected, "not on a Friday", "bob")
    await approve(app, failing, "carol")
    await overdue(app, expiring)

    told = await events(app)
    assert [(event, pid) for event, pid, _ in told] == [
        ("proposal.pending", approved), ("proposal.pending", rejected), ("proposal.pending", expiring),
        ("proposal.pending", failing),
        ("proposal.decided", approved), ("proposal.executed", approved),
        ("proposal.decided", rejected),
        ("proposal.decided", failing), ("proposal.failed", failing),
        ("proposal.expired", expiring),
    ]
    proposal = await app.proposals.get(approved)
    assert proposal is not None
    pending = told[0][2]
    assert pending == {
        "id": approved, "tool": "record_effect", "action": None, "call": "record_effect", "status": "pending",
        "proposer": {"subject": "alice", "client": "pytest"}, "arguments": 'label="deploy-0"',
        "arguments_hash": proposal.arguments_hash[:12], "rule": proposal.rule,
        "created_at": proposal.created_at, "expires_at": proposal.expires_at,
    }
    by_key = {(event, pid): facts for event, pid, facts in told}
    assert by_key[("proposal.decided", approved)]["decision"] == "approved"
    assert by_key[("proposal.decided", approved)]["decided_by"] == "bob"  # a verified operator's subject
    assert by_key[("proposal.decided", rejected)]["decision"] == "rejected"
    assert by_key[("proposal.decided", rejected)]["reason"] == "not on a Friday"
    assert by_key[("proposal.executed", approved)]["status"] == "succeeded"
    assert by_key[("proposal.failed", failing)]["error"] == "could not record broken"
    assert by_key[("proposal.expired", expiring)]["status"] == "expired"


async def test_no_change_writes_no_event(app: App) -> None:
    proposal_id = await stage(app)
    await approve(app, proposal_id, "bob")
    before = await events(app)
    with pytest.raises(NotPendingError):
        await approve(app, proposal_id, "carol")  # lost the race
    with pytest.raises(NotPendingError):
        await reject(app, proposal_id, "too late", "carol")
    assert await app.approvals.expire_due() == []
    assert await events(app) == before


async def test_a_change_that_rolls_back_takes_its_event_with_it(app: App) -> None:
    """The event is written in the change's transaction: if anything after it fails, neither stays."""
    write_event = OutboxWriter(app.secrets)

    async def then_fail(tx: Transaction, proposal: Proposal) -> None:
        await write_event(tx, proposal)
        raise RuntimeError("the process died before the commit")

    proposal_id = await stage(app)
    breaking = ApprovalService(SqlProposalRepository(app.db, app.audit.chain, on_status=then_fail), app.gate,
                               app.audit, app.keys)
    with pytest.raises(RuntimeError):
        await breaking.reject(proposal_id, Operator("bob", verified=True), "no")
    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None and proposal.status == "pending"
    assert [event for event, _, _ in await events(app)] == ["proposal.pending"]
    assert await app.db.fetch_all("SELECT 1 FROM audit_log WHERE outcome = 'rejected'") == []


async def test_the_cli_writes_events_too(app: App, staged_env: dict[str, str]) -> None:
    """An operator's `knecht-approve` knows no channels, yet its decisions are told: the event
    waits in the outbox for a server to deliver it."""
    from tests.staging import acli

    proposal_id = await stage(app)
    rejected = await acli("knecht-approve", staged_env, "reject", str(proposal_id), "--as", "bob",
                          "--reason", "use the nightly")
    assert rejected.returncode == 0, rejected.stderr
    assert [event for event, _, _ in await events(app)] == ["proposal.pending", "proposal.decided"]


async def test_a_two_person_rule_is_told_decided_once_when_the_second_approval_completes_it(
    staged_env: dict[str, str],
) -> None:
    from pathlib import Path

    Path(staged_env["KNECHT_CONFIG_DIR"], "policies.toml").write_text(
        '[[rules]]\ntool = "record_effect"\ndecision = "approve"\napprovers = 2\nreason = "two keys"\n',
        encoding="utf-8")
    async with open_app(load_settings(env=staged_env), watch_policy=False) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        proposal_id = await stage(app)
        first = await approve(app, proposal_id, "bob")
        assert first.status == "pending"  # one of two approvals: recorded, nothing told yet
        assert [event for event, _, _ in await events(app)] == ["proposal.pending"]
        await approve(app, proposal_id, "carol")
        told = await events(app)
    assert [event for event, _, _ in told] == ["proposal.pending", "proposal.decided", "proposal.executed"]
    assert told[1][2]["decided_by"] == "carol"
    assert (told[0][2]["policy_reason"], told[0][2]["approvers"]) == ("two keys", 2)
