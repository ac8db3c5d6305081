"""The failure diagnosis as stored state: claims that make each diagnosis happen once (on SQLite and
PostgreSQL, across replicas), the background worker, and `get_run` showing the result."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from mcp_knecht.ai import diagnoses
from mcp_knecht.ai.diagnosis import WORKER_ACTOR
from mcp_knecht.ai.models import ModelResolver
from mcp_knecht.ai.runtime import AiRuntime
from mcp_knecht.ai.settings import AiSettings, ModelSpec
from mcp_knecht.ai.testing import scripted_diagnoser
from mcp_knecht.app import App, open_app
from mcp_knecht.core.clock import timestamp
from mcp_knecht.core.settings import load_settings
from mcp_knecht.knecht import open_store
from mcp_knecht.knecht.demo import fill_demo_data
from mcp_knecht.store.audit_log import recent_entries
from mcp_knecht.transports.mcp_server import server_for_app

pytestmark = pytest.mark.anyio

SETTINGS = AiSettings(default=ModelSpec("anthropic", "claude-haiku-4-5", "test"))
OLD = "2025-01-01T00:00:00Z"


def _at(moment: datetime) -> str:
    return timestamp(moment)


def scripted_runtime(app: App, **worker_options: object) -> AiRuntime:
    """The app's AI runtime with a scripted model in place of a provider."""
    models = ModelResolver(SETTINGS, fixed=scripted_diagnoser())
    return AiRuntime(SETTINGS, gate=app.gate, db=app.db, scrub=app.secrets, models=models,
                     worker_options={"interval": 0.05, **worker_options})


@pytest.fixture
async def store_env(env: dict[str, str], database_url: str) -> dict[str, str]:
    """A demo store (80 runs) on SQLite or PostgreSQL in which only three failures are recent."""
    db = await open_store(database_url)
    try:
        await fill_demo_data(db, runs=80)
        failed = [r["id"] for r in await db.fetch_all("SELECT id FROM runs WHERE status = 'failed' ORDER BY id")]
        async with db.transaction() as tx:
            await tx.execute("UPDATE runs SET finished_at = ? WHERE status = 'failed'", (OLD,))
            recent = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            for run_id in failed[-3:]:
                await tx.execute("UPDATE runs SET finished_at = ? WHERE id = ?", (recent, run_id))
    finally:
        await db.close()
    return {**env, "KNECHT_DATABASE_URL": database_url}


@asynccontextmanager
async def replica(store_env: dict[str, str]) -> AsyncIterator[App]:
    async with open_app(load_settings(env=store_env), watch_policy=False) as app:
        yield app


async def _recent_failures(app: App) -> list[int]:
    rows = await app.db.fetch_all("SELECT id FROM runs WHERE status = 'failed' AND finished_at > ? ORDER BY id",
                                  (OLD,))
    return [row["id"] for row in rows]


async def test_of_racing_replicas_exactly_one_claims_each_run(store_env: dict[str, str]) -> None:
    runs = range(1, 41)
    wins: dict[str, list[int]] = {"a": [], "b": []}
    async with replica(store_env) as a, replica(store_env) as b:
        now = datetime.now(UTC)

        async def race(name: str, app: App, run_id: int) -> None:
            if await diagnoses.claim(app.db, run_id, name, now=_at(now), lease_until=_at(now + timedelta(minutes=5))):
                wins[name].append(run_id)

        async with anyio.create_task_group() as tasks:
            for run_id in runs:
                tasks.start_soon(race, "a", a, run_id)
                tasks.start_soon(race, "b", b, run_id)
        assert sorted(wins["a"] + wins["b"]) == list(runs)
        run_id = (wins["a"] or wins["b"])[0]
        owner, other = ("a", "b") if run_id in wins["a"] else ("b", "a")
        assert not await diagnoses.finish(a.db, run_id, other, status="done", summary="x", now=_at(now))
        assert await diagnoses.finish(a.db, run_id, owner, status="done", summary="Cause.", action_ids=[3],
                                      model="m", now=_at(now))
        stored = await diagnoses.get_diagnosis(b.db, run_id)
        assert stored is not None and stored.shown()["summary"] == "Cause."
        assert not await diagnoses.claim(b.db, run_id, "c", now=_at(now), lease_until=_at(now)), "done stays done"


async def test_a_lapsed_claim_is_taken_over_until_it_is_given_up(store_env: dict[str, str]) -> None:
    async with replica(store_env) as app:
        now = datetime.now(UTC)
        past, future = _at(now - timedelta(seconds=1)), _at(now + timedelta(minutes=5))
        assert await diagnoses.claim(app.db, 7, "crashed", now=_at(now), lease_until=past)
        for attempt in range(2, diagnoses.MAX_ATTEMPTS + 1):
            assert await diagnoses.claim(app.db, 7, f"worker-{attempt}", now=_at(now), lease_until=past)
            assert (await diagnoses.get_diagnosis(app.db, 7)).attempts == attempt
        assert not await diagnoses.claim(app.db, 7, "late", now=_at(now), lease_until=future)
        assert await diagnoses.give_up_stale(app.db, now=_at(now)) == 1
        stored = await diagnoses.get_diagnosis(app.db, 7)
        assert stored.status == "failed" and "never finished" in stored.error
        assert await diagnoses.claim(app.db, 7, "asked", now=_at(now), lease_until=future, retake=("failed",))


async def test_unavailable_is_recorded_and_retaken_once_a_model_is_configured(store_env: dict[str, str]) -> None:
    async with replica(store_env) as app:
        [*_, run_id] = await _recent_failures(app)
        shown = await app.ai.diagnoses.request(run_id, WORKER_ACTOR)
        assert shown["status"] == "unavailable"
        runtime = scripted_runtime(app)
        assert await diagnoses.candidates(app.db, now=_at(datetime.now(UTC)), finished_since=None, limit=50)
        done = await runtime.diagnoses.request(run_id, WORKER_ACTOR)
        assert done["status"] == "done" and done["model"] == "test:scripted-diagnoser"


async def _until(check: Callable[[], object], timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not await check():  # type: ignore[misc]
            await anyio.sleep(0.05)


async def test_the_worker_diagnoses_each_recent_failure_once_across_two_replicas(store_env: dict[str, str]) -> None:
    async with replica(store_env) as a, replica(store_env) as b:
        recent = await _recent_failures(a)
        assert len(recent) == 3
        workers = [scripted_runtime(a, concurrency=2), scripted_runtime(b, concurrency=2)]
        async with anyio.create_task_group() as tasks:
            for runtime in workers:
                tasks.start_soon(runtime.run)

            async def all_done() -> bool:
                stored = [await diagnoses.get_diagnosis(a.db, run_id) for run_id in recent]
                return all(s is not None and s.status == "done" for s in stored)

            await _until(all_done)
            tasks.cancel_scope.cancel()
        assert sum(runtime.worker.done for runtime in workers) == 3
        for run_id in recent:
            stored = await diagnoses.get_diagnosis(a.db, run_id)
            failed = await a.db.fetch_one("SELECT id FROM actions WHERE run_id = ? AND status = 'failed'", (run_id,))
            assert stored.action_ids == [failed["id"]] and stored.summary
        rows = await a.db.fetch_all("SELECT run_id FROM run_diagnoses")
        assert sorted(r["run_id"] for r in rows) == recent, "older failures are left for on-demand requests"
        await a.audit.flush()
        await b.audit.flush()
        gets = await recent_entries(a.db, source="feature:failure-diagnosis", tool="get_run", limit=100)
        assert len(gets) == 3 and {g["subject"] for g in gets} == {"knecht-diagnosis"}


async def test_the_worker_takes_over_the_claim_of_a_worker_that_stopped(store_env: dict[str, str]) -> None:
    async with replica(store_env) as app:
        *_, run_id = await _recent_failures(app)
        now = datetime.now(UTC)
        await diagnoses.claim(app.db, run_id, "stopped", now=_at(now - timedelta(hours=1)),
                              lease_until=_at(now - timedelta(minutes=1)))
        runtime = scripted_runtime(app)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(runtime.run)

            async def done() -> bool:
                stored = await diagnoses.get_diagnosis(app.db, run_id)
                return stored is not None and stored.status == "done"

            await _until(done)
            tasks.cancel_scope.cancel()
        assert (await diagnoses.get_diagnosis(app.db, run_id)).attempts == 2


async def test_a_worker_stopped_mid_diagnosis_hands_the_claim_back(store_env: dict[str, str]) -> None:
    async with replica(store_env) as app:
        *_, run_id = await _recent_failures(app)
        owner = "shutting-down"
        runtime = scripted_runtime(app)
        assert await runtime.diagnoses.claim(run_id, owner)
        with anyio.move_on_after(0):  # cancelled at its first wait
            await runtime.diagnoses.run_claimed(run_id, WORKER_ACTOR, owner)
        stored = await diagnoses.get_diagnosis(app.db, run_id)
        assert stored.status == "pending" and stored.attempts == 0
        assert await diagnoses.candidates(app.db, now=_at(datetime.now(UTC)), finished_since=None, limit=50)


async def test_get_run_includes_the_stored_diagnosis(app: App) -> None:
    from mcp import Client

    from mcp_knecht.core.actor import Actor

    failed = [r["id"] for r in await app.db.fetch_all("SELECT id FROM runs WHERE status = 'failed' LIMIT 2")]
    done = await scripted_runtime(app).diagnoses.request(failed[0], WORKER_ACTOR)
    actor = Actor("alice", "pytest", frozenset({"runs:read"}))
    async with Client(server_for_app(app, lambda ctx: actor)) as client:
        with_one = (await client.call_tool("get_run", {"run_id": failed[0]})).structured_content
        without = (await client.call_tool("get_run", {"run_id": failed[1]})).structured_content
    assert with_one["diagnosis"] == {**done, "at": with_one["diagnosis"]["at"]}
    assert set(with_one["diagnosis"]) == {"status", "summary", "actionIds", "model", "at"}
    assert "diagnosis" not in without


@pytest.mark.parametrize("stored", ["'garbage'", "'[1, \"two\"]'", "'{}'"])
async def test_a_diagnosis_whose_cited_actions_were_rewritten_cites_none_and_get_run_answers(
    app: App, stored: str
) -> None:
    from mcp import Client

    from mcp_knecht.core.actor import Actor

    failed = (await app.db.fetch_one("SELECT id FROM runs WHERE status = 'failed' LIMIT 1"))["id"]  # type: ignore[index]
    await scripted_runtime(app).diagnoses.request(failed, WORKER_ACTOR)
    async with app.db.transaction() as tx:  # written around the store
        await tx.execute(f"UPDATE run_diagnoses SET action_ids = {stored} WHERE run_id = ?", (failed,))
    actor = Actor("alice", "pytest", frozenset({"runs:read"}))
    async with Client(server_for_app(app, lambda ctx: actor)) as client:
        read = await client.call_tool("get_run", {"run_id": failed})
    assert not read.is_error, read.content
    assert read.structured_content["diagnosis"]["actionIds"] == []  # type: ignore[index]


async def test_only_failed_runs_are_diagnosed(app: App) -> None:
    from mcp_knecht.errors import ConflictError, NotFoundError

    ok = await app.db.fetch_one("SELECT id FROM runs WHERE status = 'succeeded' LIMIT 1")
    with pytest.raises(ConflictError, match="not failed"):
        await app.ai.diagnoses.request(ok["id"], WORKER_ACTOR)
    with pytest.raises(NotFoundError):
        await app.ai.diagnoses.request(999_999, WORKER_ACTOR)


async def test_with_auto_diagnose_off_the_worker_does_not_run(store_env: dict[str, str]) -> None:
    import msgspec.structs

    async with replica(store_env) as app:
        runtime = scripted_runtime(app)
        runtime.settings = msgspec.structs.replace(SETTINGS, auto_diagnose=False)
        with anyio.move_on_after(0.5):
            await runtime.run()
        assert await app.db.fetch_all("SELECT run_id FROM run_diagnoses") == []
        assert runtime.worker.done == 0
