"""The log texts of the demo actions, per action, outcome and failure kind (some with secrets in
them, for the scrubber), and the very large log for benchmarks."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from mcp_knecht.core.database import Database
from mcp_knecht.knecht.demo.catalogue import WORKFLOW_ACTIONS, _Project
from mcp_knecht.knecht.demo.common import BATCH_ROWS, _iso


def _action_log(
    rng: random.Random,
    project: _Project,
    name: str,
    outcome: str,
    kind: str | None,
    sha: str,
    branch: str,
    workflow: str,
) -> list[str]:
    spec = project.spec
    stack = spec.stack
    slug, sha7 = spec.slug, sha[:7]
    failing = outcome == "failed"

    def fmt(lines: Sequence[str]) -> list[str]:
        return [line.replace("{slug}", slug).replace("{sha7}", sha7) for line in lines]

    if name == "parse-workflow":
        if failing and kind == "bad_workflow_syntax":
            line = rng.choice((14, 22, 31))
            return [
                f"Reading .knecht/workflows/{workflow}.yml at {sha7}",
                f"yaml: line {line}: mapping values are not allowed in this context",
                f"  {line - 1} |   - name: test",
                f"  {line} |     run: {stack.test}: --junitxml=results/junit.xml",
                "     |                  ^",
                f"Error: the workflow file .knecht/workflows/{workflow}.yml is not valid YAML; "
                "no actions were started.",
            ]
        return [
            f"Reading .knecht/workflows/{workflow}.yml at {sha7}",
            f"Workflow {workflow}: {len(WORKFLOW_ACTIONS[workflow]) - 1} actions, inputs validated",
        ]
    if name == "checkout":
        return [
            f"$ git clone --depth 1 https://git.acme.internal/acme/{slug}.git .",
            f"HEAD is now at {sha7} on {branch}",
        ]
    if name == "install":
        lines = [f"$ {stack.install}"]
        if rng.random() < 0.08:
            # A developer debugging credentials left this in; the scrubber must catch it.
            lines.append(f"+ echo AWS_ACCESS_KEY_ID={project.secrets['AWS_ACCESS_KEY_ID']}")
            lines.append(f"AWS_ACCESS_KEY_ID={project.secrets['AWS_ACCESS_KEY_ID']}")
        if failing and kind == "dependency_install":
            return lines + fmt(stack.dependency_error) + [f"Error: '{stack.install}' exited with code 1"]
        if failing and kind == "flaky_network":
            return (
                lines
                + fmt(stack.install_ok[:1])
                + [
                    f"Downloading https://{stack.download_host}/packages/…/archive.tar.gz (18.4 MB)",
                    f"WARNING: Retrying (Retry(total=2)) after connection broken by "
                    f"'ConnectionResetError(104, 'Connection reset by peer')': {stack.download_host}",
                    "WARNING: Retrying (Retry(total=1)) after connection broken by 'ReadTimeoutError'",
                    f"ERROR: Could not download from https://{stack.download_host}: "
                    "[Errno 104] Connection reset by peer while downloading (read 9.1 MB of 18.4 MB)",
                    f"Error: '{stack.install}' exited with code 1",
                ]
            )
        return lines + fmt(stack.install_ok)
    if name == "lint":
        return [f"$ {stack.lint}", "All checks passed."]
    if name == "build":
        lines = [f"$ {stack.build}".replace("{slug}", slug).replace("{sha7}", sha7), *fmt(stack.build_ok)]
        if kind == "out_of_memory":
            # The cause shows here, one action before the one that gets killed.
            lines[1:1] = [
                "warning: container memory at 3.6 GiB of 4.0 GiB limit after dependency compilation",
                "warning: build cache (2.9 GiB) is kept in /tmp and counts against the memory limit",
            ]
            lines.append("warning: memory still at 3.8 GiB of 4.0 GiB after build; tmpfs not cleaned up")
        if rng.random() < 0.05:
            lines.append(f"Connecting to {project.secrets['DATABASE_URL']} for migrations check… ok")
        return lines
    if name == "test":
        lines = [f"$ {stack.test}".replace("{slug}", slug)]
        if kind == "timeout":
            lines.append(
                "warning: redis at redis.internal:6379 not reachable; tests fall back to retry loops"
            )
        if failing and kind == "test_assertion":
            extra = []
            if rng.random() < 0.3:
                password = project.secrets["DATABASE_URL"].split(":")[2].split("@")[0]
                extra = [f"DEBUG db config: password={password} host=db.internal"]
            return lines + extra + fmt(stack.test_assertion)
        if failing and kind == "timeout":
            return (
                lines
                + fmt(stack.test_ok[:1])
                + [
                    "waiting for lock on redis key 'webhook-retry' (attempt 12)…",
                    "waiting for lock on redis key 'webhook-retry' (attempt 13)…",
                    "Error: Action exceeded timeout of 20m; the process was terminated (exit code 124)",
                ]
            )
        if failing and kind == "out_of_memory":
            return (
                lines
                + fmt(stack.test_ok[:1])
                + [
                    "[runner] memory usage 3.97 GiB / 4.00 GiB",
                    "Killed",
                    "Error: process exited with code 137 (SIGKILL: the container ran out of memory)",
                ]
            )
        if outcome in ("cancelled", "running"):
            return lines + fmt(stack.test_ok[:1])
        return lines + fmt(stack.test_ok)
    if name == "publish":
        return ["$ knecht artifacts upload dist/", f"Uploaded 3 artifacts to acme-{slug}-artifacts"]
    if name == "deploy":
        lines = [f"$ {stack.deploy}".replace("{slug}", slug).replace("{sha7}", sha7)]
        if rng.random() < 0.25:
            lines.append(f"Authenticating with token {project.secrets['DEPLOY_TOKEN']}")
        return [*lines, f"Deployed {slug} {sha7} successfully"]
    return ["$ knecht report --format junit results/*.xml", "Report uploaded: 1 file"]


async def _grow_log(
    db: Database, run_id: int, megabytes: int, progress: Callable[[str], None] | None, begins: datetime
) -> tuple[int, int, int]:
    """Put megabytes of verbose test output (stamped from `begins` on) before the failure in one
    action's log."""
    action = await db.fetch_one(
        "SELECT id FROM actions WHERE run_id = ? AND status = 'failed' ORDER BY position LIMIT 1", (run_id,)
    )
    assert action is not None
    action_id = action["id"]
    tail = await db.fetch_all(
        "SELECT text FROM log_lines WHERE run_id = ? AND action_id = ? ORDER BY line_no", (run_id, action_id)
    )
    rng = random.Random(megabytes)
    budget = megabytes * 1_000_000
    written = 0
    line_no = 0
    modules = ("api", "payments", "refunds", "webhooks", "ledger", "currency", "customers", "reports")
    start = begins
    async with db.transaction() as tx:
        await tx.execute("DELETE FROM log_lines WHERE run_id = ? AND action_id = ?", (run_id, action_id))
    while written < budget:
        batch = []
        for _ in range(BATCH_ROWS * 4):
            line_no += 1
            moment = start + timedelta(milliseconds=line_no * 7)
            module = modules[line_no % len(modules)]
            if line_no % 250_000 == 0:
                text = f"{_iso(moment)} WARNING slow test: tests/test_{module}.py::test_case_{line_no} took 4.2s"
            else:
                text = (
                    f"{_iso(moment)} tests/test_{module}.py::test_{module}_case_{line_no:07d}"
                    f"[param-{rng.randrange(10_000):04d}] PASSED  [{min(99, written * 100 // budget):>3}%]"
                )
            batch.append((run_id, action_id, line_no, text))
            written += len(text) + 1
            if written >= budget:
                break
        async with db.transaction() as tx:
            await tx.execute_many(
                "INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)", batch
            )
        if progress and line_no % (BATCH_ROWS * 40) == 0:
            progress(f"large log: {written // 1_000_000} of {megabytes} MB")
    rows = [(run_id, action_id, line_no + i, row["text"]) for i, row in enumerate(tail, start=1)]
    async with db.transaction() as tx:
        await tx.execute_many("INSERT INTO log_lines (run_id, action_id, line_no, text) VALUES (?, ?, ?, ?)", rows)
    return run_id, action_id, line_no + len(rows)
