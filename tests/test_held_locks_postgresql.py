"""A PostgreSQL lock held by another session does not stop the server for ever: a statement waits
at most the `lock_timeout` every session of ours sets, then fails with "store busy, retry" and
changes nothing; and a session left idle inside its transaction (its process stopped) is ended by
the server, so the locks it held come free without anyone killing it (`store/postgresql.py`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg
import pytest

from mcp_knecht.app import App, open_app
from mcp_knecht.core.actor import Actor
from mcp_knecht.core.database import Transaction
from mcp_knecht.core.settings import load_settings
from mcp_knecht.errors import StoreBusyError, StoreError, StoreInterruptedError
from mcp_knecht.store import open_database
from mcp_knecht.store.postgresql import lock_key, split_url
from tests.staging import AGENT, writes_go_on_with_everything_on_record
from tests.toolsets import EFFECTS_TABLE

pytestmark = pytest.mark.anyio


@pytest.fixture
def database_url(pg_url: str) -> str:
    """This file is about PostgreSQL's lock waits; a short lock_timeout, as a URL may set it."""
    return f"{pg_url}&lock_timeout=300ms"


@asynccontextmanager
async def lock_held_elsewhere(url: str, name: str) -> AsyncIterator[None]:
    """Another session (as another replica or a stopped approver would) holds our advisory lock `name`."""
    holder = await asyncpg.connect(split_url(url)[0])
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT pg_advisory_xact_lock($1)", lock_key(name))
        yield
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()


async def test_every_session_bounds_its_lock_waits_and_idle_transactions(pg_url: str) -> None:
    db = await open_database(pg_url)
    try:
        async with db.transaction() as tx:  # the pool's sessions, as the store opens them
            lock_timeout = (await tx.fetch_one("SHOW lock_timeout") or {})["lock_timeout"]
            idle = (await tx.fetch_one("SHOW idle_in_transaction_session_timeout") or {})
        assert lock_timeout == "15s"
        assert idle["idle_in_transaction_session_timeout"] == "1min"
    finally:
        await db.close()


async def test_past_the_lock_timeout_a_write_says_store_busy_and_the_server_goes_on(staged_app: App) -> None:
    alice = Actor("alice", "pytest", frozenset(AGENT))
    url = staged_app.settings.database_url
    async with lock_held_elsewhere(url, "audit_log"):  # every audit row extends the chain under it
        started = time.perf_counter()
        busy = await staged_app.gate.call_tool(alice, "record_effect", {"label": "too-soon"})
        waited = time.perf_counter() - started
        read = await staged_app.gate.call_tool(alice, "list_projects", {})
        assert not read.is_error  # reads do not wait for the lock
    assert busy.is_error and busy.error_code == "store_busy" and "retry" in busy.text
    assert 0.25 <= waited < 5  # it waited the lock_timeout, not for ever
    assert await staged_app.db.fetch_all("SELECT id FROM proposals") == []  # the busy write changed nothing
    await writes_go_on_with_everything_on_record(staged_app)


async def test_a_session_idle_in_its_transaction_is_ended_and_its_locks_come_free(pg_url: str) -> None:
    """A process stopped inside a write transaction sends nothing: the server ends its session after
    `idle_in_transaction_session_timeout` (1 s here, set in the URL as an operator may), the others
    get the lock, and the stopped writer, once it goes on, is told its transaction was rolled back."""
    stalled = await open_database(f"{pg_url}&idle_in_transaction_session_timeout=1s")
    other = await open_database(pg_url)
    try:
        async with other.transaction() as tx:
            await tx.execute("CREATE TABLE ledger (entry TEXT)")
        with pytest.raises(StoreInterruptedError, match="rolled back and nothing of it was written"):
            async with stalled.transaction() as tx:
                await tx.lock("ledger")
                await tx.execute("INSERT INTO ledger VALUES ('stalled')")
                async with anyio.create_task_group() as others:
                    async def write_meanwhile() -> None:
                        started = time.monotonic()
                        async with other.transaction() as tx2:
                            await tx2.lock("ledger")
                            await tx2.execute("INSERT INTO ledger VALUES ('other')")
                        assert 0.5 < time.monotonic() - started < 10

                    others.start_soon(write_meanwhile)
                    await anyio.sleep(2.5)  # stopped: nothing sent
                await tx.execute("INSERT INTO ledger VALUES ('stalled again')")
        assert [r["entry"] for r in await other.fetch_all("SELECT entry FROM ledger")] == ["other"]
        async with stalled.transaction() as tx:  # the pool replaced the ended session
            await tx.execute("INSERT INTO ledger VALUES ('later')")
        assert sorted(r["entry"] for r in await other.fetch_all("SELECT entry FROM ledger")) == ["later", "other"]
    finally:
        await stalled.close()
        await other.close()


async def _write_twice(tx: Transaction, failed: list[StoreError]) -> None:
    await tx.execute("INSERT INTO ledger VALUES ('stalled')")
    # Its answer and the server's goodbye were read at once: the answer woke it here, the goodbye left the
    # driver in an error state, and the connection is not closed yet.
    try:
        await tx.execute("INSERT INTO ledger VALUES ('stalled again')")
    except StoreError as exc:
        failed.append(exc)


async def test_a_writer_whose_whole_process_stood_still_is_told_its_transaction_was_rolled_back(pg_url: str) -> None:
    """Stopped for real (SIGSTOP, a debugger): its event loop does not run either, so when it goes on, the
    driver has not yet seen the server end the session, and its next statement meets a connection in an
    error state (asyncpg's `InternalClientError`) or a closed one. Either way: a `StoreError` saying what
    happened, and the store's next transaction works."""
    stalled = await open_database(f"{pg_url}&idle_in_transaction_session_timeout=300ms")
    try:
        async with stalled.transaction() as tx:
            await tx.execute("CREATE TABLE ledger (entry TEXT)")
        for _ in range(3):
            with pytest.raises(StoreInterruptedError, match="rolled back and nothing of it was written"):
                async with stalled.transaction() as tx:
                    await tx.lock("ledger")
                    failed: list[StoreError] = []
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(_write_twice, tx, failed)
                        await anyio.sleep(0)  # the first is sent; its answer comes while the process stands still
                        time.sleep(0.8)  # the whole process stands still, its event loop too
                    if failed:
                        raise failed[0]
            async with stalled.transaction() as tx:
                await tx.lock("ledger")
                await tx.execute("INSERT INTO ledger VALUES ('later')")
        assert [r["entry"] for r in await stalled.fetch_all("SELECT entry FROM ledger")] == ["later"] * 3
    finally:
        await stalled.close()


async def test_an_approved_call_whose_effect_is_rolled_back_under_it_fails_and_says_so(
    staged_env: dict[str, str],
) -> None:
    """The approver stands still inside its effect's transaction past the idle timeout (1 s here): the server
    ends that session and rolls the effect back. The proposal fails, saying what happened (not "internal
    error") and that it must be proposed again; nothing of the effect was written."""
    from mcp_knecht.core.approval import Operator

    url = f"{staged_env['KNECHT_DATABASE_URL']}&idle_in_transaction_session_timeout=1s"
    async with open_app(load_settings(env={**staged_env, "KNECHT_DATABASE_URL": url})) as app:
        async with app.db.transaction() as tx:
            await tx.execute(EFFECTS_TABLE)
        alice = Actor("alice", "pytest", frozenset(AGENT))
        staged = await app.gate.call_tool(alice, "stalled_effect", {"label": "undone", "seconds": 2.5})
        assert staged.outcome == "staged", staged.text
        decided = await app.approvals.approve(staged.data["id"], Operator("bob"))  # type: ignore[index]
        assert decided.status == "failed"
        assert decided.error is not None
        assert decided.error.startswith("The connection to PostgreSQL closed or broke inside a write transaction, "
                                        "so the transaction was rolled back and nothing of it was written.")
        assert decided.error.endswith("This approved call failed with it: to run it, propose it again.")
        assert await app.db.fetch_all("SELECT phase FROM test_effects WHERE label = 'undone'") == []


async def test_an_approval_that_meets_a_held_lock_says_store_busy_and_claims_nothing(staged_app: App) -> None:
    """An approval whose claim meets the held chain lock: `StoreBusyError`, nothing claimed, the
    proposal still pending; once the lock is free the same approval runs it once."""
    from mcp_knecht.core.approval import Operator

    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await staged_app.gate.call_tool(alice, "record_effect", {"label": "held"})
    proposal_id = staged.data["id"]  # type: ignore[index]
    async with lock_held_elsewhere(staged_app.settings.database_url, "audit_log"):
        with pytest.raises(StoreBusyError, match="retry in a moment"):
            await staged_app.approvals.approve(proposal_id, Operator("bob"))
    assert (await staged_app.approvals.checked(proposal_id)).status == "pending"
    decided = await staged_app.approvals.approve(proposal_id, Operator("bob"))
    assert decided.status == "succeeded"
    assert len(await staged_app.db.fetch_all("SELECT * FROM test_effects WHERE label = 'held'")) == 1


async def test_a_slow_reader_of_a_stream_is_not_ended_as_idle(pg_url: str) -> None:
    """`audit verify` into a paused pager: a read-only stream holds no lock a writer waits for."""
    db = await open_database(f"{pg_url}&idle_in_transaction_session_timeout=500ms")
    try:
        read = []
        async for row in db.stream("SELECT n FROM generate_series(1, 3) AS n", batch=1):
            read.append(row["n"])
            await anyio.sleep(0.8)
        assert read == [1, 2, 3]
    finally:
        await db.close()


FAIL_FINISHES = """
CREATE SEQUENCE finish_tries;
CREATE FUNCTION fail_finishes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('finish_tries') <= {failing} THEN
    RAISE EXCEPTION 'this finish is undone';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER fail_finishes BEFORE UPDATE ON proposals FOR EACH ROW
  WHEN (NEW.status IN ('succeeded', 'failed')) EXECUTE FUNCTION fail_finishes();
"""
"""The first `failing` finishes of an execution are undone by the database itself (a sequence is not
rolled back with them), as when the server ends the finish's session or restarts under it."""


async def _fail_finishes(app: App, failing: int) -> None:
    async with app.db.transaction() as tx:
        await tx.execute(FAIL_FINISHES.format(failing=failing))  # no parameters: one message, several statements


async def test_an_outcome_whose_recording_is_undone_is_recorded_on_the_next_try(
    staged_app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcp_knecht.core import approval
    from mcp_knecht.core.approval import Operator

    monkeypatch.setattr(approval, "FINISH_PAUSE", 0.05)
    await _fail_finishes(staged_app, failing=1)
    staged = await staged_app.gate.call_tool(Actor("alice", "pytest", frozenset(AGENT)), "record_effect",
                                             {"label": "undone-once"})
    decided = await staged_app.approvals.approve(staged.data["id"], Operator("bob"))  # type: ignore[index]
    assert decided.status == "succeeded"
    assert len(await staged_app.db.fetch_all("SELECT * FROM test_effects WHERE label = 'undone-once'")) == 1
    outcomes = [r["outcome"] for r in await staged_app.db.fetch_all(
        "SELECT outcome FROM audit_log WHERE proposal_id = ? ORDER BY id", (decided.id,))]
    assert outcomes == ["staged", "approved", "executed"]


async def test_an_outcome_the_store_keeps_undoing_is_told_with_how_to_settle_it(
    staged_app: App, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcp_knecht.core import approval
    from mcp_knecht.core.approval import Operator

    monkeypatch.setattr(approval, "FINISH_PAUSE", 0.05)
    monkeypatch.setattr(approval, "FINISH_ATTEMPTS", 2)
    await _fail_finishes(staged_app, failing=1000)
    staged = await staged_app.gate.call_tool(Actor("alice", "pytest", frozenset(AGENT)), "record_effect",
                                             {"label": "undone-always"})
    proposal_id = staged.data["id"]  # type: ignore[index]
    with pytest.raises(StoreError) as raised:
        await staged_app.approvals.approve(proposal_id, Operator("bob"))
    assert not isinstance(raised.value, StoreBusyError)
    assert raised.value.message.startswith(
        f"Proposal #{proposal_id} was executed (succeeded), but its outcome could not be recorded: the store "
        "failed 2 tries (the last: Database statement failed: this finish is undone)")
    assert f"knecht-approve settle {proposal_id} --outcome succeeded" in raised.value.message
    assert (await staged_app.approvals.checked(proposal_id)).status == "executing"
    assert len(await staged_app.db.fetch_all("SELECT * FROM test_effects WHERE label = 'undone-always'")) == 1
