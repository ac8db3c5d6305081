"""Exactly once even when the approver dies: killed mid-execution, the call is never run again.

(Racing approver processes on both stores: tests/test_replicas.py; racing ones killed at random:
the last test here, and `scripts/soak_approver_kills.py` for a longer run.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.approval import Operator
from mcp_knecht.core.audit import AuditEntry
from tests.conftest import server_env
from tests.staging import AGENT, acli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROPOSALS = 200
APPROVERS = 8


@pytest.fixture
def app(staged_app: App) -> App:
    return staged_app


async def test_an_approver_killed_while_executing_leaves_the_outcome_unknown_and_never_reruns(  # type: ignore[no-untyped-def]
    app: App, staged_env
) -> None:
    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await app.gate.call_tool(alice, "slow_effect", {"label": "slow", "seconds": 60})
    proposal_id = staged.data["id"]  # type: ignore[index]
    executable = str(Path(sys.executable).parent / "knecht-approve")
    approver = subprocess.Popen([executable, "approve", str(proposal_id), "--as", "bob"],
                                env=server_env(staged_env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while (await app.db.fetch_all("SELECT 1 FROM test_effects WHERE phase = 'started'")) == []:
                await anyio.sleep(0.05)
        os.kill(approver.pid, signal.SIGKILL)
    finally:
        approver.wait(timeout=30)
    assert approver.returncode == -signal.SIGKILL

    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None and proposal.status == "executing"
    assert "outcome unknown" in proposal.shown_status
    again = await acli("knecht-approve", staged_env, "approve", str(proposal_id), "--as", "carol")
    assert again.returncode == 1 and "outcome unknown" in again.stderr
    assert await app.db.fetch_all("SELECT label, phase FROM test_effects") == [{"label": "slow", "phase": "started"}]
    shown = await acli("knecht-approve", staged_env, "show", str(proposal_id))
    assert "outcome unknown" in shown.stdout

    # Just started: its approver might still be alive, so settling needs --force.
    hasty = await acli("knecht-approve", staged_env, "settle", str(proposal_id), "--as", "carol",
                       "--outcome", "failed", "--reason", "the approver was killed")
    assert hasty.returncode == 1 and "--force" in hasty.stderr
    forced = await acli("knecht-approve", staged_env, "settle", str(proposal_id), "--as", "carol",
                        "--outcome", "failed", "--reason", "the approver was killed", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (await app.proposals.get(proposal_id)).status == "failed"  # type: ignore[union-attr]
    assert await app.db.fetch_all("SELECT label, phase FROM test_effects") == [{"label": "slow", "phase": "started"}]


def _approved(proposal_id: int) -> AuditEntry:
    return AuditEntry(source="approval", subject="bob", client="pytest", tool="record_effect", outcome="approved",
                      proposal_id=proposal_id)


async def test_an_operator_settles_an_outcome_unknown_execution_without_running_anything(  # type: ignore[no-untyped-def]
    app: App, staged_env
) -> None:
    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await app.gate.call_tool(alice, "record_effect", {"label": "stuck"})
    proposal_id = staged.data["id"]  # type: ignore[index]
    pending = await acli("knecht-approve", staged_env, "settle", str(proposal_id), "--as", "carol",
                         "--outcome", "failed", "--reason", "checked")
    assert pending.returncode == 1 and "only an execution whose outcome is unknown" in pending.stderr

    # An approver that died after claiming and starting: the state a kill -9 leaves behind.
    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None
    sealed = app.approvals._approval(proposal, Operator("bob", verified=True))  # as the dead approver made it
    claimed = await app.proposals.add_approval(proposal_id, sealed, required=1, counts=lambda a: True,
                                               audit=lambda counted, done: _approved(proposal_id))
    assert claimed.outcome == "claimed"
    assert (await app.proposals.get(proposal_id)).status == "executing"  # type: ignore[union-attr]

    settled_by_cli = await acli("knecht-approve", staged_env, "settle", str(proposal_id), "--as", "carol",
                                "--outcome", "failed", "--reason", "checked", "--force")
    assert settled_by_cli.returncode == 0 and "Settled" in settled_by_cli.stdout
    proposal = await app.proposals.get(proposal_id)
    assert proposal is not None and proposal.status == "failed"
    assert proposal.error == "Settled as failed by local:carol: checked"
    assert await app.db.fetch_all("SELECT label FROM test_effects") == []  # nothing ran
    again = await acli("knecht-approve", staged_env, "settle", str(proposal_id), "--as", "carol",
                       "--outcome", "succeeded", "--reason", "changed my mind")
    assert again.returncode == 1
    await app.audit.flush()
    settled = await app.db.fetch_all(
        "SELECT subject, outcome, detail FROM audit_log WHERE proposal_id = ? AND outcome = 'settled'",
        (proposal_id,))
    assert [(r["subject"], r["outcome"]) for r in settled] == [("local:carol", "settled")]


async def test_racing_approvers_killed_at_random_run_each_proposal_at_most_once_and_claimed_first(
        database_url: str) -> None:
    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_approver_kills.py"
    run = await anyio.run_process(
        [sys.executable, str(script), "--proposals", "120", "--approvers", "4", "--kills", "8", "--db", database_url,
         "--json"], check=False)
    report = json.loads(run.stdout)
    assert (report["killed"], report["approver_failures"]) == (8, [])
    assert report["double_executions"] == report["succeeded_without_effect"] == 0
    assert set(report["statuses"]) <= {"succeeded", "executing"}  # none pending, none failed (nothing was stopped)
    assert report["executing_left"] <= 8  # only a killed approver leaves an outcome unknown
    assert report["claims_not_one"] == report["ran_without_claim_audited"] == 0
    assert report["succeeded_not_audited_once"] == 0
    assert report["audit_verified"] and report["integrity"] in ("ok", "not checked (PostgreSQL)")
    assert (report["ok"], run.returncode) == (True, 0), run.stderr.decode()[-2000:]


async def test_a_racing_approver_stopped_past_the_busy_timeout_holds_the_others_up_but_breaks_nothing(
        tmp_path: Path) -> None:
    """Stopped (SIGSTOP) for 16 s wherever it was — holding a turn, the write lock, or nothing — then let go
    on: the others wait for what it holds at most 15 s each, an execution that met its write lock fails
    saying the store was busy (nothing of it ran), and still nothing runs twice."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_approver_kills.py"
    run = await anyio.run_process(
        [sys.executable, str(script), "--proposals", "300", "--approvers", "4", "--kills", "2", "--stops", "1",
         "--stop-seconds", "16", "--db", f"sqlite:///{tmp_path / 'store.db'}", "--json"], check=False)
    report = json.loads(run.stdout)
    assert (report["killed"], report["stopped"], report["approver_failures"]) == (2, 1, [])
    assert report["double_executions"] == report["succeeded_without_effect"] == report["failed_otherwise"] == 0
    assert report["statuses"].get("pending", 0) == 0
    assert report["claims_not_one"] == report["ran_without_claim_audited"] == 0
    assert report["audit_verified"] and report["integrity"] == "ok"
    assert (report["ok"], run.returncode) == (True, 0), run.stderr.decode()[-2000:]
