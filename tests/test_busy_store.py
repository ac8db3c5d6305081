"""A SQLite write lock held by another process does not stop the server: reads go on, writes wait
(and after the busy timeout fail with "store busy, retry"), audit rows wait in their buffer and
land once the lock is free — nothing lost, one chain."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
import pytest

from mcp_knecht.app import App
from mcp_knecht.core.actor import Actor
from mcp_knecht.store import sqlite as sqlite_store
from mcp_knecht.store.audit_log import verify_chain
from tests.staging import AGENT, writes_go_on_with_everything_on_record

pytestmark = pytest.mark.anyio


@pytest.fixture
def database_url(tmp_path):  # type: ignore[no-untyped-def]
    """This file is about SQLite's own write lock."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@asynccontextmanager
async def lock_held_elsewhere(path: str, seconds: float) -> AsyncIterator[threading.Event]:
    """Another connection (as another process would) takes the write lock and keeps it. Waited for
    off the event loop: the server's own writes must go on meanwhile."""
    taken = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        connection.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert await anyio.to_thread.run_sync(taken.wait, 10), "the other connection did not get the write lock"
    try:
        yield taken
    finally:
        await anyio.to_thread.run_sync(thread.join, seconds + 5)


def _path(app: App) -> str:
    return app.settings.database_url.removeprefix("sqlite:///")


async def test_a_held_write_lock_delays_writes_but_stops_nothing(staged_app: App) -> None:
    alice = Actor("alice", "pytest", frozenset(AGENT))
    started = time.perf_counter()
    async with lock_held_elsewhere(_path(staged_app), 2.0):
        read = await staged_app.gate.call_tool(alice, "list_projects", {})
        read_at = time.perf_counter() - started
        staged = await staged_app.gate.call_tool(alice, "record_effect", {"label": "after-the-lock"})
        staged_at = time.perf_counter() - started
    assert not read.is_error and read_at < 1.0  # reads do not wait for a writer
    assert not staged.is_error and staged.outcome == "staged" and staged_at >= 1.5  # the write waited
    await staged_app.audit.flush()
    rows = await staged_app.db.fetch_all("SELECT tool, outcome FROM audit_log ORDER BY id")
    # The staged row commits with its proposal; the read's row waited in the buffer and follows.
    assert [(r["tool"], r["outcome"]) for r in rows] == [("record_effect", "staged"), ("list_projects", "ran")]
    assert await verify_chain(staged_app.db, staged_app.audit.chain) == []


async def test_past_the_busy_timeout_a_write_says_store_busy_and_the_server_goes_on(
    staged_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)
    alice = Actor("alice", "pytest", frozenset(AGENT))
    async with lock_held_elsewhere(_path(staged_app), 2.5):
        busy = await staged_app.gate.call_tool(alice, "record_effect", {"label": "too-soon"})
        read = await staged_app.gate.call_tool(alice, "list_projects", {})
        await anyio.sleep(0.8)
        assert staged_app.audit.failures >= 1  # the background writer met the busy store, and waits
        assert not read.is_error
    assert busy.is_error and "busy" in busy.text and "retry" in busy.text
    await writes_go_on_with_everything_on_record(staged_app)


async def test_writers_of_one_file_queue_and_one_that_gives_up_leaves_the_queue_free(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Our writers queue on the file's writer lock (as our other processes would, each with its own
    descriptor). A writer cancelled while queued (its client went away) must not keep the lock once
    its waiting thread gets it, nor leave its connection inside a transaction."""
    from mcp_knecht.store import open_database

    url = f"sqlite:///{tmp_path / 'queue.db'}"
    first, second = await open_database(url), await open_database(url)
    try:
        async with first.transaction() as tx:
            await tx.execute("CREATE TABLE log (who TEXT)")
        release = anyio.Event()

        async def hold() -> None:
            async with first.transaction() as tx:
                await tx.execute("INSERT INTO log VALUES ('first')")
                await release.wait()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(hold)
            await anyio.sleep(0.1)
            with anyio.move_on_after(0.3) as gave_up:
                async with second.transaction() as tx:
                    await tx.execute("INSERT INTO log VALUES ('never')")
            assert gave_up.cancelled_caught
            release.set()
        async with second.transaction() as tx:  # the abandoned wait let go of the lock when it got it
            await tx.execute("INSERT INTO log VALUES ('second')")
        async with first.transaction() as tx:
            await tx.execute("INSERT INTO log VALUES ('first again')")
        rows = await first.fetch_all("SELECT who FROM log ORDER BY rowid")
        assert [r["who"] for r in rows] == ["first", "second", "first again"]
        assert oct((tmp_path / "queue.db-writers").stat().st_mode & 0o777) == "0o600"
    finally:
        await first.close()
        await second.close()


HOLD_WRITERS_QUEUE = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
"""


async def test_a_blocking_store_waits_for_another_process_in_its_own_thread_and_then_says_store_busy(
    tmp_path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """What `knecht-approve` opens: a wait for another process's turn at writing blocks the caller's
    thread (nothing else runs in a CLI meanwhile) and writes once it is free. A process stuck in the
    queue past the busy timeout stops nothing (the queue only orders our writers; SQLite's own lock
    decides), and one holding SQLite's write lock that long gets "store busy", nothing written."""
    import subprocess
    import sys

    from mcp_knecht.errors import StoreBusyError
    from mcp_knecht.store import open_database

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    db = await open_database(url, blocking=True)

    def holder(seconds: float) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-c", HOLD_WRITERS_QUEUE, f"{tmp_path / 'cli.db'}-writers",
                                    str(seconds)], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline().strip() == "holding"
        return process

    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE log (who TEXT)")
        first = holder(0.4)
        started = time.monotonic()
        async with db.transaction(durable=True) as tx:
            await tx.execute("INSERT INTO log VALUES ('after the other')")
        assert time.monotonic() - started >= 0.3  # it waited for the other process
        first.communicate()
        monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)
        stuck = holder(30)
        try:
            async with db.transaction() as tx:
                await tx.execute("INSERT INTO log VALUES ('past a stuck queue')")
        finally:
            stuck.kill()
            stuck.communicate()
        async with lock_held_elsewhere(str(tmp_path / "cli.db"), 1.0):
            with pytest.raises(StoreBusyError, match="retry in a moment"):
                async with db.transaction() as tx:
                    await tx.execute("INSERT INTO log VALUES ('never')")
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO log VALUES ('again')")
        rows = await db.fetch_all("SELECT who FROM log ORDER BY rowid")
        assert [r["who"] for r in rows] == ["after the other", "past a stuck queue", "again"]
        # It waited in the kernel, bounded by an alarm (`kernel_wait`), and left no alarm behind.
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        await db.close()


@asynccontextmanager
async def exclusive_lock_elsewhere(path: str, seconds: float) -> AsyncIterator[None]:
    """Another process's `BEGIN EXCLUSIVE` on a database not yet in WAL mode (as the sqlite3 shell
    leaves one): nobody may even read it meanwhile, which is what a process meets that opens a file
    while another rebuilds its WAL index."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("CREATE TABLE IF NOT EXISTS theirs (x)")
    connection.execute("BEGIN EXCLUSIVE")
    releasing = threading.Timer(seconds, lambda: connection.execute("ROLLBACK"))
    releasing.start()
    try:
        yield
    finally:
        releasing.join()
        connection.close()


async def test_a_store_opened_while_another_process_holds_the_file_waits_for_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two operators starting `knecht-approve` at the same moment, or an open beside the sqlite3 shell:
    opening waits for the other, as a write does, instead of calling the file unusable."""
    from mcp_knecht.store import open_database

    path = tmp_path / "shared.db"
    started = time.monotonic()
    async with exclusive_lock_elsewhere(str(path), 0.6):
        db = await open_database(f"sqlite:///{path}")
    try:
        assert time.monotonic() - started >= 0.5
        assert (await db.fetch_one("PRAGMA journal_mode"))["journal_mode"] == "wal"  # type: ignore[index]
        assert await db.fetch_all("SELECT x FROM theirs") == []
    finally:
        await db.close()


async def test_a_store_held_past_the_busy_timeout_while_opening_says_store_busy(
    tmp_path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from mcp_knecht.errors import StoreBusyError
    from mcp_knecht.store import open_database

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "held.db"
    async with exclusive_lock_elsewhere(str(path), 1.5):
        with pytest.raises(StoreBusyError, match=r"busy: another process has held a lock on it for 0\.2 s") as busy:
            await open_database(f"sqlite:///{path}")
    assert "retry in a moment" in str(busy.value) and "not a usable" not in str(busy.value)
    db = await open_database(f"sqlite:///{path}")  # free again: it opens
    await db.close()


async def test_a_blocking_store_waiting_for_another_process_can_be_cancelled_within_a_slice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An operator's Ctrl-C while `knecht-approve` waits for another process's turn at writing: the
    wait in the kernel comes back to the event loop every `SLICE`, so the cancellation gets through,
    and nothing is left half-done."""
    import subprocess
    import sys

    from mcp_knecht.store import kernel_wait, open_database

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    db = await open_database(url, blocking=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WRITERS_QUEUE, f"{tmp_path / 'cli.db'}-writers", "30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        with anyio.move_on_after(0.3) as cancelled:
            async with db.transaction() as tx:
                await tx.execute("CREATE TABLE never (x)")
        assert cancelled.cancelled_caught
        assert time.monotonic() - started < 0.3 + kernel_wait.SLICE + 0.5  # not the 15 s busy timeout
        holder.kill()
        holder.wait()
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE log (who TEXT)")
        assert [r["name"] for r in await db.fetch_all("SELECT name FROM sqlite_master WHERE type = 'table'")
                if r["name"] in ("never", "log")] == ["log"]
    finally:
        await db.close()
        holder.kill()
        holder.communicate()


@pytest.mark.parametrize("blocking", [False, True], ids=["server", "cli"])
async def test_a_server_store_lets_other_tasks_run_at_every_write_and_a_cli_store_goes_straight_on(
    tmp_path, blocking: bool,  # type: ignore[no-untyped-def]
) -> None:
    """The server's many requests share one event loop: taking the store's write lock is a turn of the
    loop, so a loop of writes never starves the other requests. A CLI deciding one proposal has nothing
    else to run, and goes straight on (each turn of the loop is an epoll call, a tenth of a decision's
    own work)."""
    from mcp_knecht.store import open_database

    db = await open_database(f"sqlite:///{tmp_path / 'fair.db'}", blocking=blocking)
    others_ran: list[bool] = []

    async def another_request() -> None:
        others_ran.append(True)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(another_request)
            async with db.transaction() as tx:
                await tx.execute("CREATE TABLE fair (n INTEGER)")
                ran_before_the_first_statement = bool(others_ran)
    finally:
        await db.close()
    assert ran_before_the_first_statement is not blocking


async def test_an_approved_call_that_meets_a_busy_store_fails_and_says_it_must_be_proposed_again(
    staged_app: App,
) -> None:
    from mcp_knecht.core.approval import Operator

    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await staged_app.gate.call_tool(alice, "busy_effect", {"label": "the row"})
    assert staged.outcome == "staged", staged.text
    decided = await staged_app.approvals.approve(staged.data["id"], Operator("bob"))  # type: ignore[index]
    assert decided.status == "failed"
    assert decided.error is not None and decided.error.startswith("The store is busy: the row could not be recorded.")
    assert decided.error.endswith("This approved call failed with it: to run it, propose it again.")


async def _approve_when_started(app: App, proposal_id: int, hold_seconds: float) -> BaseException | object:
    """Approve `proposal_id` (a `slow_effect`); once its effect has started, another connection takes the write
    lock for `hold_seconds`. The decision, or what it raised."""
    from mcp_knecht.core.approval import Operator

    outcome: list[BaseException | object] = []

    async def approve() -> None:
        try:
            outcome.append(await app.approvals.approve(proposal_id, Operator("bob")))
        except Exception as exc:  # the test looks at what it raised
            outcome.append(exc)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(approve)
        with anyio.fail_after(10):
            while not await app.db.fetch_all("SELECT 1 FROM test_effects WHERE phase = 'started'"):
                await anyio.sleep(0.01)
        async with lock_held_elsewhere(_path(app), hold_seconds):
            pass
    return outcome[0]


async def test_an_execution_that_meets_a_busy_store_records_its_outcome_once_the_lock_is_free(
    staged_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_knecht.core import approval

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)
    # The effect's second write comes 0.6 s after its first (time to take the lock), waits 0.3 s and fails;
    # 20 tries of 0.3 s outlast the 2 s the lock is held.
    monkeypatch.setattr(approval, "FINISH_ATTEMPTS", 20)
    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await staged_app.gate.call_tool(alice, "slow_effect", {"label": "held", "seconds": 0.6})
    decided = await _approve_when_started(staged_app, staged.data["id"], 2.0)  # type: ignore[index]
    # Its second write met the lock and failed; the outcome waited for the lock instead of being lost.
    assert getattr(decided, "status", decided) == "failed"
    assert decided.error.startswith("The store is busy")  # type: ignore[attr-defined]
    await staged_app.audit.flush()
    outcomes = [r["outcome"] for r in await staged_app.db.fetch_all(
        "SELECT outcome FROM audit_log WHERE proposal_id = ? ORDER BY id", (staged.data["id"],))]  # type: ignore[index]
    assert outcomes == ["staged", "approved", "execution_failed"]


async def test_an_outcome_the_busy_store_keeps_out_too_long_is_told_with_how_to_settle_it(
    staged_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_knecht.core import approval
    from mcp_knecht.errors import StoreBusyError

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)
    monkeypatch.setattr(approval, "FINISH_ATTEMPTS", 2)  # 2 tries of 0.3 s, the lock held 2.5 s
    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await staged_app.gate.call_tool(alice, "slow_effect", {"label": "held", "seconds": 0.6})
    proposal_id = staged.data["id"]  # type: ignore[index]
    raised = await _approve_when_started(staged_app, proposal_id, 2.5)
    assert isinstance(raised, StoreBusyError)
    assert raised.message.startswith(f"Proposal #{proposal_id} was executed (failed), but its outcome could not be")
    assert f"knecht-approve settle {proposal_id} --outcome failed --reason TEXT --force" in raised.message
    assert (await staged_app.proposals.get(proposal_id)).status == "executing"  # type: ignore[union-attr]


async def test_the_decision_api_answers_a_busy_store_with_503_store_busy_and_decides_once_it_is_free(
    staged_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx
    from starlette.applications import Starlette

    from mcp_knecht.core.auth import TokenVerifier, load_token_settings, mint_token
    from mcp_knecht.transports.decisions_api import DecisionApi

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)
    tokens = load_token_settings(staged_app.settings, create_dev_secret=False)
    api = Starlette(routes=DecisionApi(staged_app, TokenVerifier(tokens)).routes())
    token = mint_token(tokens, subject="bob", scopes=["proposals:decide", "proposals:read"])
    bob = {"Authorization": f"Bearer {token}"}
    alice = Actor("alice", "pytest", frozenset(AGENT))
    staged = await staged_app.gate.call_tool(alice, "record_effect", {"label": "when-free"})
    approve = f"/api/proposals/{staged.data['id']}/approve"  # type: ignore[index]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client:
        async with lock_held_elsewhere(_path(staged_app), 1.5):
            busy = await client.post(approve, json={}, headers=bob)
        assert busy.status_code == 503  # not an internal error: the operator is told to retry
        assert busy.json()["error"]["code"] == "store_busy" and "retry" in busy.json()["error"]["message"]
        decided = await client.post(approve, json={}, headers=bob)
    assert decided.status_code == 200 and decided.json()["status"] == "succeeded"
    assert await staged_app.db.fetch_all("SELECT label FROM test_effects") == [{"label": "when-free"}]
