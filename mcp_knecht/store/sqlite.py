"""SQLite backend (the embedded default): WAL; a reader, a writer and a lookup connection.

Reads go through aiosqlite's thread, since one may take long; a `lookup` (a read by key of a few
rows) runs on the event loop's own thread, where it costs microseconds. The writer is used from the
event loop's thread too: a write transaction's statements are microseconds each, while a hop to a
driver thread and back costs about 80 µs of CPU (a decision makes twenty statements). What can block
for long runs in a worker thread: a durable commit's flush to disk (an fsync, made after the write
lock is let go: `store.wal_sync`), large batches, and checkpoints. The
writer's automatic checkpoint is off — it would run inside some COMMIT, on the event loop, and
fsync there — and every few hundred commits (or thousand rows) the writer checkpoints in a worker
thread instead, before it lets the next of our writers in. One transaction at a time, so the writer
is never used by two threads at once.

Writes take the lock up front with `BEGIN IMMEDIATE`, so two processes (say, two operators'
CLIs) never deadlock on a read-to-write upgrade; they wait up to the busy timeout instead.

Our own processes queue for that lock on an advisory file lock first (`<db>-writers`, `flock`): a
waiting writer sleeps in the kernel and is woken the moment the holder is done, instead of polling
the database (eight racing approvers polling would burn both cores the holder needs). The kernel
drops the lock of a process that dies, even by `kill -9`. `BEGIN IMMEDIATE` still decides: a
writer outside mcp-knecht (the sqlite3 shell) is waited for by polling, as before.

A database file this backend creates is private to its user (mode 0600, in a folder it creates
with mode 0700): it holds secret values, proposals and the audit log. SQLite gives its `-wal`
and `-shm` files the mode of the database file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import anyio.lowlevel

from mcp_knecht.core.database import Params, Row
from mcp_knecht.core.database_url import normalise, sqlite_path
from mcp_knecht.errors import StoreBusyError
from mcp_knecht.store.health import store_error
from mcp_knecht.store.kernel_wait import SLICE, wait_in_kernel
from mcp_knecht.store.turns import release_turns, shared_turns
from mcp_knecht.store.wal_sync import WalFlush, release_database_file, share_database_file

try:
    import fcntl
except ImportError:  # not on Windows: SQLite alone orders the writers there, by polling
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 15_000
"""How long a write waits for another process's write lock before the caller hears "store busy"."""
_LOCK_POLL_FIRST, _LOCK_POLL_MAX = 0.0002, 0.004


def _create_private(path: Path) -> None:
    """Create an empty database file only its owner may read (SQLite fills an empty file)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):  # another process made it first
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _busy(exc: sqlite3.OperationalError) -> bool:
    """SQLite's "busy" or "locked", whichever extended code (`SQLITE_BUSY_RECOVERY`, …) it came with."""
    # Not every OperationalError comes from SQLite: one the module raises itself (text that is no UTF-8, written
    # around the store) has no code, and must become a StoreError like the rest, not an AttributeError.
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _undecodable(exc: sqlite3.Error) -> bool:
    """Text that is no UTF-8 in a TEXT column, which the Python module refuses to read (SQLite keeps whatever
    bytes it is given: `CAST(x'ff41' AS TEXT)` from the sqlite3 shell)."""
    return (isinstance(exc, sqlite3.OperationalError) and not hasattr(exc, "sqlite_errorcode")
            and str(exc).startswith("Could not decode to UTF-8"))


def _lenient_text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _let_go(exc: BaseException) -> None:
    """Free the cursor of a read that failed on aiosqlite's thread. A read that fails while it hands out
    its rows (text that is no UTF-8) leaves its statement open, and with it the connection's read
    transaction: until the garbage collector found the failed cursor (held by the traceback's frames,
    in a cycle), every later read on that connection saw the database as it was then."""
    traceback.clear_frames(exc.__traceback__)


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


async def _connect(path: str, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> aiosqlite.Connection:
    try:
        conn = await aiosqlite.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise store_error("sqlite", f"Cannot open SQLite database {path}: {exc}") from exc
    conn.row_factory = _dict_row  # type: ignore[assignment]  # aiosqlite types it as a class
    await conn.execute_fetchall(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    await conn.execute_fetchall("PRAGMA foreign_keys = ON")
    # NORMAL under WAL: a commit survives a crash of the process; a power loss may lose the last
    # commits but never corrupts. A `durable` transaction (proposals, decisions) flushes the WAL
    # itself after its COMMIT, before it returns (`store.wal_sync`).
    await conn.execute_fetchall("PRAGMA synchronous = NORMAL")
    return conn


class _Reader:
    """Reads on aiosqlite's thread (one may take long). Driver errors become `StoreError` here, where
    they enter, as on every backend.

    A read that meets text that is no UTF-8 (written around the store) is made again on a private
    connection that decodes it with replacement characters (U+FFFD), so one such row fails no read but
    its own seal check. Only that read pays: decoding every text value so would cost about 0.3 µs a
    value on every read (measured: a page of 50 rows of 20 text columns, 300 → 610 µs). The connections
    on the event loop's thread decode so from then on (`SQLiteDatabase._decode_leniently`)."""

    def __init__(self, conn: aiosqlite.Connection, path: str, met_undecodable: Callable[[str], None]) -> None:
        self._conn = conn
        self._path = path
        self._met_undecodable = met_undecodable

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))  # type: ignore[arg-type]
        except sqlite3.Error as exc:
            _let_go(exc)
            if _undecodable(exc):  # again, `query_only`: a statement that writes (none comes here) can't run twice
                return await self.fetch_leniently(sql, params)
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def fetch_leniently(self, sql: str, params: Params = ()) -> list[Row]:
        self._met_undecodable(sql)
        try:
            return await anyio.to_thread.run_sync(self._read_leniently, sql, params)
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    def _read_leniently(self, sql: str, params: Params) -> list[Row]:
        conn = sqlite3.connect(self._path, isolation_level=None)
        try:
            conn.row_factory = _dict_row
            conn.text_factory = _lenient_text
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        return next(iter(await self.fetch_all(sql, params)), None)


class _Lookups:
    """Reads by key on the event loop's thread (see `Database.lookup`). SQLite answers a WAL read
    without waiting, except in rare moments (a WAL being recovered): then it says busy at once
    (busy timeout 0: never a sleep on the event loop) and the read goes to the reader thread."""

    def __init__(self, conn: sqlite3.Connection, fallback: _Reader) -> None:
        self._conn = conn
        self._fallback = fallback

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                return await self._fallback.fetch_all(sql, params)
            if _undecodable(exc):  # a SELECT: `query_only`, or the idle writer's (`Database.lookup`)
                return await self._fallback.fetch_leniently(sql, params)
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc


def _open_lookups(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = _dict_row
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute("PRAGMA query_only = ON")
    return conn


CHECKPOINT_EVERY = 256
"""Commits between two checkpoints of the WAL, at most (a decision's commit adds a few pages)."""
CHECKPOINT_ROWS = 2_000
"""Rows written between two checkpoints, at most: a group commit of audit rows adds many pages in one
commit. (SQLite's own automatic checkpoint comes every 1,000 pages; 2,000 audit rows fill about as
many.)"""


_INLINE_BATCH = 8
"""An `execute_many` of more rows than this runs in a worker thread (the audit log's group commits:
milliseconds, which the event loop would otherwise wait through)."""


class _WriterTransaction:
    """The write transaction's statements, run inline on the writer connection."""

    def __init__(self, conn: sqlite3.Connection, met_undecodable: Callable[[str], None]) -> None:
        self._conn = conn
        self._met_undecodable = met_undecodable

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            if _undecodable(exc):  # a write's RETURNING has written already: it cannot be read again here
                self._met_undecodable(sql)
                raise store_error("sqlite", f"Database statement failed: {exc} (text that is no UTF-8, written "
                                            "around the store; it reads with replacement characters from now "
                                            "on: try again)") from exc
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        return next(iter(await self.fetch_all(sql, params)), None)

    async def execute(self, sql: str, params: Params = ()) -> int:
        try:
            return self._conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def execute_many(self, sql: str, rows: Sequence[Params]) -> None:
        try:
            if len(rows) > _INLINE_BATCH:
                await anyio.to_thread.run_sync(self._conn.executemany, sql, rows)
            else:
                self._conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Database statement failed: {exc}") from exc

    async def fetch_all_with(self, writes: Sequence[tuple[str, Params]], sql: str, params: Params = ()) -> list[Row]:
        """One after another: a statement here costs no round trip."""
        for write, write_params in writes:
            await self.execute(write, write_params)
        return await self.fetch_all(sql, params)

    async def execute_with_next(self, sql: str, params: Params = ()) -> None:
        """At once: a statement here costs no round trip."""
        await self.execute(sql, params)

    async def lock(self, name: str) -> None:
        """`BEGIN IMMEDIATE` already holds the database's single write lock."""

    async def lock_and_fetch_one(self, name: str, sql: str, params: Params = ()) -> Row | None:
        """The read alone: under the write lock it sees everything committed."""
        return await self.fetch_one(sql, params)


def _open_writer(path: str) -> sqlite3.Connection:
    """Runs in a worker thread: setting up may wait for another process (one opening the same file at
    the same moment rebuilds the WAL index, or a writer outside mcp-knecht holds an exclusive lock)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.row_factory = _dict_row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")  # see `_connect`
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # `_checkpoint` does it, off the event loop
        conn.execute("PRAGMA analysis_limit = 1000")  # `_checkpoint`'s statistics: a sample, milliseconds
        conn.execute("PRAGMA busy_timeout = 0")  # from now on `_begin` waits for the write lock itself
    except BaseException:
        conn.close()
        raise
    return conn


class _WriterQueue:
    """An exclusive `flock` on `<db>-writers`, taken before `BEGIN IMMEDIATE` and given back after
    the commit. Waiting happens in a worker thread blocked in the kernel; a waiter that gives up
    (timeout, cancellation) leaves the thread to drop the lock the moment it gets it."""

    def __init__(self, path: Path) -> None:
        if fcntl is None:
            raise OSError("no flock on this platform")
        self._fd = os.open(f"{path}-writers", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    async def acquire(self, timeout: float) -> bool:
        """True once held; False when `timeout` passed first (the caller then polls SQLite as before)."""
        if self._try():
            return True
        guard, state = threading.Lock(), {"held": False, "abandoned": False}

        def wait() -> None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            with guard:
                if state["abandoned"]:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                else:
                    state["held"] = True

        try:
            with anyio.move_on_after(timeout):
                await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except BaseException:
            with guard:
                state["abandoned"] = True
                if state["held"]:
                    self.release()
            raise
        with guard:
            state["abandoned"] = True
            return state["held"]

    def _try(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def acquire_here(self, timeout: float) -> bool:
        """`acquire` without a worker thread, for a process with nothing else to run meanwhile: sleeps
        in the kernel, which wakes it the moment the lock is free (`kernel_wait`), blocking its caller's
        thread; where that cannot be done, looks again after a pause that grows from 50 µs to 2 ms."""
        if self._try():
            return True
        waited = wait_in_kernel(lambda: fcntl.flock(self._fd, fcntl.LOCK_EX), self._try, timeout)
        if waited is not None:
            return waited
        pause, deadline = 0.00005, time.monotonic() + timeout
        while True:
            if self._try():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.002)

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


class SQLiteDatabase:
    dialect = "sqlite"

    def __init__(self, url: str, reader: aiosqlite.Connection, writer: sqlite3.Connection,
                 lookups: sqlite3.Connection, writers: _WriterQueue | None = None, *, blocking: bool = False,
                 database_fd: int | None = None) -> None:
        self.url = url
        self._blocking = blocking
        self._reader = _Reader(reader, sqlite_path(url).as_posix(), self._decode_leniently)
        self._reader_conn = reader
        self._lookups = _Lookups(lookups, self._reader)
        self._lookups_conn = lookups
        self._warm_lookups = _Lookups(writer, self._reader)
        self._writer = writer
        # A blocking store's process does one thing at a time: taking the lock need not yield to other tasks
        # (anyio's default makes every uncontended acquire a turn of the event loop: an epoll call).
        self._write_lock = anyio.Lock(fast_acquire=blocking)
        self._writers = writers
        self._commits = 0
        self._rows_at_checkpoint = 0
        self._path = sqlite_path(url)
        self._turns = shared_turns(self._path)
        self._database_fd = database_fd  # from `share_database_file`: released in `close`, never closed here
        self._closed = False

    def _decode_leniently(self, sql: str) -> None:
        """Text that is no UTF-8 was met: from now on the connections used on the event loop's thread (the
        writer's, and the lookups') decode every text value, with replacement characters. That costs about
        0.3 µs a text value, so it starts only once such text is known to be in the store; the reader's
        thread reads each read that meets it again instead (`_Reader`)."""
        if self._writer.text_factory is _lenient_text:
            return
        logger.warning("%s holds text that is no UTF-8 (written around the store; met by %s); it reads with "
                       "replacement characters from now on", self.url, " ".join(sql.split())[:120])
        self._writer.text_factory = _lenient_text
        self._lookups_conn.text_factory = _lenient_text

    @classmethod
    async def open(cls, url: str, *, blocking: bool = False) -> SQLiteDatabase:
        """`blocking`: waits for the store — another process's write lock, the disk's flush of a durable
        commit, a checkpoint — block the caller's thread instead of going to a worker thread. Only for a
        process that does one thing at a time (a CLI deciding a proposal): its event loop has nothing
        else to run meanwhile, and a hop to a worker thread and back is most of what a wait costs."""
        url = normalise(url)
        path = sqlite_path(url)
        try:
            _create_private(path)
        except OSError as exc:
            raise store_error("sqlite", f"Cannot create the database {path}: {exc.strerror}") from exc
        try:
            writer = await anyio.to_thread.run_sync(_open_writer, str(path))
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise StoreBusyError(
                    f"The store {path} is busy: another process has held a lock on it for "
                    f"{BUSY_TIMEOUT_MS / 1000:g} s. Nothing was changed; retry in a moment.") from exc
            raise store_error("sqlite", f"{path} is not a usable SQLite database: {exc}") from exc
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"{path} is not a usable SQLite database: {exc}") from exc
        try:
            reader = await _connect(str(path))
        except BaseException:
            writer.close()
            raise
        try:
            lookups = await anyio.to_thread.run_sync(_open_lookups, str(path))
        except BaseException as exc:
            await reader.close()
            writer.close()
            if isinstance(exc, sqlite3.Error):
                raise store_error("sqlite", f"Cannot open SQLite database {path}: {exc}") from exc
            raise
        try:
            writers: _WriterQueue | None = _WriterQueue(path)
        except OSError:  # a read-only folder, or no flock: SQLite alone orders the writers, by polling
            writers = None
        return cls(url, reader, writer, lookups, writers, blocking=blocking,
                   database_fd=share_database_file(str(path)))

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        return await self._reader.fetch_all(sql, params)

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        return await self._reader.fetch_one(sql, params)

    async def lookup(self, sql: str, params: Params = ()) -> list[Row]:
        """On the writer's connection while it is idle: SQLite drops a connection's page cache whenever
        another connection has committed since its last read, and the writer's own commits are most of
        them — its cache holds exactly the pages a decision reads next."""
        if not self._write_lock.locked() and not self._writer.in_transaction and sql.lstrip()[:6].upper() == "SELECT":
            return await self._warm_lookups.fetch_all(sql, params)
        return await self._lookups.fetch_all(sql, params)

    async def stream(self, sql: str, params: Params = (), batch: int = 500) -> AsyncIterator[Row]:
        """Rows one batch at a time on a private connection, so a huge result never sits in memory."""
        conn = await _connect(sqlite_path(self.url).as_posix())
        streamed = 0
        try:
            # A read that meets text that is no UTF-8 (see `_Reader`) is made again, decoded with replacement
            # characters, from the first row not given yet (a stream's SQL orders its rows fully).
            for lenient in (False, True):
                conn.text_factory = _lenient_text if lenient else str
                given_before = streamed
                try:
                    cursor = await conn.execute(sql, params)
                    while rows := await cursor.fetchmany(batch):
                        for row in rows:
                            if given_before:
                                given_before -= 1
                                continue
                            yield row  # type: ignore[misc]
                            streamed += 1
                    return
                except sqlite3.Error as exc:
                    _let_go(exc)
                    if lenient or not _undecodable(exc):
                        raise store_error("sqlite", f"Database statement failed: {exc}") from exc
        finally:
            await conn.close()

    @property
    def turn_spans_processes(self) -> bool:
        return self._turns.spans_processes

    def turn(self, name: str, *, moved: Callable[[], Awaitable[bool]]) -> AbstractAsyncContextManager[bool]:
        """Across our processes too: a record lock on one byte of `<db>-turns` per name (a blocking
        store waits for one in the kernel)."""
        return self._turns.turn(name, moved=moved, blocking=self._blocking)

    @asynccontextmanager
    async def transaction(self, *, durable: bool = False) -> AsyncIterator[_WriterTransaction]:
        """`durable`: the commit is flushed to disk before this returns, after the write lock is let go
        (`store.wal_sync`), so other writers need not wait for the disk."""
        wal = WalFlush.open(str(self._path), self._database_fd) if durable and self._database_fd is not None else None
        at_full = durable and wal is None  # no WAL file to flush afterwards: SQLite flushes in COMMIT
        try:
            async with self._write_lock:
                if at_full:
                    self._writer.execute("PRAGMA synchronous = FULL")
                try:
                    async with self._in_transaction(at_full, before_commit=wal):
                        yield _WriterTransaction(self._writer, self._decode_leniently)
                finally:
                    if at_full:
                        self._writer.execute("PRAGMA synchronous = NORMAL")
            if wal is not None:
                await self._flush(wal)
        finally:
            if wal is not None:
                wal.close()

    async def _flush(self, wal: WalFlush) -> None:
        try:
            if self._blocking:
                wal.sync()
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(wal.sync)
        except OSError as exc:
            raise store_error("sqlite", f"Commit failed: the disk did not confirm the write ({exc}). It may or may "
                                        "not have been kept; check before retrying.") from exc

    async def _begin(self) -> bool:
        """`BEGIN IMMEDIATE`, after queueing behind our other processes (see the module); True when
        the writer queue is held (to be released after the commit). A lock held outside the queue is
        waited for by polling every fraction of a millisecond (growing to 4 ms), up to
        `BUSY_TIMEOUT_MS` in all. SQLite's own busy handler sleeps in steps up to 100 ms, which
        leaves the lock idle while racing writers sleep."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        if self._writers is None:
            queued = False
        elif self._blocking:
            queued = await self._queue_here(deadline)
        else:
            queued = await self._writers.acquire(BUSY_TIMEOUT_MS / 1000)
        try:
            await self._begin_immediate(deadline)
        except BaseException:
            if queued:
                self._writers.release()  # type: ignore[union-attr]
            raise
        return queued

    async def _queue_here(self, deadline: float) -> bool:
        """The writer queue of a blocking store, waited for in slices (`kernel_wait.SLICE`): between two,
        a cancellation (Ctrl-C) gets through."""
        assert self._writers is not None
        while not self._writers.acquire_here(min(deadline - time.monotonic(), SLICE)):
            if time.monotonic() >= deadline:
                return False
            await anyio.lowlevel.checkpoint()
        return True

    async def _begin_immediate(self, deadline: float) -> None:
        pause = _LOCK_POLL_FIRST
        while True:
            try:
                self._writer.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreBusyError(
                        f"The store is busy: another process has held its write lock for {BUSY_TIMEOUT_MS / 1000:g} s."
                        " Nothing was changed; retry in a moment.") from exc
            await anyio.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 1.5, _LOCK_POLL_MAX)

    @asynccontextmanager
    async def _in_transaction(self, at_full: bool, *, before_commit: WalFlush | None = None) -> AsyncIterator[None]:
        """`at_full`: SQLite flushes this COMMIT itself. `before_commit`: where the WAL stands is noted just
        before COMMIT, for the flush after the lock (`transaction`)."""
        try:
            queued = await self._begin()
        except StoreBusyError:
            raise
        except sqlite3.Error as exc:
            raise store_error("sqlite", f"Cannot start a write transaction: {exc}") from exc
        except BaseException:
            # Cancelled while waiting (a client went away while another process held the lock): make
            # sure the connection is not left inside a transaction, or every later write fails.
            with contextlib.suppress(sqlite3.Error):
                self._writer.execute("ROLLBACK")
            raise
        try:
            try:
                yield
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            try:
                if before_commit is not None:
                    before_commit.note()
                if at_full and not self._blocking:  # it waits for the disk (fsync): off the event loop
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._writer.execute, "COMMIT")
                else:  # writes the WAL into the page cache: microseconds (no checkpoint: see the module)
                    self._writer.execute("COMMIT")
            except (sqlite3.Error, OSError) as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._writer.execute("ROLLBACK")
                raise store_error("sqlite", f"Commit failed: {exc}") from exc
            self._commits += 1
            rows = self._writer.total_changes
            if self._commits >= CHECKPOINT_EVERY or rows - self._rows_at_checkpoint >= CHECKPOINT_ROWS:
                self._commits, self._rows_at_checkpoint = 0, rows
                if self._blocking:
                    self._checkpoint()
                else:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._checkpoint)
        finally:
            if queued:
                self._writers.release()  # type: ignore[union-attr]

    def _checkpoint(self) -> None:
        """Copy the WAL into the database file before the next of our writers may begin: nothing is
        appended meanwhile, so the checkpoint can finish and the next writer starts the WAL from its
        beginning again (a checkpoint racing the writers would never catch up, and the WAL would
        grow for as long as writes go on)."""
        try:
            self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # the next one tries again; the WAL only grows meanwhile
            logger.warning("SQLite checkpoint of %s failed: %s", self.url, exc)
        # SQLite's advice for a connection that lives long: refresh the planner's statistics where they went
        # stale (a table this connection read has grown 25-fold since). Taken at a start with a hundred
        # proposals, they would otherwise steer every query of a grown store until its next close.
        with contextlib.suppress(sqlite3.Error):  # an optimisation: the next checkpoint tries again
            self._writer.execute("PRAGMA optimize")

    async def close(self) -> None:
        if self._closed:  # a second close must not close descriptors that may be reused by now
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            # SQLite's advice: refresh planner statistics where they went stale, cheaply (`analysis_limit`).
            # They are an optimisation: never fail a shutdown over them.
            with contextlib.suppress(sqlite3.Error):
                await anyio.to_thread.run_sync(self._writer.execute, "PRAGMA optimize")
            await self._reader_conn.close()
            self._lookups_conn.close()
            self._writer.close()
            if self._writers is not None:
                self._writers.close()
            release_turns(self._path)
            if self._database_fd is not None:  # after every connection above: see `store.wal_sync`
                release_database_file(str(self._path))
