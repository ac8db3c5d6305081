"""Shared pieces for tests of staged writes: a config dir of the test's own, the CLIs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.store.audit_log import verify_chain
from tests.conftest import REPO, server_env

AGENT = ("projects:read", "runs:read", "runs:write", "proposals:read")
TEST_TOOLSETS = "mcp_knecht.knecht:toolset,tests.toolsets:toolset"


def make_config(folder: Path, policy: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "scopes").exists():
        shutil.copytree(REPO / "scopes", folder / "scopes")
    (folder / "policies.toml").write_text(policy, encoding="utf-8")
    return folder


def cli(program: str, env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    executable = str(Path(sys.executable).parent / program)
    return subprocess.run([executable, *args], env=server_env(env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


async def acli(program: str, env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`cli` for async tests: the event loop keeps running (and releasing its locks) meanwhile."""
    with anyio.fail_after(timeout):
        done = await anyio.run_process([str(Path(sys.executable).parent / program), *args],
                                       env=server_env(env), check=False, stdin=subprocess.DEVNULL)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


async def racing_approvers(env: dict[str, str], approvers: int, first: int, last: int) -> list[dict[str, Any]]:
    """`approvers` processes (`tests.approver_worker`), each trying to approve every id in
    `first..last` at once; their reports (won, recorded, lost) once all are done."""
    workers = [
        await anyio.open_process(
            [sys.executable, "-m", "tests.approver_worker", f"operator-{i}", str(first), str(last)],
            env=server_env(env), cwd=REPO,
        )
        for i in range(approvers)
    ]
    reports = []
    with anyio.fail_after(300):
        for worker in workers:
            await worker.wait()
            assert worker.returncode == 0, (await worker.stderr.receive()).decode()  # type: ignore[union-attr]
            reports.append(json.loads((await worker.stdout.receive()).decode()))  # type: ignore[union-attr]
            await worker.aclose()
    return reports


async def writes_go_on_with_everything_on_record(app: App) -> None:
    """After a write refused as "store busy" (and a read that went on meanwhile): the next write, through
    the SDK's client, works; the audit rows that waited land; the one staged call, the refused one and the
    read are all on record, in one chain."""
    async with testing.connect(app, testing.actor("alice", AGENT)) as client:
        later = await client.call_tool("record_effect", {"label": "afterwards"})
    assert not later.is_error
    with anyio.fail_after(10):
        await app.audit.flush()
    outcomes = [r["outcome"] for r in await app.db.fetch_all("SELECT outcome FROM audit_log ORDER BY id")]
    assert outcomes.count("staged") == 1 and "failed" in outcomes and "ran" in outcomes
    assert await verify_chain(app.db, app.audit.chain) == []
