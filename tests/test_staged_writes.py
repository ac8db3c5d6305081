"""Staged writes end to end: an agent proposes over MCP, operators decide with the real
`knecht-approve` CLI, the effect happens exactly once and the agent learns the outcome."""

from __future__ import annotations

import json

import anyio
import pytest

from mcp_knecht.app import App
from tests.staging import AGENT, acli

pytestmark = pytest.mark.anyio


@pytest.fixture
def app(staged_app: App) -> App:
    return staged_app


@pytest.fixture(params=["auto"], ids=["2026-07-28"])
def protocol_mode(request: pytest.FixtureRequest) -> str:
    return request.param


async def effects(app: App, label: str | None = None) -> list[tuple[str, str, str, str]]:
    rows = await app.db.fetch_all(
        "SELECT label, phase, subject, source FROM test_effects" + (" WHERE label = ?" if label else ""),
        (label,) if label else (),
    )
    return [(r["label"], r["phase"], r["subject"], r["source"]) for r in rows]


async def propose(client, label: str = "deploy-1") -> int:  # type: ignore[no-untyped-def]
    result = await client.call_tool("record_effect", {"label": label})
    assert not result.is_error, result.content[0].text
    proposal_id = result.structured_content["id"]
    assert result.content[0].text.startswith(f"Submitted for approval (#{proposal_id}). ")
    assert result.structured_content["status"] == "pending"
    return int(proposal_id)


async def test_a_staged_call_runs_only_after_approval_and_exactly_once(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "submits a proposal for human approval" in tools["record_effect"].description
        assert tools["record_effect"].annotations.destructive_hint is True
        proposal_id = await propose(client)
        await app.audit.flush()
        assert await effects(app) == []

        listed = await acli("knecht-approve", staged_env, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [entry] = json.loads(listed.stdout)
        assert (entry["id"], entry["tool"], entry["proposer"]["subject"]) == (proposal_id, "record_effect", "alice")
        shown = await acli("knecht-approve", staged_env, "show", str(proposal_id))
        assert shown.returncode == 0 and entry["arguments_hash"] in shown.stdout and "deploy-1" in shown.stdout

        approved = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob",
                       "--expect-hash", entry["arguments_hash"][:12])
        assert approved.returncode == 0, approved.stderr
        assert "succeeded" in approved.stdout
        assert await effects(app) == [("deploy-1", "done", "alice", "approval")]

        again = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "carol")
        assert again.returncode == 1
        assert "not pending any more" in again.stderr and "bob" in again.stderr
        assert len(await effects(app)) == 1

        followed = await client.call_tool("get_proposal", {"id": proposal_id})
        assert followed.structured_content["status"] == "succeeded"
        assert followed.structured_content["decided_by"] == "local:bob"  # a name nobody verified
        assert followed.structured_content["result"] == {"recorded": "deploy-1"}

    await app.audit.flush()
    trail = await app.db.fetch_all(
        "SELECT source, subject, outcome FROM audit_log WHERE proposal_id = ? ORDER BY id", (proposal_id,))
    assert [(r["source"], r["subject"], r["outcome"]) for r in trail] == [
        ("mcp", "alice", "staged"), ("approval", "local:bob", "approved"), ("approval", "local:bob", "executed")]
    verified = await acli("mcp-knecht", staged_env, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_rejection_reaches_the_agent_with_its_reason(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client)
        rejected = await acli("knecht-approve", staged_env, "reject", str(proposal_id), "--as", "bob",
                       "--reason", "not on a Friday")
        assert rejected.returncode == 0, rejected.stderr
        followed = await client.call_tool("get_proposal", {"id": proposal_id})
        assert followed.structured_content["status"] == "rejected"
        assert followed.structured_content["reason"] == "not on a Friday"
        late = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "carol")
        assert late.returncode == 1 and "rejected" in late.stderr
    assert await effects(app) == []


async def test_operators_cannot_approve_their_own_proposals(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client)
    refused = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "alice")
    assert refused.returncode == 1 and "another operator" in refused.stderr
    assert (await app.proposals.get(proposal_id)).status == "pending"  # type: ignore[union-attr]


async def test_a_wrong_expected_hash_is_refused(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client)
    refused = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob",
                  "--expect-hash", "00000000")
    assert refused.returncode == 1 and "knecht-approve show" in refused.stderr
    too_short = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob",
                           "--expect-hash", "a")
    assert too_short.returncode == 2
    assert (await app.proposals.get(proposal_id)).status == "pending"  # type: ignore[union-attr]
    assert await effects(app) == []


async def test_an_expired_proposal_cannot_be_approved(staged_env, actor_for) -> None:  # type: ignore[no-untyped-def]
    from mcp_knecht import testing

    quick = {**staged_env, "KNECHT_PROPOSAL_TTL": "1s"}
    async with testing.running_app(quick, watch=True) as app:
        async with testing.connect(app, actor_for("alice", AGENT)) as client:
            proposal_id = await propose(client)
            await anyio.sleep(1.2)
            refused = await acli("knecht-approve", quick, "approve", str(proposal_id), "--as", "bob")
            assert refused.returncode == 1 and "expired" in refused.stderr
            followed = await client.call_tool("get_proposal", {"id": proposal_id})
            assert followed.structured_content["status"] == "expired"
        await app.approvals.expire_due()  # what the server's sweep does every 30 s: written, audited
        await app.audit.flush()
        expired = await app.db.fetch_all("SELECT subject, outcome FROM audit_log WHERE proposal_id = ? "
                                         "AND outcome = 'expired'", (proposal_id,))
        assert expired == [{"subject": "mcp-knecht", "outcome": "expired"}]
        assert await app.db.fetch_one("SELECT 1 AS ran FROM audit_log WHERE outcome = 'executed'") is None


async def test_a_proposal_whose_expiry_was_pushed_back_in_the_database_is_refused(  # type: ignore[no-untyped-def]
        connect, app: App, staged_env) -> None:
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client)
    async with app.db.transaction() as tx:
        await tx.execute("UPDATE proposals SET expires_at = '2999-01-01T00:00:00.000000Z' WHERE id = ?",
                         (proposal_id,))
    refused = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob")
    assert refused.returncode == 1 and "fails its seal" in refused.stderr
    assert await effects(app) == []


async def test_an_unknown_id_exits_1_and_bad_usage_exits_2(staged_env) -> None:  # type: ignore[no-untyped-def]
    assert (await acli("knecht-approve", staged_env, "approve", "999", "--as", "bob")).returncode == 1
    assert (await acli("knecht-approve", staged_env, "show", "999")).returncode == 1
    assert (await acli("knecht-approve", staged_env, "approve", "not-a-number")).returncode == 2
    assert (await acli("knecht-approve", staged_env, "reject", "1", "--as", "bob")).returncode == 2  # no --reason


async def test_another_subjects_proposal_looks_exactly_like_a_missing_one(connect, app: App) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as alice:
        proposal_id = await propose(alice)
    async with connect("mallory", AGENT) as mallory:
        theirs = await mallory.call_tool("get_proposal", {"id": proposal_id})
        missing = await mallory.call_tool("get_proposal", {"id": 424242})
        assert theirs.is_error and missing.is_error
        assert theirs.content[0].text.replace(str(proposal_id), "N") == missing.content[0].text.replace("424242", "N")
        assert (await mallory.call_tool("list_proposals", {})).structured_content == {"proposals": []}


async def test_get_proposal_can_wait_for_the_decision(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client)
        outcome: dict[str, object] = {}

        async def wait() -> None:
            result = await client.call_tool("get_proposal", {"id": proposal_id, "wait_seconds": 30})
            outcome.update(result.structured_content)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait)
            await anyio.sleep(0.5)
            assert not outcome  # still waiting
            approved = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "bob")
            assert approved.returncode == 0, approved.stderr
        assert outcome["status"] == "succeeded"
        over_limit = await client.call_tool("get_proposal", {"id": proposal_id, "wait_seconds": 51})
        assert over_limit.is_error and "wait_seconds" in over_limit.content[0].text


async def test_watch_prints_new_pending_proposals(connect, app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    async with connect("alice", AGENT) as client:
        proposal_id = await propose(client, "watched")
    watched = await acli("knecht-approve", staged_env, "watch", "--all", "--json",
                         "--timeout", "1.5", "--interval", "0.2")
    assert watched.returncode == 0, watched.stderr
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["id"], e["arguments"]) for e in lines] == [(proposal_id, {"label": "watched"})]


async def test_the_inbox_returns_each_decision_once(connect, app: App) -> None:  # type: ignore[no-untyped-def]
    """An agent that cannot be woken learns of decisions at its next session: list_proposals(unseen=true)."""
    from mcp_knecht import testing

    async with connect("alice", AGENT) as client:
        approved, rejected, waiting, looked_at = [await propose(client, f"inbox-{n}") for n in range(4)]
        assert (await client.call_tool("list_proposals", {"unseen": True})).structured_content == {"proposals": []}
    await testing.approve(app, approved)
    await testing.reject(app, rejected, "not now")
    await testing.approve(app, looked_at)
    async with connect("alice", AGENT) as client:
        await client.call_tool("get_proposal", {"id": looked_at})  # seen there: not in the inbox any more
        first = (await client.call_tool("list_proposals", {"unseen": True})).structured_content
        second = (await client.call_tool("list_proposals", {"unseen": True})).structured_content
        both = await client.call_tool("list_proposals", {"unseen": True, "status": "failed"})
    assert [(p["id"], p["status"]) for p in first["proposals"]] == [(approved, "succeeded"), (rejected, "rejected")]
    assert first["proposals"][1]["reason"] == "not now"
    assert second == {"proposals": []}
    assert both.is_error
    async with connect("carol", AGENT) as other:
        assert (await other.call_tool("list_proposals", {"unseen": True})).structured_content == {"proposals": []}
    assert waiting not in [p["id"] for p in first["proposals"]]
