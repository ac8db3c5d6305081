"""Exactly once, whatever happens: racing approver processes and an approver killed mid-call."""

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
from tests.conftest import REPO, server_env
from tests.staging import AGENT, acli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PROPOSALS = 200
APPROVERS = 8


@pytest.fixture
def app(staged_app: App) -> App:
    return staged_app


async def test_racing_approver_processes_execute_each_proposal_exactly_once(app: App, staged_env) -> None:  # type: ignore[no-untyped-def]
    alice = Actor("alice", "pytest", frozenset(AGENT))
    for n in range(PROPOSALS):
        staged = await app.gate.call_tool(alice, "record_effect", {"label": f"effect-{n}"})
        assert staged.outcome == "staged"
    await app.audit.flush()

    workers = [
        await anyio.open_process(
            [sys.executable, "-m", "tests.approver_worker", f"operator-{i}", "1", str(PROPOSALS)],
            env=server_env(staged_env), cwd=REPO,
        )
        for i in range(APPROVERS)
    ]
    reports = []
    with anyio.fail_after(300):
        for worker in workers:
            await worker.wait()
            assert worker.returncode == 0, (await worker.stderr.receive()).decode()  # type: ignore[union-attr]
            reports.append(json.loads((await worker.stdout.receive()).decode()))  # type: ignore[union-attr]
            await worker.aclose()

    rows = await app.db.fetch_all("SELECT label, COUNT(*) AS n FROM test_effects GROUP BY label")
    assert len(rows) == PROPOSALS
    assert {row["n"] for row in rows} == {1}, "some effect ran more than once"
    assert sum(r["won"] for r in reports) == PROPOSALS
    assert sum(r["won"] + r["lost"] for r in reports) == PROPOSALS * APPROVERS
    statuses = await app.db.fetch_all("SELECT status, COUNT(*) AS n FROM proposals GROUP BY status")
    assert [(r["status"], r["n"]) for r in statuses] == [("succeeded", PROPOSALS)]
    verified = await acli("mcp-knecht", staged_env, "audit", "verify")
    assert verified.returncode == 0, verified.stdout


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
