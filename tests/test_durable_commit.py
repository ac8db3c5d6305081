"""A durable SQLite commit is on disk before its transaction returns, and the write lock is free while
the disk flushes it (`store.wal_sync`). The disk is the one thing stood in for here: `os.fdatasync`
records which file it flushed, and waits or fails where a test says so."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from mcp_knecht.errors import StoreError
from mcp_knecht.store import open_database, wal_sync
from mcp_knecht.store.sqlite import CHECKPOINT_EVERY
from mcp_knecht.store.wal_sync import WalFlush, release_database_file, share_database_file

pytestmark = pytest.mark.anyio


class _Disk:
    """`os.fdatasync` as the store calls it: each flushed file's path, in order; `hold` keeps the next
    flush of the WAL waiting until `release()`; `fail` makes it fail with EIO."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self._real = real
        self.flushed: list[str] = []
        self.hold = False
        self.fail = False
        self.waiting = threading.Event()
        self._released = threading.Event()

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        if self.hold and path.endswith("-wal"):
            self.hold = False
            self.waiting.set()
            assert self._released.wait(10)
        self._real(fd)
        self.flushed.append(path)

    def release(self) -> None:
        self._released.set()


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Disk]:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name the flushed files")
    recorder = _Disk(os.fdatasync)
    monkeypatch.setattr(wal_sync.os, "fdatasync", recorder)
    yield recorder
    recorder.release()


async def _store(tmp_path: Path, *, blocking: bool = False):  # type: ignore[no-untyped-def]
    db = await open_database(f"sqlite:///{tmp_path / 'durable.db'}", migrate=False, blocking=blocking)
    async with db.transaction() as tx:
        await tx.execute("CREATE TABLE decisions (id INTEGER PRIMARY KEY, what TEXT NOT NULL)")
    return db


@pytest.mark.parametrize("blocking", [False, True], ids=["server", "cli"])
async def test_a_durable_commit_flushes_the_wal_before_it_returns(tmp_path: Path, disk: _Disk, blocking: bool) -> None:
    db = await _store(tmp_path, blocking=blocking)
    try:
        async with db.transaction() as tx:  # not durable: the disk is not waited for
            await tx.execute("INSERT INTO decisions (what) VALUES ('ordinary')")
        assert disk.flushed == []
        async with db.transaction(durable=True) as tx:
            await tx.execute("INSERT INTO decisions (what) VALUES ('claimed')")
        assert disk.flushed == [f"{tmp_path / 'durable.db'}-wal"]
    finally:
        await db.close()


async def test_other_writers_go_on_while_a_durable_commit_waits_for_the_disk(tmp_path: Path, disk: _Disk) -> None:
    db = await _store(tmp_path)
    done: list[str] = []
    try:
        async def claim() -> None:
            async with db.transaction(durable=True) as tx:
                await tx.execute("INSERT INTO decisions (what) VALUES ('claimed')")
            done.append("claim")

        disk.hold = True
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(claim)
            await anyio.to_thread.run_sync(disk.waiting.wait, 10)  # committed, and the disk is flushing it
            with anyio.fail_after(5):  # the write lock is free meanwhile
                async with db.transaction() as tx:
                    await tx.execute("INSERT INTO decisions (what) VALUES ('meanwhile')")
            done.append("meanwhile")
            assert done == ["meanwhile"]  # the claim has not returned: its flush is not confirmed yet
            disk.release()
        assert done == ["meanwhile", "claim"]
    finally:
        await db.close()


async def test_a_flush_the_disk_refuses_fails_the_commit_it_was_for(tmp_path: Path, disk: _Disk) -> None:
    """The rows are written (others may see them) but the caller is told the commit failed: a claim told so
    never executes, so its proposal waits, `executing`, for a person to settle it."""
    db = await _store(tmp_path)
    try:
        disk.fail = True
        with pytest.raises(StoreError, match="the disk did not confirm the write"):
            async with db.transaction(durable=True) as tx:
                await tx.execute("INSERT INTO decisions (what) VALUES ('claimed')")
        disk.fail = False
        async with db.transaction() as tx:  # the store goes on
            await tx.execute("INSERT INTO decisions (what) VALUES ('next')")
    finally:
        await db.close()


def test_a_wal_restarted_between_commit_and_flush_makes_the_database_file_flushed_too(
    tmp_path: Path, disk: _Disk,
) -> None:
    """Once a checkpoint has copied every frame into the database file, the next writer starts the WAL from
    its beginning again, over our frames: they are in the database file then, which is flushed as well."""
    path = str(tmp_path / "restart.db")
    writer = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA user_version = 1")  # the file exists from here on
    database_fd = share_database_file(path)
    assert database_fd is not None
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA synchronous = NORMAL")
        writer.execute("CREATE TABLE t (x INTEGER)")

        def commit_then(meanwhile: Callable[[], None]) -> None:
            flush = WalFlush.open(path, database_fd)
            assert flush is not None
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("INSERT INTO t VALUES (1)")
            flush.note()
            writer.execute("COMMIT")
            meanwhile()
            flush.sync()

        commit_then(lambda: None)
        assert disk.flushed == [f"{path}-wal"]

        disk.flushed.clear()

        def restart() -> None:
            other.execute("PRAGMA wal_checkpoint(PASSIVE)")
            other.execute("INSERT INTO t VALUES (2)")  # the first write after a full checkpoint restarts the WAL

        commit_then(restart)
        assert disk.flushed == [f"{path}-wal", path]
    finally:
        writer.close()
        other.close()
        release_database_file(path)


def test_without_a_wal_file_there_is_nothing_to_flush_afterwards(tmp_path: Path) -> None:
    database = tmp_path / "none.db"
    database.touch()
    database_fd = share_database_file(str(database))
    assert database_fd is not None
    try:
        assert WalFlush.open(str(database), database_fd) is None  # the store then commits at FULL
    finally:
        release_database_file(str(database))


def _another_process_opens_and_closes(path: Path) -> int:
    """A short-lived process (a CLI, say) reads the database and closes its connection: if it believes
    it is the last one on the file, SQLite checkpoints and deletes the WAL as it closes."""
    read = (f"import sqlite3; c = sqlite3.connect({str(path)!r}); "
            "print(c.execute('SELECT COUNT(*) FROM decisions').fetchone()[0]); c.close()")
    return int(subprocess.run([sys.executable, "-c", read], check=True, capture_output=True, text=True).stdout)


async def _decide(db, count: int) -> None:  # type: ignore[no-untyped-def]
    for n in range(count):
        async with db.transaction(durable=True) as tx:
            await tx.execute("INSERT INTO decisions (what) VALUES (?)", (f"claim {n}",))


async def test_a_store_that_flushed_its_database_file_still_holds_its_locks_on_it(tmp_path: Path, disk: _Disk) -> None:
    """Past a checkpoint the WAL restarts, and a durable commit flushes the database file too. Flushing it must
    not drop this process's locks on the file (closing any descriptor of it would): otherwise the next process
    to close its connection takes the store's connections for gone and deletes the WAL they write to."""
    path = tmp_path / "durable.db"
    db = await _store(tmp_path)
    try:
        await _decide(db, CHECKPOINT_EVERY + 50)
        assert str(path) in disk.flushed  # the WAL did restart, and the database file was flushed
        assert _another_process_opens_and_closes(path) == CHECKPOINT_EVERY + 50
        assert Path(f"{path}-wal").exists()  # it saw the store's connections, and left the WAL alone
        await _decide(db, 1)
    finally:
        await db.close()
    assert _another_process_opens_and_closes(path) == CHECKPOINT_EVERY + 51
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_the_database_file_stays_open_until_the_last_store_of_the_process_on_it_closes(
    tmp_path: Path, disk: _Disk,
) -> None:
    path = tmp_path / "durable.db"
    first = await _store(tmp_path)
    second = await open_database(f"sqlite:///{path}", migrate=False)
    try:
        await _decide(first, CHECKPOINT_EVERY + 50)
        assert str(path) in disk.flushed
        await first.close()
        await _decide(second, 1)
        _another_process_opens_and_closes(path)
        assert Path(f"{path}-wal").exists()  # the second store's connections still hold their locks
    finally:
        await first.close()
        await second.close()


@pytest.mark.slow
def test_stores_of_several_processes_on_one_file_lose_nothing_while_readers_come_and_go() -> None:
    """The soak script, briefly: two processes' stores commit durably past several WAL restarts while a
    third opens and closes plain connections; every commit they were told of is in the file after."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "soak_shared_sqlite.py"
    run = subprocess.run([sys.executable, str(script), "--writers", "2", "--seconds", "4", "--json"],
                         capture_output=True, text=True, timeout=120)
    report = json.loads(run.stdout)
    assert report["committed"] > 2 * CHECKPOINT_EVERY  # the WAL restarted under them, more than once
    assert (report["integrity"], report["missing"], report["extra"]) == ("ok", 0, 0)
    assert (report["writer_errors"], report["reader_errors"], run.returncode) == (0, 0, 0)
