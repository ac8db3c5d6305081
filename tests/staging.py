"""Shared pieces for tests of staged writes: a config dir of the test's own, the CLIs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

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
