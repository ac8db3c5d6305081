"""Deterministic, realistic demo data for Knecht: projects, workflows, runs, actions and logs.

Everything derives from one `random.Random(seed)` and the clock: the runs fill the 60 days before
now (`now`, default the current time), so a seed and a clock reading always yield the same rows
(tests compare digests), and the newest demo runs are minutes old when a newcomer starts. Rows are
buffered and written in batches with `execute_many`, one transaction per flush, so that a million
runs stream through in bounded memory.

The package, one concept per module: `common` (run window, failure kinds, users, small helpers),
`stacks` (commands and log texts per language), `catalogue` (projects, workflows, branches,
variables), `runs` (the run generator), `logs` (action logs, the large log) and `writer`
(batched inserts). This module is the public API.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta

import msgspec

from mcp_knecht.core import clock
from mcp_knecht.core.database import Database
from mcp_knecht.errors import ConflictError
from mcp_knecht.knecht.demo.catalogue import PROJECTS, WORKFLOW_ACTIONS, WORKFLOW_INPUTS, _insert_catalogue
from mcp_knecht.knecht.demo.common import FAILING_ACTION, FAILURE_KINDS, SPAN, USERS, window_start
from mcp_knecht.knecht.demo.logs import _grow_log
from mcp_knecht.knecht.demo.runs import _RunGenerator
from mcp_knecht.knecht.demo.writer import _Writer

__all__ = [
    "FAILING_ACTION",
    "FAILURE_KINDS",
    "PROJECTS",
    "SPAN",
    "USERS",
    "WORKFLOW_ACTIONS",
    "WORKFLOW_INPUTS",
    "DemoSummary",
    "fill_demo_data",
    "window_start",
]


class DemoSummary(msgspec.Struct, frozen=True):
    projects: int
    workflows: int
    workflow_versions: int
    runs: int
    failed_runs: int
    actions: int
    log_lines: int
    failure_kinds: tuple[str, ...]
    example_failed_runs: dict[str, int] = msgspec.field(default_factory=dict)
    """The first failed run id of each failure kind: handy starting points for a demo."""
    big_log: tuple[int, int, int] | None = None
    """(run id, action id, lines) of the very large action log made by `log_mb`, if any."""

    def describe(self) -> str:
        examples = ", ".join(f"{kind} → run {run}" for kind, run in self.example_failed_runs.items())
        return (
            f"{self.projects} projects, {self.workflows} workflows ({self.workflow_versions} versions), "
            f"{self.runs} runs ({self.failed_runs} failed), {self.actions} actions, "
            f"{self.log_lines} log lines\n"
            f"failure kinds: {examples or 'none'}"
            + (
                f"\nlarge log: run {self.big_log[0]}, action {self.big_log[1]} ({self.big_log[2]} lines)"
                if self.big_log
                else ""
            )
        )


async def fill_demo_data(
    db: Database,
    *,
    seed: int = 7,
    runs: int = 600,
    progress: Callable[[str], None] | None = None,
    log_mb: int = 0,
    run_logs: bool = True,
    now: datetime | None = None,
) -> DemoSummary:
    """Fill an empty database with demo data; refuses one that already holds projects.

    `log_mb` > 0 makes the failed test action of the first assertion failure a very large log
    (about that many megabytes of verbose test output, the failure at its end), for benchmarks.
    `run_logs=False` skips every other log line: a million runs for a list benchmark, quickly.
    `now`: the clock the data is dated against (default: the current time); finished runs end
    before it, the queued ones were queued in the minutes before it.
    """
    if runs < 0 or log_mb < 0:
        raise ValueError("runs and log_mb must be >= 0")
    rng = random.Random(seed)
    now = now or clock.now()
    start = window_start(now)
    async with db.transaction() as tx:
        existing = await tx.fetch_one("SELECT COUNT(*) AS n FROM projects")
        if existing and existing["n"]:
            raise ConflictError(
                f"The database {db.url} already holds {existing['n']} projects; demo data goes into an "
                "empty database only. Pass a fresh --db URL (e.g. sqlite:///./knecht-demo.db)."
            )
        projects, version_count = await _insert_catalogue(tx, rng, start)
    writer = _Writer(db, progress, runs)
    generator = _RunGenerator(rng, projects, runs, writer, start=start, now=now, with_logs=run_logs)
    await generator.generate()
    await writer.flush()
    big_log = None
    if log_mb and "test_assertion" in generator.examples:
        big_log = await _grow_log(db, generator.examples["test_assertion"], log_mb, progress,
                                  begins=start + timedelta(days=1))
    # Fresh statistics let the planner pick the selective index for combined filters (a trigger and
    # a branch that match nothing together: 72 ms → 0.1 ms over a million runs).
    async with db.transaction() as tx:
        await tx.execute("ANALYZE")
    workflows = sum(len(p.workflows) for p in projects)
    return DemoSummary(
        projects=len(projects),
        workflows=workflows,
        workflow_versions=version_count,
        runs=runs,
        failed_runs=generator.failed,
        actions=generator.action_id,
        log_lines=generator.log_lines,
        failure_kinds=tuple(k for k in FAILURE_KINDS if k in generator.examples),
        example_failed_runs=dict(generator.examples),
        big_log=big_log,
    )
