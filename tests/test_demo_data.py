"""Demo data: deterministic per seed, consistent, and rich enough to diagnose every failure kind."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mcp_knecht import testing
from mcp_knecht.app import App
from mcp_knecht.core import clock
from mcp_knecht.core.database import Database
from mcp_knecht.errors import ConflictError
from mcp_knecht.knecht import open_store
from mcp_knecht.knecht.demo import FAILING_ACTION, FAILURE_KINDS, DemoSummary, fill_demo_data

pytestmark = pytest.mark.anyio

TABLES = {
    "projects": "id",
    "branches": "project_id, name",
    "workflows": "id",
    "workflow_versions": "workflow_id, version",
    "runs": "id",
    "actions": "id",
    "log_lines": "run_id, action_id, line_no",
    "project_variables": "project_id, name",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _open(path: Path) -> Database:
    return await open_store(f"sqlite:///{path}")


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[tuple[Database, DemoSummary]]:
    db = await _open(tmp_path / "demo.db")
    try:
        summary = await fill_demo_data(db)
        yield db, summary
    finally:
        await db.close()


async def _digest(db: Database) -> str:
    sha = hashlib.sha256()
    for table, order in TABLES.items():
        for row in await db.fetch_all(f"SELECT * FROM {table} ORDER BY {order}"):
            sha.update(json.dumps(row, sort_keys=True).encode())
    return sha.hexdigest()


NOW = datetime(2027, 3, 14, 9, 26, 53, tzinfo=UTC)


async def _filled_digest(path: Path, seed: int, now: datetime = NOW) -> str:
    db = await _open(path)
    try:
        await fill_demo_data(db, seed=seed, runs=200, now=now)
        return await _digest(db)
    finally:
        await db.close()


async def test_same_seed_and_clock_give_the_same_rows_and_another_seed_or_day_does_not(tmp_path: Path) -> None:
    first = await _filled_digest(tmp_path / "a.db", seed=7)
    again = await _filled_digest(tmp_path / "b.db", seed=7, now=NOW + timedelta(seconds=5))  # same minute
    other = await _filled_digest(tmp_path / "c.db", seed=8)
    later = await _filled_digest(tmp_path / "d.db", seed=7, now=NOW + timedelta(days=1))
    assert first == again
    assert first != other and first != later


_STAMPS = {
    "runs": ("queued_at", "started_at", "finished_at"),
    "actions": ("started_at", "finished_at"),
    "workflow_versions": ("created_at",),
    "workflows": ("created_at",),
    "projects": ("created_at",),
    "project_variables": ("updated_at",),
}


@pytest.mark.parametrize("now", [None, datetime(2031, 7, 1, tzinfo=UTC)], ids=["the real clock", "in 2031"])
async def test_demo_data_is_dated_in_the_two_months_before_now(tmp_path: Path, now: datetime | None) -> None:
    db = await _open(tmp_path / "demo.db")
    try:
        before = clock.timestamp(now)
        await fill_demo_data(db, runs=300, now=now)
        after = clock.timestamp(now + timedelta(seconds=1) if now else None)
        for table, columns in _STAMPS.items():
            for column in columns:
                row = await db.fetch_one(f"SELECT MAX({column}) AS newest FROM {table}")
                assert row is not None and row["newest"] <= after, (table, column, row)
        runs = await db.fetch_one("SELECT MIN(queued_at) AS oldest, MAX(queued_at) AS newest FROM runs")
        assert runs is not None
        reference = now or datetime.now(UTC)
        assert clock.parse(runs["newest"]) > reference - timedelta(minutes=30)  # something is queued right now
        assert clock.parse(runs["oldest"]) < reference - timedelta(days=55)
        finished = await db.fetch_one("SELECT MAX(finished_at) AS newest FROM runs")
        assert finished is not None and finished["newest"] < before
    finally:
        await db.close()


async def test_a_rerun_made_now_is_newer_than_every_demo_run(app: App) -> None:
    async with testing.connect(app, testing.actor("erin", ["runs:write", "runs:read"])) as client:
        staged = await client.call_tool("rerun_run", {"run_id": 5})
    proposal = await testing.approve(app, staged.structured_content["id"])  # type: ignore[index]
    assert proposal.status == "succeeded" and proposal.result is not None, proposal.error
    newest = await app.db.fetch_one("SELECT id, rerun_of FROM runs ORDER BY queued_at DESC, id DESC LIMIT 1")
    assert newest == {"id": proposal.result["run"]["id"], "rerun_of": 5}


async def test_default_fill_is_fast_and_reports_progress(tmp_path: Path) -> None:
    db = await _open(tmp_path / "fast.db")
    messages: list[str] = []
    try:
        started = time.perf_counter()
        summary = await fill_demo_data(db, progress=messages.append)
        assert time.perf_counter() - started < 5
    finally:
        await db.close()
    assert summary.runs == 600
    assert summary.projects >= 5
    assert messages and messages[-1] == "600/600 runs written"


async def test_summary_matches_the_rows(demo: tuple[Database, DemoSummary]) -> None:
    db, summary = demo

    async def count(sql: str) -> int:
        row = await db.fetch_one(sql)
        assert row is not None
        return int(row["n"])

    assert await count("SELECT COUNT(*) AS n FROM projects") == summary.projects
    assert await count("SELECT COUNT(*) AS n FROM workflows") == summary.workflows
    assert await count("SELECT COUNT(*) AS n FROM runs") == summary.runs
    assert await count("SELECT COUNT(*) AS n FROM runs WHERE status = 'failed'") == summary.failed_runs
    assert await count("SELECT COUNT(*) AS n FROM log_lines") == summary.log_lines
    assert 0.1 < summary.failed_runs / summary.runs < 0.3
    statuses = {r["status"] for r in await db.fetch_all("SELECT DISTINCT status FROM runs")}
    triggers = {r["trigger"] for r in await db.fetch_all("SELECT DISTINCT trigger FROM runs")}
    assert statuses == {"queued", "running", "succeeded", "failed", "cancelled"}
    assert triggers == {"push", "pull_request", "schedule", "manual", "rerun"}


async def test_workflows_have_versions_with_declared_inputs(demo: tuple[Database, DemoSummary]) -> None:
    db, _ = demo
    for workflow in await db.fetch_all("SELECT id, current_version FROM workflows"):
        versions = await db.fetch_all(
            "SELECT version, definition, inputs_json FROM workflow_versions"
            " WHERE workflow_id = ? ORDER BY version",
            (workflow["id"],),
        )
        assert 2 <= len(versions) <= 4
        assert [v["version"] for v in versions] == list(range(1, workflow["current_version"] + 1))
        for version in versions:
            assert "inputs:" in version["definition"]
            inputs = json.loads(version["inputs_json"])
            assert inputs and all({"type", "required", "default"} <= set(spec) for spec in inputs.values())
    shas = await db.fetch_all("SELECT head_sha FROM branches")
    assert all(len(r["head_sha"]) == 40 and int(r["head_sha"], 16) >= 0 for r in shas)


async def test_actions_are_consistent_with_their_run(demo: tuple[Database, DemoSummary]) -> None:
    db, _ = demo
    runs = {r["id"]: r for r in await db.fetch_all("SELECT id, status, rerun_of, workflow_id FROM runs")}
    by_run: dict[int, list[dict[str, object]]] = {}
    for action in await db.fetch_all("SELECT * FROM actions ORDER BY run_id, position"):
        by_run.setdefault(action["run_id"], []).append(action)
    for run_id, run in runs.items():
        states = [a["status"] for a in by_run[run_id]]
        if run["status"] == "succeeded":
            assert set(states) == {"succeeded"}
            assert all(a["exit_code"] == 0 for a in by_run[run_id])
        elif run["status"] == "failed":
            assert states.count("failed") == 1
            cut = states.index("failed")
            assert set(states[:cut]) <= {"succeeded"}
            assert set(states[cut + 1 :]) <= {"skipped"}
            assert by_run[run_id][cut]["exit_code"] not in (None, 0)
        elif run["status"] == "cancelled":
            assert states.count("cancelled") == 1
        elif run["status"] == "queued":
            assert set(states) == {"pending"}
        else:
            assert states.count("running") == 1
        if run["rerun_of"] is not None:
            original = runs[run["rerun_of"]]
            assert run["rerun_of"] < run_id
            assert original["workflow_id"] == run["workflow_id"]
            assert original["status"] == "failed"


async def test_every_failure_kind_is_present_and_telling(demo: tuple[Database, DemoSummary]) -> None:
    db, summary = demo
    assert summary.failure_kinds == FAILURE_KINDS
    markers = {
        "test_assertion": ("assert 200 == 500",),
        "dependency_install": (
            "ResolutionImpossible",
            "ERESOLVE",
            "failed to select a version",
            "unknown revision",
            "Failed to query available provider packages",
        ),
        "timeout": ("Action exceeded timeout of 20m",),
        "out_of_memory": ("Killed",),
        "flaky_network": ("Connection reset by peer",),
        "bad_workflow_syntax": ("yaml: line",),
    }
    for kind, run_id in summary.example_failed_runs.items():
        failed = await db.fetch_one(
            "SELECT id, name, exit_code FROM actions WHERE run_id = ? AND status = 'failed'", (run_id,)
        )
        assert failed is not None
        assert failed["name"] == FAILING_ACTION[kind]
        log = "\n".join(
            r["text"]
            for r in await db.fetch_all(
                "SELECT text FROM log_lines WHERE run_id = ? AND action_id = ? ORDER BY line_no",
                (run_id, failed["id"]),
            )
        )
        assert any(marker in log for marker in markers[kind]), (kind, log)
        if kind == "out_of_memory":
            assert failed["exit_code"] == 137
            # The cause shows one action earlier, in the build log.
            build = await db.fetch_all(
                "SELECT l.text FROM log_lines l JOIN actions a ON a.id = l.action_id"
                " WHERE l.run_id = ? AND a.name = 'build'",
                (run_id,),
            )
            assert any("memory" in r["text"] for r in build)
        run_log = await db.fetch_all(
            "SELECT text FROM log_lines WHERE run_id = ? AND action_id = 0", (run_id,)
        )
        assert any("Run failed" in r["text"] for r in run_log)


async def test_secrets_exist_and_leak_into_some_logs(demo: tuple[Database, DemoSummary]) -> None:
    db, _ = demo
    secrets = await db.fetch_all("SELECT name, value FROM project_variables WHERE secret = 1")
    plain = await db.fetch_all("SELECT name FROM project_variables WHERE secret = 0")
    assert secrets and plain
    texts = [r["text"] for r in await db.fetch_all("SELECT text FROM log_lines")]
    everything = "\n".join(texts)
    leaked = [s for s in secrets if s["value"] in everything]
    assert leaked, "some secret variable values must appear in logs so scrubbing can be tested"
    assert any("AWS_ACCESS_KEY_ID=AKIA" in t for t in texts)
    assert any("ghp_" in t for t in texts)
    assert any("password=" in t for t in texts)
    assert any("postgres://" in t and "@" in t for t in texts)


async def test_a_second_fill_is_refused(demo: tuple[Database, DemoSummary]) -> None:
    db, summary = demo
    with pytest.raises(ConflictError, match="--db"):
        await fill_demo_data(db)
    row = await db.fetch_one("SELECT COUNT(*) AS n FROM runs")
    assert row is not None and row["n"] == summary.runs
