"""Exactly once even when the approver dies: killed mid-execution, the call is never run again.

(Racing approver processes on both stores: tests/test_replicas.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
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
